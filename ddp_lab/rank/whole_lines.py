"""`python -m ddp_lab.rank.whole_lines MODULE ARGS...`: run MODULE as
`python -m MODULE ARGS...` would, its console written a whole line at a
time. The ranks of a machine share its console, and under `python -u` a
line and its newline are two writes that another rank's line can land
between; line-buffered, each line is one write a pipe never cuts.
ddp_lab.launch.torchrun starts every spawned rank through this (forked
ones call `whole_lines`), so any `run.entry` prints whole lines.
"""

from __future__ import annotations

import runpy
import sys


def whole_lines() -> None:
    """stdout and stderr written a line at a time: one write per line,
    never a part."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True, write_through=False)


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m ddp_lab.rank.whole_lines MODULE [ARGS...]")
    whole_lines()
    module = sys.argv[1]
    # as `python -m MODULE ARGS` sees them
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
