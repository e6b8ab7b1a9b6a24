"""Reading every rank's heartbeat record: its age, place and process."""

from __future__ import annotations

import socket
import time
from pathlib import Path
from typing import Optional

from .heartbeat import FOLDER, parse, where


def process_state(pid: int, run_dir: Optional[Path] = None) -> str:
    """A pid of this machine: running | frozen (stopped by a signal,
    SIGSTOP) | dead (no such process, a zombie, or a process that is no
    longer one of this run's)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        state = stat[stat.rindex(")") + 2]
        if run_dir is not None:
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            key = str(run_dir).encode()
            if not any(a == key or a.startswith(key + b"/") for a in argv):
                return "dead"  # the pid was reused
    except (OSError, ValueError, IndexError):
        return "dead"
    if state in "Tt":
        return "frozen"
    if state in "ZXx":
        return "dead"
    return "running"


def is_local(record: dict) -> bool:
    return record.get("host") == socket.gethostname()


def read_all(run_dir: Path) -> list[dict]:
    """Every rank's record of the run folder's newest world, in rank
    order: `parse`'s dict plus age_s, where (in words), local (on this
    machine) and process (`process_state`, None for another machine's
    rank)."""
    run_dir = Path(run_dir).resolve()
    records = []
    for path in (run_dir / FOLDER).glob("rank*.bin"):
        try:
            rec = parse(path.read_bytes())
            if rec is None:
                continue
            rec["local"] = is_local(rec)
            # the process first, the record again after it: a killer
            # marks the record before its SIGKILL, so a process seen
            # gone has its record saying why
            rec["process"] = process_state(rec["pid"], run_dir) if rec["local"] else None
            rec.update({k: v for k, v in (parse(path.read_bytes()) or {}).items()
                        if k in ("updated", "epoch", "step", "collective", "phase", "op",
                                 "state", "message")})
        except OSError:
            continue
        records.append(rec)
    if not records:
        return []
    newest = max(records, key=lambda r: r["started"])
    records = [r for r in records if r["rank"] < newest["world_size"]]
    now = time.time()
    for r in records:
        r["age_s"] = max(0.0, now - r["updated"])
        r["where"] = where(r)
    return sorted(records, key=lambda r: r["rank"])
