"""Which NVTX ranges a profiled rank pushes: python scripts/nvtx_ranges.py RUN_DIR

Runs one rank of RUN_DIR (a folder `python -m ddp_lab launcher.dry_run=true
launcher.nproc_per_node=1 timing.profile=true ...` rendered) in this process with
torch.cuda.nvtx.range_push counted, and prints each range's name and count: the ranges
nsys or Nsight Systems would show, on a machine without them (CUDA only: NVTX is a no-op
without a driver).
"""

import collections
import sys

from profile_rank import rank_here  # beside this script

# the rank first: its CPU settings before torch loads (profile_rank.rank_here)
run, folder = rank_here(sys.argv[1])
import torch.cuda.nvtx as nvtx  # noqa: E402

counts: collections.Counter = collections.Counter()
depths: list[int] = []
push = nvtx.range_push


def counted(msg: str) -> int:
    counts[msg] += 1
    depth = push(msg)
    depths.append(depth)
    return depth


nvtx.range_push = counted
print(f"rank exit {run(folder)}")
print(f"NVTX ranges pushed: {sum(counts.values())} in {len(counts)} names; depths "
      f"{min(depths) if depths else '-'}..{max(depths) if depths else '-'} (-1 would be an error)")
for name, n in counts.most_common(12):
    print(f"  {n:>6}  {name}")
