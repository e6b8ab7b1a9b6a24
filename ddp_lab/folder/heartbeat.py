"""Each rank's heartbeat record, `RUN_DIR/heartbeat/rank<N>.bin`: where it is, for the other ranks,
the launcher and `status` (docs/failures.md, "A rank dies"); `read_all` reads every rank's back:
its age, place and process.

A fixed 512-byte record mapped into memory (mmap): an update is a store into the page, never a file
write, and a reader on the same machine sees it at once. A thread of the record reads the step
timer and comm recorder it `follow`s every FOLLOW_S, so a step only sets their attributes and a
rank stuck in a collective still says where it is. `mark_killed` lets another process say it killed
a rank. `epoch` counts epochs done, `step` steps done in the running one, `collective` the
collectives entered (same order on every rank: the rank behind has the smaller number).
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from ..world.env import host_address

FOLDER = "heartbeat"
MAGIC, VERSION = b"DDPR", 1
SIZE = 512
_HEAD = struct.Struct("<4sIiiiid64s")  # magic version rank local_rank world pid started host
_HOT = struct.Struct("<dqqqBBB5x")  # updated epoch step collective phase op state
_HOT_AT = 96
_STATE_AT = _HOT_AT + 34  # the state byte, for `mark_killed`
_MSG = struct.Struct("<256s")
MESSAGE_MAX = _MSG.size - 1  # a longer message is cut; the last byte stays NUL
_MSG_AT = _HOT_AT + _HOT.size
_NODE = struct.Struct("<64s48s")  # node name, address (written once; empty in older records)
_NODE_AT = SIZE - _NODE.size

PHASES = ("init", "setup", "data", "forward", "backward", "sync", "optim", "step end",
          "eval", "checkpoint", "teardown", "other")
OPS = ("", "all_reduce", "all_gather", "gather", "barrier", "broadcast", "reduce",
       "reduce_scatter", "send/recv", "other")
STATES = ("starting", "running", "done", "failed", "killed")
_PHASE = {name: i for i, name in enumerate(PHASES)}
_OP = {name: i for i, name in enumerate(OPS)}
_OTHER, _OTHER_OP = len(PHASES) - 1, len(OPS) - 1
STEP_PHASES = frozenset(("data", "forward", "backward", "sync", "optim"))
FOLLOW_S = 0.1  # how often a record reads the timer and recorder it follows


def record_path(run_dir: Path, rank: int) -> Path:
    """Rank `rank`'s record in the run folder."""
    return Path(run_dir) / FOLDER / f"rank{rank}.bin"


class NullHeartbeat:
    """What a process without a record updates (a test's trainer, a bench script): nothing;
    called as a `Heartbeat`, its `snapshot` empty."""

    def snapshot(self) -> dict:
        return {}

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name.startswith("__"):  # copy's and pickle's probes are no methods of it
            raise AttributeError(name)
        return lambda *args, **kwargs: None


class _Hot(ctypes.LittleEndianStructure):
    """The record's changing part (`_HOT`'s layout) laid over the page: updates are stores."""

    _pack_ = 1
    _fields_ = [("updated", ctypes.c_double), ("epoch", ctypes.c_int64),
                ("step", ctypes.c_int64), ("collective", ctypes.c_int64),
                ("phase", ctypes.c_uint8), ("op", ctypes.c_uint8), ("state", ctypes.c_uint8)]


class Heartbeat:
    """This rank's record; the main thread's and the follower's writes take a lock."""

    def __init__(self, run_dir: Path, rank: int, local_rank: int = 0, world_size: int = 1):
        self.path = record_path(run_dir, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "w+b") as f:  # a fresh record each start of the rank
            f.truncate(SIZE)
            self._mm = mmap.mmap(f.fileno(), SIZE)
        _HEAD.pack_into(self._mm, 0, MAGIC, VERSION, rank, local_rank, world_size, os.getpid(),
                        time.time(), socket.gethostname().encode()[:64])
        # SLURM's node name, else the hostname (nodes may share one); the address gloo gives its
        # peers, '' if the hostname does not resolve
        node, addr = os.environ.get("SLURMD_NODENAME") or socket.gethostname(), host_address() or ""
        _NODE.pack_into(self._mm, _NODE_AT, node.encode()[:64], addr.encode()[:48])
        self._hot = _Hot.from_buffer(self._mm, _HOT_AT)
        self._hot.phase = _PHASE["init"]
        self._hot.updated = time.time()
        self._lock = threading.Lock()
        # a StepTimer (.now: its phase, .ended: its steps), a CommRecorder (.entered: calls, .op)
        self._timer: Any = None
        self._comm: Any = None
        self._seen: tuple = (None, None)  # what the last read found: (timer's, comm's)
        # the record's step is this plus the timer's steps ended
        self._first_step = 0
        # collectives written at once (DistContext's), besides the comm's
        self._calls = 0
        self._closing = threading.Event()
        self._follower: Optional[threading.Thread] = None

    def follow(self, timer: Any = None, comm: Any = None) -> None:
        """Read `timer` (StepTimer) and `comm` (CommRecorder) every FOLLOW_S from now on."""
        with self._lock:
            self._read()
            h = self._hot
            if timer is not None:
                self._timer, self._first_step = timer, h.step - timer.ended
            if comm is not None:
                self._comm, self._calls = comm, h.collective - comm.entered
            self._seen = self._sources()
        if self._follower is None:
            self._follower = threading.Thread(target=self._follow, name="ddp_lab heartbeat",
                                              daemon=True)
            self._follower.start()

    def _sources(self) -> tuple:
        t, c = self._timer, self._comm
        return ((t.now, t.ended) if t is not None else None,
                (c.entered, c.op) if c is not None else None)

    def _read(self) -> None:
        """Write what the followed timer and recorder say if it changed (under the lock)."""
        seen = self._sources()
        if seen == self._seen:
            return
        (timer, comm), h = seen, self._hot
        if timer is not None and timer != self._seen[0]:
            h.phase = _PHASE.get(timer[0], _OTHER)
            h.step = self._first_step + timer[1]
        if comm is not None and comm != self._seen[1]:
            h.collective = self._calls + comm[0]
            h.op = _OP.get(comm[1], _OTHER_OP)
        self._seen = seen
        h.updated = time.time()

    def _follow(self) -> None:
        while not self._closing.wait(FOLLOW_S):
            with self._lock:
                self._read()

    @contextlib.contextmanager
    def _update(self) -> Iterator[_Hot]:
        """The record's changing part, under the lock, after the followed sources; stamped."""
        with self._lock:
            self._read()
            yield self._hot
            self._hot.updated = time.time()

    def phase(self, name: str) -> None:
        with self._update() as h:
            h.phase = _PHASE.get(name, _OTHER)

    def at(self, epoch: int, step: int) -> None:
        """An epoch starts (or resumes at `step`): `epoch` epochs done before it."""
        with self._update() as h:
            h.epoch, h.step, h.phase = epoch, step, _PHASE["setup"]
            self._first_step = step - (self._timer.ended if self._timer is not None else 0)

    def collective(self, op: str = "") -> None:
        """Called as this rank enters a collective the followed recorder does not count."""
        with self._update() as h:
            self._calls += 1
            h.collective, h.op = h.collective + 1, _OP.get(op, _OTHER_OP)

    def state(self, state: str, message: str = "") -> None:
        with self._update() as h:
            if message:
                _MSG.pack_into(self._mm, _MSG_AT, message.encode()[:MESSAGE_MAX])
            h.state = STATES.index(state)

    def snapshot(self) -> dict:
        with self._lock:
            self._read()
        return parse(bytes(self._mm[:SIZE])) or {}

    def close(self) -> None:
        self._closing.set()
        if self._follower is not None:
            self._follower.join()
        del self._hot  # the mapping cannot close while a structure points into it
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass


