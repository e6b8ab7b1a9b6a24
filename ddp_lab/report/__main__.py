"""`python -m ddp_lab.report PATH [PATH ...]`: compare run folders
across allocations."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from .build import build_report
from .run import ReportError, find_runs


def default_out(paths: list[str]) -> Path:
    """report/ beside the runs it reads, never the current folder unasked."""
    return Path(os.path.commonpath([Path(p).expanduser().resolve() for p in paths])) / "report"


def parse_worlds(text: str) -> list[int]:
    """"8,16,...,1024" -> [8, 16, 32, ..., 1024]: "..." doubles up to the next number."""
    out: list[int] = []
    items = [t.strip() for t in text.split(",") if t.strip()]
    for i, t in enumerate(items):
        if t == "...":
            if not out or i + 1 >= len(items):
                raise ValueError("'...' needs a world before and after it")
            stop = int(items[i + 1])
            while out[-1] * 2 < stop:
                out.append(out[-1] * 2)
            continue
        if not t.isdigit() or int(t) < 1:
            raise ValueError(f"{t!r} is not a world size (a positive integer)")
        out.append(int(t))
    if not out:
        raise ValueError("give world sizes, e.g. 8,16,...,1024")
    return sorted(set(out))


class _Parser(argparse.ArgumentParser):
    # one line, exit 2 (argparse prints the usage block first)
    def error(self, message: str):
        print(f"error: {message} (usage: {USAGE})", file=sys.stderr)
        sys.exit(2)


USAGE = "python -m ddp_lab.report PATH [PATH ...] [-o OUT] [--no-plots] [--warmup N] " \
        "[--forecast W1,W2,...] [--gpus-per-node G]"


def main(argv: list[str] | None = None) -> int:
    ap = _Parser(
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
    ap.add_argument("--warmup", type=int, default=None, metavar="N",
                    help="epochs left out of every run's time per epoch as warm-up (default: "
                         "1 for a run with more than 1 epoch, else 0)")
    ap.add_argument("--forecast", default=None, metavar="W1,W2,...",
                    help="worlds to forecast time per epoch for (default 8,16,...,1024: '...' "
                         "doubles up to the last one)")
    ap.add_argument("--gpus-per-node", type=int, default=8, metavar="G",
                    help="ranks per node of the forecast's worlds: the intra-node fit up to G "
                         "ranks, the cross-node fit above (default 8; a measured point is "
                         "priced on the nodes it ran on)")
    args = ap.parse_args(argv)
    out = Path(args.out).expanduser().resolve() if args.out else default_out(args.paths)
    try:
        try:
            worlds = parse_worlds(args.forecast) if args.forecast else None
        except ValueError as e:
            raise ReportError(f"--forecast {args.forecast}: {e}") from None
        if args.gpus_per_node < 1:
            raise ReportError(f"--gpus-per-node {args.gpus_per_node}: give 1 or more")
        if args.warmup is not None and args.warmup < 0:
            raise ReportError(f"--warmup {args.warmup}: give 0 or more epochs")
        runs = find_runs(args.paths, exclude=out)
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    result = build_report(runs, out, make_plots=not args.no_plots, inputs=args.paths,
                          warmup=args.warmup, forecast_worlds=worlds,
                          gpus_per_node=args.gpus_per_node)
    # the screen that matters; report.md has everything
    print(result["summary"], end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
