"""The submitting side of a benchmark: check, launch, report.

The same machinery as a training run (`ddp_lab.validate`, `ddp_lab.job`); only the entry
each rank runs differs (`run.entry`), and the folder is labelled
`<date>_<time>_bench_<launcher>`.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from omegaconf import DictConfig

from ..job import collect, launch_job
from ..validate import resolve_bench


def submit_bench(cfg: DictConfig, argv: list[str] | None = None) -> int:
    cfg = resolve_bench(cfg)
    argv = sys.argv[1:] if argv is None else argv
    command = "python -m ddp_lab.bench " + " ".join(shlex.quote(a) for a in argv) + "\n"
    run_dir, rc = launch_job(cfg, label=f"bench_{cfg.launcher.name}",
                             files={"command.txt": command})
    if rc is None:
        return 0
    summary = collect(run_dir, rc, kind="bench", launcher=cfg.launcher.name)
    if rc != 0:
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
