"""`python -m ddp_lab.report PATH [PATH ...]`: compare run folders across allocations."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .build import build_report
from .runs import ReportError, find_runs


def default_out(paths: list[str]) -> Path:
    """report/ beside the runs it reads, never in the current folder unasked."""
    return Path(os.path.commonpath([Path(p).expanduser().resolve() for p in paths])) / "report"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m ddp_lab.report",
        description="Compare ddp_lab run folders: time per epoch, speedup, efficiency and comm "
                    "share per sync across allocations; bench runs give the alpha-beta model.")
    ap.add_argument("paths", nargs="+", metavar="PATH",
                    help="run folders, or folders holding them (searched recursively)")
    ap.add_argument("-o", "--out", default=None,
                    help="where report.md, report.csv, report.json and the PNGs go (default: "
                         "report/ inside the folder read, or inside the PATHs' common parent; "
                         "a later report skips it)")
    ap.add_argument("--no-plots", action="store_true", help="tables only")
    args = ap.parse_args(argv)
    out = Path(args.out).expanduser().resolve() if args.out else default_out(args.paths)
    try:
        runs = find_runs(args.paths, exclude=out)
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = build_report(runs, out, make_plots=not args.no_plots, inputs=args.paths)
    print(result["markdown"])
    c = result["counts"]
    print(f"{c['train']} training run(s), {c['bench']} bench run(s), {c['skipped']} skipped; "
          f"report: {out / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
