"""`python -m ddp_lab.status PATH [--follow | --stop] [--json]`:
reattach to a run.

    python -m ddp_lab.status outputs/             # one line per run
    python -m ddp_lab.status RUN_DIR --follow     # its logs until it ends
    python -m ddp_lab.status RUN_DIR --stop       # checkpoint, then end it (scancel on SLURM)

The state comes from `inspect` (status.py), its screen from
status_screen.py; --follow and --stop are status_follow.py and
status_stop.py (docs/status.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Optional

from ..config.errors import UserError
from .status import dry_runs, find_runs, inspect
from .status_follow import follow
from .status_screen import one_line, render
from .status_stop import stop

USAGE = "python -m ddp_lab.status RUN_DIR [--follow | --stop] [--json]"


class _Parser(argparse.ArgumentParser):
    # one line, exit 2 (argparse prints usage on two)
    def error(self, message: str):
        raise UserError(f"{message} (usage: {USAGE})")


def _parse(argv: Optional[list[str]]) -> argparse.Namespace:
    ap = _Parser(prog="python -m ddp_lab.status",
                 description="Show a run's state (or one line per run of a folder), follow it "
                             "to its end, or stop it gracefully (checkpoint first).")
    ap.add_argument("path", metavar="RUN_DIR",
                    help="a run folder (printed as `run dir: PATH`), or a folder of runs")
    how = ap.add_mutually_exclusive_group()
    how.add_argument("--follow", action="store_true",
                     help="print the logs and state changes until the run ends; exit 0 "
                          "completed, 75 preempted/stopped, 1 failed")
    how.add_argument("--stop", action="store_true",
                     help="every rank checkpoints at its next check and exits; a SLURM job "
                          "is then cancelled")
    ap.add_argument("--json", action="store_true", help="the state as JSON (not with --follow/--stop)")
    ap.add_argument("--timeout", type=float, default=300.0,
                    help="--stop: seconds to wait for the checkpoint (default 300)")
    ap.add_argument("--poll", type=float, default=1.0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.json and (args.follow or args.stop):
        raise UserError("--json shows the state only: drop --follow/--stop, or --json")
    if args.timeout <= 0 or args.poll <= 0:
        raise UserError("--timeout must be > 0 seconds")
    return args


def resolve_path(text: str) -> Path:
    path = Path(text).expanduser()
    if not path.exists():
        raise UserError(f"{text}: no such folder: give a run folder (the `run dir: PATH` a run "
                        "prints) or a folder of runs such as outputs/")
    if not path.is_dir():
        raise UserError(f"{text} is a file, not a folder: give its run folder "
                        f"({path.parent}?) or a folder of runs")
    return path.resolve()


def main(argv: Optional[list[str]] = None) -> int:
    try:
        args = _parse(argv)
        path = resolve_path(args.path)
        runs = find_runs(path)
        if not runs and dry_runs(path):
            raise UserError(f"{args.path} holds only dry runs ({dry_runs(path)}): rendered, "
                            "never started; run the same command without launcher.dry_run=true")
        if not runs:
            raise UserError(f"{args.path} holds no run folder (no config.yaml in it or below): "
                            "give a run folder (the `run dir: PATH` a run prints) or a folder of runs")
        if (args.follow or args.stop) and runs != [path]:
            what = "--follow" if args.follow else "--stop"
            raise UserError(f"{what} takes one run folder; {args.path} holds {len(runs)} run(s): "
                            f"give one of them, e.g. {runs[0]}")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.follow:
        return follow(path, args.poll)
    if args.stop:
        return stop(path, args.timeout, args.poll)
    infos = [inspect(r) for r in runs]
    if args.json:
        print(json.dumps(infos[0] if runs == [path] else infos, indent=2, default=str))
    elif runs == [path]:
        print(render(infos[0]))
    else:
        for info in infos:
            print(one_line(info))
        states: dict[str, int] = {}
        for info in infos:
            states[info["state"]] = states.get(info["state"], 0) + 1
        dry = dry_runs(path)
        print(f"{len(infos)} run(s) under {path}: "
              + ", ".join(f"{n} {s}" for s, n in sorted(states.items()))
              + (f" ({dry} dry run(s) not counted)" if dry else ""))
    return 0
