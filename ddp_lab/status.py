"""`python -m ddp_lab.status PATH [--follow | --stop] [--json]`:
reattach to a run (the command: ddp_lab/command/status_commands.py; its
state read by ddp_lab/command/status.py)."""

import os
import sys

from .command.status_commands import main

if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:
        # `... | head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(0)
