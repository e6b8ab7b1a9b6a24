"""Your own collective, checked: `python -m ddp_lab.check FILE.py`, or from a notebook

    from ddp_lab.check import check
    check(broadcast_naive, reduce_naive)

Each function named like a collective runs on worlds of 1 to 7 real gloo ranks, forked from
this process, against torch.distributed's own collective on the same inputs (cases.py), and
gets a verdict: pass, wrong (the first failing case, which rank holds what), crash (the rank,
its exception and your line), hang (every rank's pending call and why none moves, diagnose.py)
or unsupported (it raised NotImplementedError). Beside it, the bytes the busiest rank sent and
its rounds, against what no algorithm can beat. docs/exercises.md walks a course's sheets
through it: check, fix, bench, train.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional, Sequence

__all__ = ["check", "CheckResults", "run_check"]


class CheckResults(list):
    """The verdicts of a check (FunctionResult each), shown as the command's table (a notebook
    shows it as HTML)."""

    run_dir: Optional[Path] = None

    def __str__(self) -> str:
        from .verdicts import text

        return text(self)

    __repr__ = __str__

    def _repr_html_(self) -> str:
        from .verdicts import html_table

        return html_table(self)

    @property
    def passed(self) -> bool:
        return all(r.verdict == "pass" for r in self)


def run_check(items: Sequence[tuple[Callable, object, list]], log_dir: Path,
              worlds: Sequence[int] = (1, 2, 3, 4, 5, 6, 7), timeout_s: float = 3.0,
              progress: Optional[Callable[[str], None]] = None) -> CheckResults:
    """Check each (function, StudentFunction, namespaces) in turn."""
    from .verdicts import check_function

    out = CheckResults()
    for fn, info, namespaces in items:
        if progress:
            progress(f"checking {info.name} ({info.collective}) on worlds "
                     f"{','.join(map(str, worlds))} ...")
        r = check_function(fn, info, namespaces, log_dir, worlds=tuple(worlds), base_s=timeout_s)
        if progress:
            progress(f"  {info.name}: {r.verdict} ({r.cases} cases, {r.seconds:.1f} s)")
        out.append(r)
    return out


def check(*functions: Callable, worlds: Sequence[int] = (1, 2, 3, 4, 5, 6, 7),
          timeout_s: float = 3.0, collective: Optional[str] = None,
          quiet: bool = False) -> CheckResults:
    """Check functions defined here (a notebook's cells, a script) on real gloo ranks forked
    from this process; returns the verdicts, which a notebook shows as a table. The functions
    they call (as allreduce_naive calls reduce_naive) are found where they were defined.
    `collective` names the collective when the names do not say it."""
    from ..collectives.student import describe_callable

    items = [(f, describe_callable(f, collective), [f.__globals__]) for f in functions]
    log_dir = Path(tempfile.mkdtemp(prefix="ddp_lab_check_logs_"))
    say = None if quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    results = run_check(items, log_dir, worlds, timeout_s, progress=say)
    results.run_dir = log_dir
    return results
