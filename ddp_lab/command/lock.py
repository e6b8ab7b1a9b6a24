"""One command per run folder: `RUN_DIR/LOCK`, taken before the command writes anything into the
folder and held for the life of its job (docs/failures.md, "Two commands on one run folder": whose
lock counts as alive, refusal and takeover).

The lock is a small JSON file naming its holder (host, pid with its start time, launcher).
Race-free: a lock appears whole (a private file hard-linked to LOCK, which fails if LOCK exists),
and is removed only under a short `flock` of the run folder, after checking that LOCK is still the
very file judged (inode and content). Without flock or hard links: O_EXCL alone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Optional

from ..world.env import start_ticks
from ..config.errors import UserError
from ..folder.files import read_json_or_empty
from ..folder.records import now_iso

LOCK = "LOCK"


def _before_unlink() -> None:
    """Called between the re-check of a dead holder's LOCK and its removal, under the folder's
    flock: nothing here. tests/test_lock_stress.py pauses one taker at this point to show a second
    one cannot slip in (the flock and the re-check, each shown needed)."""


class FolderInUse(UserError):
    """Another command's job uses this run folder."""


def _me(launcher: str) -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "start": start_ticks(os.getpid()),
            "launcher": launcher, "since": now_iso(), "command": " ".join(sys.argv)}


def holder_alive(run_dir: Path, holder: dict) -> tuple[bool, str]:
    """(whether the lock's holder still lives, who it is in words)."""
    host, pid, launcher = holder.get("host"), holder.get("pid"), holder.get("launcher")
    who = f"python -m ddp_lab (pid {pid} on {host}, since {holder.get('since', '?')})"
    here = host == socket.gethostname()
    if here and isinstance(pid, int) and holder.get("start") is not None \
            and start_ticks(pid) == holder["start"]:  # the same process, not a reused pid
        return True, who
    if here:
        # (the launch package imports this module's caller)
        from ..launch import job_processes

        if job_processes(run_dir):
            return True, f"the job of {who}, whose processes still run"
    if launcher in ("slurm", "runai"):
        from .status import SLURM_ALIVE, inspect

        info = inspect(run_dir)
        job = f"{launcher} job {info.get('job_id') or '?'}"
        sched = info.get("scheduler")
        # SLURM: the scheduler's word (UNKNOWN: it did not answer)
        if sched is not None:
            alive = sched["state"] in SLURM_ALIVE | {"UNKNOWN", "PREEMPTED", "NODE_FAIL"}
            return alive, f"SLURM job {info['job_id']} ({sched['state']})"
        return info["state"] in ("running", "pending"), f"{job} ({info['state']}: {info['detail']})"
    # another machine's process: nothing here can tell
    return not here, who


@contextlib.contextmanager
def hold(run_dir: Path, launcher: str, keep: bool = False) -> Iterator[None]:
    """Hold `run_dir`'s lock for the `with` block: refuse (FolderInUse) while another command's job
    lives, take it over from a dead one. Given back at the end unless `keep` (a scheduler's job,
    which outlives this command, holds it on)."""
    acquire(run_dir, launcher)
    kept = False
    try:
        yield
        kept = keep
    finally:
        if not kept:
            release(run_dir)


@contextlib.contextmanager
def _guard(run_dir: Path) -> Iterator[None]:
    """The run folder's short exclusive flock: the only place a LOCK is removed. Released by the
    kernel if this process dies; a no-op where the file system has no flock."""
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield
        return
    try:
        # ENOLCK, EOPNOTSUPP, EBADF (NFS's flock on a directory): unguarded
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        # closing the last descriptor drops the flock
        os.close(fd)


def _read(path: Path) -> tuple[Optional[tuple[int, int]], dict]:
    """(LOCK's identity (device, inode), its holder) as one file's: (None, {}) when there is no
    LOCK; a holder of {} when its content cannot be read (torn, or not JSON)."""
    try:
        with open(path, "rb") as f:
            ident = os.fstat(f.fileno())
            data = f.read()
    except FileNotFoundError:
        return None, {}
    except OSError:
        return (0, 0), {}
    try:
        holder = json.loads(data)
    except ValueError:
        holder = {}
    return (ident.st_dev, ident.st_ino), holder if isinstance(holder, dict) else {}


def _create(path: Path, text: str) -> bool:
    """Make LOCK with `text` if there is none (True), whole from its first moment: written to a
    private file, then hard-linked to LOCK (atomic, fails if LOCK exists)."""
    tmp = path.with_name(f".{LOCK}.new-{os.getpid()}-{threading.get_ident()}")
    try:
        tmp.write_text(text)
        try:
            os.link(tmp, path)
            return True
        except FileExistsError:
            return False
        except OSError:
            # no hard links here: O_EXCL, whose content appears after a moment
            pass
    finally:
        tmp.unlink(missing_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return True


def acquire(run_dir: Path, launcher: str) -> None:
    path = run_dir / LOCK
    mine = json.dumps(_me(launcher), indent=1) + "\n"
    unreadable = 0
    for _ in range(50):
        try:
            if _create(path, mine):
                return
        except FileNotFoundError:
            # the folder itself vanished: another command's validation probe
            # (validate.folder_problem) removes the empty folder it made on the way
            run_dir.mkdir(parents=True, exist_ok=True)
            continue
        ident, holder = _read(path)
        if ident is None:
            # given back (or set aside) since: a holder that has just left
            continue
        # being written this moment (O_EXCL), or torn
        if not holder and unreadable < 5:
            unreadable += 1
            time.sleep(0.05 * unreadable)
            continue
        alive, who = holder_alive(run_dir, holder) if holder else (False, "an unreadable lock")
        if alive:
            raise FolderInUse(_in_use(run_dir, who))
        # remove it only if it is still the lock judged dead
        with _guard(run_dir):
            if _read(path) == (ident, holder):
                _before_unlink()
                path.unlink()
                print(f"[ddp_lab] run.dir={run_dir}: taking over the lock of {who}, which has "
                      "ended", file=sys.stderr, flush=True)
    raise FolderInUse(f"run.dir={run_dir}: another command keeps taking its lock ({path}); "
                      "choose another run.dir")


def _in_use(run_dir: Path, who: str) -> str:
    return (f"run.dir={run_dir} is in use by {who}: one command per run folder. Follow it "
            f"with `python -m ddp_lab.status {run_dir} --follow`, or choose another run.dir "
            f"(if that job is surely gone, delete {run_dir / LOCK})")


def in_use(cfg) -> Optional[str]:
    """A validation rule: why cfg.run.dir cannot be used now (another command's job lives there),
    checked before the folder's contents are judged; None when it is free."""
    if not cfg.run.dir:
        return None
    run_dir = Path(cfg.run.dir).expanduser().resolve()
    holder = read_json_or_empty(run_dir / LOCK)
    if not holder:
        return None
    alive, who = holder_alive(run_dir, holder)
    return _in_use(run_dir, who) if alive else None


def release(run_dir: Path) -> None:
    """Give the lock back if this process holds it."""
    path = run_dir / LOCK
    with _guard(run_dir):
        holder = _read(path)[1]
        if holder.get("pid") == os.getpid() and holder.get("host") == socket.gethostname():
            path.unlink(missing_ok=True)
