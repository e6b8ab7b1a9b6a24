"""Compare run folders: `python -m ddp_lab.report PATH [PATH ...] [-o OUT]`.

    python -m ddp_lab.report outputs/                 # every run under outputs/, recursively
    python -m ddp_lab.report outputs/run_a outputs/run_b -o report_ab

Training runs are compared by time per epoch across allocations (speedup and parallel
efficiency against the smallest allocation of the same sync), phase times and comm
share; bench runs (`python -m ddp_lab.bench`) give the alpha-beta fit the training
runs' comm is set against. Runs that failed or never finished are listed with the reason.
Writes report.md, report.csv, report.json and PNGs into OUT (default ./report).
"""

from .build import build_report

__all__ = ["build_report"]
