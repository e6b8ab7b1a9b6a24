"""Which NVTX ranges a profiled rank pushes: python scripts/nvtx_ranges.py RUN_DIR

Runs one rank of RUN_DIR (a folder `python -m ddp_lab launcher.dry_run=true
launcher.nproc_per_node=1 timing.profile=true ...` rendered) in this process with
torch.cuda.nvtx.range_push counted, and prints each range's name and count: the ranges
nsys or Nsight Systems would show, on a machine without them (CUDA only: NVTX is a no-op
without a driver).
"""

import collections
import os
import sys
from pathlib import Path

import torch.cuda.nvtx as nvtx

counts: collections.Counter = collections.Counter()
depths: list[int] = []
push = nvtx.range_push


def counted(msg: str) -> int:
    counts[msg] += 1
    depth = push(msg)
    depths.append(depth)
    return depth


nvtx.range_push = counted
os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", GROUP_RANK="0",
                  MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ.get("MASTER_PORT", "29631"))
from ddp_lab.world import cpu  # noqa: E402

cpu.prepare_rank()
from ddp_lab.worker import run  # noqa: E402  (not main(): it leaves with os._exit)

print(f"rank exit {run(Path(sys.argv[1]).resolve())}")
print(f"NVTX ranges pushed: {sum(counts.values())} in {len(counts)} names; depths "
      f"{min(depths) if depths else '-'}..{max(depths) if depths else '-'} (-1 would be an error)")
for name, n in counts.most_common(12):
    print(f"  {n:>6}  {name}")
