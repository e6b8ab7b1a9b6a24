"""The stop contract both sides read: the file `RUN_DIR/STOP`, the
codes of a stop and the exit status of a stopped run (torch-free).

Any process that sees the run folder asks with `request_stop`; rank 0
reads the file at each stop check (`read_stop_file`,
ddp_lab/rank/epochs.py agrees with the other ranks); a new segment clears
it (`clear_stop_file`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from .files import atomic_write_text

STOP_FILE = "STOP"
# `python -m ddp_lab` after a graceful stop (EX_TEMPFAIL: try again
# later)
EXIT_STOPPED = 75
# the codes of a stop: the higher wins when ranks disagree
PREEMPTED, STOPPED = 1, 2
STATUS = {PREEMPTED: "preempted", STOPPED: "stopped"}


def request_stop(run_dir: Path, status: str = "stopped",
                 reason: str = "") -> Path:
    """Ask a running job to stop at its next check. `status`: stopped
    (a person) or preempted (continue later)."""
    if status not in STATUS.values():
        raise ValueError(
            f"stop status {status!r}: choose stopped or preempted")
    path = Path(run_dir) / STOP_FILE
    atomic_write_text(path, f"{status} {reason}".strip() + "\n")
    return path


def read_stop_file(run_dir: Path) -> Optional[tuple[int, str]]:
    """The request's code and reason; None when there is none."""
    try:
        text = (Path(run_dir) / STOP_FILE).read_text().strip()
    except OSError:
        return None
    word, _, rest = text.partition(" ")
    code = PREEMPTED if word == "preempted" else STOPPED
    return code, f"stop file ({rest or word})"


def clear_stop_file(run_dir: Path) -> None:
    """A new segment of the run starts: an old request is spent."""
    (Path(run_dir) / STOP_FILE).unlink(missing_ok=True)
