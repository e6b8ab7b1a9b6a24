"""The submitting side of a benchmark: check the config, make the run folder, launch.

The same machinery as a training run (`ddp_lab.submit`): `make_run_dir`, `write_config`,
the launcher registry's `render` and `start`; only the entry each rank runs differs
(`run.entry`), and the folder is labelled `<date>_<time>_bench_<launcher>`.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from omegaconf import DictConfig, open_dict

from .. import launch
from ..metrics import write_json
from ..submit import UserError, check_all, common_checks, make_run, render_and_start
from .config import DTYPES, GROUPS, IMPLS, OPS


def validate(cfg: DictConfig) -> None:
    b = cfg.bench
    OPS.check(b.ops)
    IMPLS.check(b.impl)
    GROUPS.check(b.groups)
    DTYPES.check([b.dtype])
    for impl in b.impl:
        if not set(IMPLS[impl]) & set(b.ops):
            raise UserError(f"bench.impl={impl}: none of bench.ops={list(b.ops)} has it "
                            f"({impl} exists for {', '.join(IMPLS[impl])})")
    world = cfg.launcher.nodes * cfg.launcher.nproc_per_node
    check_all([
        (b.min_elements >= 1, f"bench.min_elements={b.min_elements}: must be >= 1"),
        (b.max_elements >= b.min_elements,
         f"bench.max_elements={b.max_elements} is below bench.min_elements={b.min_elements}"),
        (b.points >= 1, f"bench.points={b.points}: must be >= 1"),
        (b.warmup >= 0, f"bench.warmup={b.warmup}: must be >= 0"),
        (1 <= b.min_iters <= b.iters,
         f"bench.min_iters={b.min_iters}, bench.iters={b.iters}: need 1 <= min_iters <= iters"),
        (b.time_per_size_s > 0, f"bench.time_per_size_s={b.time_per_size_s}: must be > 0"),
        (0 < b.memory_fraction <= 1, f"bench.memory_fraction={b.memory_fraction}: must be in (0, 1]"),
        (b.node_size >= 0, f"bench.node_size={b.node_size}: must be >= 0 (0 = real nodes)"),
        (b.plot_metric in ("busbw", "algbw"), f"bench.plot_metric={b.plot_metric}: busbw or algbw"),
        *common_checks(cfg),
        (not ({"all_gather", "reduce_scatter"} & set(b.ops)) or b.min_elements >= world,
         f"bench.min_elements={b.min_elements} is below the world size {world}: all_gather and "
         "reduce_scatter need at least one element per rank"),
    ])


def resolve(cfg: DictConfig) -> DictConfig:
    cfg = cfg.copy()
    with open_dict(cfg):
        try:
            launch.resolve(cfg)  # the launcher's own defaults and checks, as for training
        except launch.LaunchError as e:
            raise UserError(str(e)) from None
        if cfg.launcher.nproc_per_node is None:
            cfg.launcher.nproc_per_node = launch.default_nproc()
    validate(cfg)
    return cfg


def submit_bench(cfg: DictConfig, argv: list[str] | None = None) -> int:
    cfg = resolve(cfg)
    run_dir = make_run(cfg, label=f"bench_{cfg.launcher.name}")
    argv = sys.argv[1:] if argv is None else argv
    (run_dir / "command.txt").write_text(
        "python -m ddp_lab.bench " + " ".join(shlex.quote(a) for a in argv) + "\n")
    rc = render_and_start(cfg, run_dir)
    if rc is None:
        return 0
    summary_path = run_dir / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    if rc != 0:
        if not summary or summary.get("status", "").startswith("completed"):
            summary = {**summary, "kind": "bench", "launcher": cfg.launcher.name,
                       "status": f"failed: job exit status {rc} (see {run_dir / 'logs'})"}
            write_json(summary_path, summary)
        print(f"benchmark failed ({summary['status']}): logs in {run_dir / 'logs'}")
    elif not summary:  # submitted without following (launcher.wait=false): still running
        print(f"no results yet: bench.md, bench.csv and plots/ appear in {run_dir} when the "
              "job ends")
    else:
        if summary.get("measurements"):
            print(_peak_table(run_dir))
        else:
            doc = json.loads((run_dir / "bench.json").read_text())
            print("nothing was measured:\n" + "\n".join(f"  {n}" for n in doc.get("notes", [])))
        print(f"{summary.get('measurements', 0)} measurements, "
              f"{summary.get('wrong_results', 0)} wrong; tables: {run_dir / 'bench.md'}; "
              f"plots: {', '.join(str(run_dir / p) for p in summary.get('plots', []))}")
        if summary.get("wrong_results"):
            rc = 1  # a wrong result is a failure of the implementation under test
    print(f"run dir: {run_dir}")
    return rc


def _peak_table(run_dir: Path) -> str:
    md = (run_dir / "bench.md").read_text().splitlines() if (run_dir / "bench.md").exists() else []
    try:
        start = md.index("## Peak bus bandwidth")
    except ValueError:
        return ""
    out = []
    for line in md[start + 2:]:
        if not line.startswith("|"):
            break
        out.append(line)
    return "\n".join(out)