def start(run_dir: Path, rank: int, local_rank: int = 0,
          world_size: int = 1) -> Heartbeat | NullHeartbeat:
    """This rank's record (a NullHeartbeat if it cannot be made); rank 0 drops a larger world's."""
    try:
        record = Heartbeat(run_dir, rank, local_rank, world_size)
    except OSError:
        return NullHeartbeat()
    if rank == 0:
        for path in (Path(run_dir) / FOLDER).glob("rank*.bin"):
            n = path.stem.removeprefix("rank")
            if n.isdigit() and int(n) >= world_size:
                path.unlink(missing_ok=True)
    return record


def parse(data: bytes) -> Optional[dict]:
    """A record's bytes as a dict; None for anything that is not one."""
    if len(data) < SIZE or data[:4] != MAGIC:
        return None
    _, version, rank, local_rank, world, pid, started, host = _HEAD.unpack_from(data, 0)
    updated, epoch, step, count, phase, op, state = _HOT.unpack_from(data, _HOT_AT)
    (msg,) = _MSG.unpack_from(data, _MSG_AT)
    host, node, addr = (x.rstrip(b"\0").decode(errors="replace")
                        for x in (host, *_NODE.unpack_from(data, _NODE_AT)))
    return {"rank": rank, "local_rank": local_rank, "world_size": world, "pid": pid,
            "host": host, "node": node or host, "addr": addr, "started": started,
            "updated": updated, "epoch": epoch, "step": step, "collective": count,
            "phase": PHASES[phase] if phase < len(PHASES) else "other",
            "op": OPS[op] if op < len(OPS) else "other",
            "state": STATES[state] if state < len(STATES) else "unknown",
            "message": msg.rstrip(b"\0").decode(errors="replace")}


def where(r: dict) -> str:
    """'epoch 2 step 58 phase sync collective #171 (all_reduce)' (1-based)."""
    if r["phase"] == "init":
        text = "init"
    else:
        step = r["step"] + 1 if r["phase"] in STEP_PHASES else r["step"]
        text = f"epoch {r['epoch'] + 1} step {step} phase {r['phase']}"
    text += f" collective #{r['collective']}"
    return text + (f" ({r['op']})" if r["op"] else "")


def mark_killed(run_dir: Path, rank: int, message: str) -> None:
    """Say in a rank's record that another process killed it, and why (it cannot)."""
    try:
        fd = os.open(record_path(run_dir, rank), os.O_WRONLY)
    except OSError:
        return
    try:
        os.pwrite(fd, _MSG.pack(message.encode()[:MESSAGE_MAX]), _MSG_AT)
        os.pwrite(fd, bytes([STATES.index("killed")]), _STATE_AT)
    finally:
        os.close(fd)


def process_state(pid: int, run_dir: Optional[Path] = None) -> str:
    """A pid of this machine: running | frozen (stopped by a signal, SIGSTOP) | dead (no such
    process, a zombie, or a process that is no longer one of this run's)."""
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


def read_all(run_dir: Path) -> list[dict]:
    """Every rank's record of the run folder's newest world, in rank order: `parse`'s dict plus
    age_s, where, local (on this machine) and process (`process_state`; None: another machine's)."""
    run_dir = Path(run_dir).resolve()
    records = []
    for path in (run_dir / FOLDER).glob("rank*.bin"):
        try:
            rec = parse(path.read_bytes())
            if rec is None:
                continue
            rec["local"] = rec["host"] == socket.gethostname()
            # the process first, the record again after it: a killer marks the record before its
            # SIGKILL, so a process seen gone has its record saying why
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
