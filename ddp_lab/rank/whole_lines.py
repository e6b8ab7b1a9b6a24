"""`python -m ddp_lab.rank.whole_lines MODULE ARGS...`: run MODULE as `python -m MODULE
ARGS...` would, its console written a whole line at a time.

The ranks of one machine share its console (one pipe or terminal). torchrun starts a rank
as `python -u -m MODULE`: unbuffered, `print`'s text and its newline are two writes, and
another rank's line can land between them (`... 5.01 ms/step[rank 0] epoch 0: ...`).
Line-buffered, each line is one write, which a pipe never cuts (lines are far below
PIPE_BUF). ddp_lab.launch.torchrun starts every spawned rank through this module (a forked
rank calls `whole_lines` itself), so any `run.entry` prints whole lines, ours or a user's.
"""

from __future__ import annotations

import runpy
import sys


def whole_lines() -> None:
    """stdout and stderr written a line at a time: one write per line, never a part."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True, write_through=False)


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m ddp_lab.rank.whole_lines MODULE [ARGS...]")
    whole_lines()
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]  # as `python -m MODULE ARGS` sees them
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
