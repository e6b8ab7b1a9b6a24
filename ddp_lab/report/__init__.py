"""Compare run folders: `python -m ddp_lab.report PATH [PATH ...] [-o
OUT]` (docs/report.md).

    python -m ddp_lab.report outputs/                 # every run under outputs/, recursively

Training runs by time per epoch across allocations, phase times and
comm; bench runs give the alpha-beta fit the training runs' comm is set
against; failed runs listed with why.
"""
