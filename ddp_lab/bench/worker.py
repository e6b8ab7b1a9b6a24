"""The entry every rank of a benchmark runs: `python -m ddp_lab.bench.worker RUN_DIR`.

It reads the run folder's resolved config.yaml, joins the process group, runs the sweep, and rank 0
writes the results. A failure is written to summary.json with its reason.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from ddp_lab.world import fingerprint as fingerprints
from ddp_lab.folder.files import write_json
from ddp_lab.rank.main import rank_main, run_rank

# Every import that loads torch (this package's config, ops, harness, output) is inside a function:
# torch must load after rank_main set OMP_WAIT_POLICY (see rank.run_rank).


def run(run_dir: Path) -> int:
    from ddp_lab.bench.config import load_bench_config

    cfg = load_bench_config(run_dir)
    return run_rank(run_dir, cfg, lambda ctx: _bench(cfg, ctx, run_dir),
                    failure={"kind": "bench", "launcher": cfg.launcher.name})


def _bench(cfg, ctx, run_dir: Path) -> None:
    import torch  # lazy: see above

    from ddp_lab.bench.harness import run_bench
    from ddp_lab.bench.output import write_outputs

    env = ctx.env
    log = logging.getLogger("ddp_lab")
    result = run_bench(cfg.bench, ctx, cfg.log.progress)
    if env.is_main:
        topo = result["topology"]
        command = run_dir / "command.txt"
        gpu = None if ctx.device.type == "cpu" else torch.cuda.get_device_name(ctx.device)
        meta = {
            "kind": "bench", "launcher": cfg.launcher.name, "backend": ctx.backend,
            "device": gpu or "cpu",
            "nodes": env.num_nodes, "nproc_per_node": env.local_world_size,
            "simulated_nodes": len(topo["nodes"]) if topo["simulated"] else None,
            "world_size": env.world_size, "hosts": list(dict.fromkeys(topo["hosts"])),
            # '8 ranks = 2 node(s) x 4 rank(s), nccl on NVIDIA H100', as tables and plots say it
            "allocation": f"{env.world_size} ranks = {topo['describe']}, {ctx.backend} on "
                          f"{gpu or 'CPU'}",
            "dtype": cfg.bench.dtype, "warmup": cfg.bench.warmup,
            "iters": cfg.bench.iters, "min_iters": cfg.bench.min_iters,
            "torch": torch.__version__,
            "command": command.read_text().strip() if command.exists() else "",
        }
        out = write_outputs(run_dir, result, meta, cfg.bench.plot_metric, cfg.bench.title)
        # the allocation, as a training run records it: the report matches a run with the bench of
        # its own allocation (its link's rate is in the id)
        fp = fingerprints.collect(ctx.backend, ctx.device, meta["hosts"], cfg.launcher.name,
                                  env.num_nodes, env.local_world_size)
        wrong = sum(not r["correct"] for r in result["rows"])
        write_json(run_dir / "summary.json", {
            **meta, "status": "completed" if not wrong else
            f"completed: {wrong} wrong result(s), see bench.md",
            "ops": list(cfg.bench.ops), "impl": list(cfg.bench.impl),
            "groups": list(cfg.bench.groups), "measurements": len(result["rows"]),
            "wrong_results": wrong, "duration_s": result["duration_s"],
            "plots": [f"plots/{p['file']}" for p in out["plots"]],
            "fingerprint": fp, "fingerprint_id": fingerprints.fingerprint_id(fp)})
        log.info("%d measurements (%d wrong) in %.0f s: bench.md, bench.csv, bench.json, "
                 "plots/ in %s", len(result["rows"]), wrong, result["duration_s"], run_dir)


def main(argv: list[str] | None = None) -> int:
    return rank_main(argv, "ddp_lab.bench.worker", "python -m ddp_lab.bench", run)


if __name__ == "__main__":
    sys.exit(main())
