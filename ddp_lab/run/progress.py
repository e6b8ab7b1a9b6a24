"""Each rank's progress record: where it is, for the other ranks, the launcher and `status`.

Every rank keeps one fixed-size record, `RUN_DIR/progress/rank<N>.bin`, mapped into its
memory (mmap): an update is one `struct.pack_into` into that page (about a microsecond), never
a file write; the kernel writes the page back on its own, and a reader on the same machine
sees it at once. A record holds

    rank, local rank, world size, pid, host, start time          (written once)
    node name and address (the node's name in the job, the address its peers reach)
    time of the last update, epoch, step, phase, collective number and op, state
    a message (a failed rank's one-line reason)

Who updates it: the step timer and each synchroniser's comm recorder, as their listener
(`ddp_lab.run.epoch.EpochMeter` passes `phase` and `step_done` to its `StepTimer`,
`ddp_lab.sync.base.Synchroniser` passes `collective` to its `CommRecorder`; timing itself
knows nothing of this record), the scalar collectives of `ddp_lab.distributed.DistContext`,
the training loop (each epoch's start) and `ddp_lab.run.rank.run_rank` (state: starting,
running, done, failed).

Readers: `read_all(run_dir)` gives every rank's record as a dict (a `status` command's
view); `diagnose(run_dir)` names the rank(s) that stopped the others (dead, frozen by
SIGSTOP, no progress) from the records and, for ranks on this machine, /proc;
`failure_line` puts that in one line. A failed rank of a multi-node job also asks every
other node's address whether it still answers (`answers`): a node that sends no reply at all
went silent (a cut link, a node that lost its network) and is named as a node, with its
ranks. `Watchdog` dumps every thread's stack into the rank's log (faulthandler) when the
rank has made no progress for about dist.timeout_s.

Numbers: `epoch` counts the epochs done (the one running is epoch + 1 on the console),
`step` the steps done in it; `collective` counts the collectives this rank has entered
(every rank enters the same ones in the same order, so the rank behind is the one with the
smaller number).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import re
import signal
import socket
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Optional

from ..env import host_address
from .files import DiskFull

FOLDER = "progress"
MAGIC, VERSION = b"DDPR", 1
SIZE = 512
_HEAD = struct.Struct("<4sIiiiid64s")  # magic version rank local_rank world pid started host
_HOT = struct.Struct("<dqqqBBB5x")  # updated epoch step collective phase op state
_HOT_AT = 96
_STATE_AT = _HOT_AT + 34  # the state byte, for `mark_killed`
_MSG = struct.Struct("<256s")
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
_STEP_END, _OTHER, _OTHER_OP = _PHASE["step end"], len(PHASES) - 1, len(OPS) - 1
STEP_PHASES = frozenset(("data", "forward", "backward", "sync", "optim"))


REMOTE_STALE_S = 40.0  # see `diagnose`
PROBE_S = 2.0  # how long `answers` waits for a node's reply
PROBE_PORT = 9  # "discard": any port will do, a live node answers even where nothing listens


def record_path(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / FOLDER / f"rank{rank}.bin"


# ------------------------------------------------------------------ the writer
class NullProgress:
    """What a process without a record updates (a test's trainer, a bench script): nothing."""

    path: Optional[Path] = None

    def phase(self, name: str) -> None:
        pass

    def at(self, epoch: int, step: int) -> None:
        pass

    def step_done(self) -> None:
        pass

    def collective(self, op: str = "") -> None:
        pass

    def state(self, state: str, message: str = "") -> None:
        pass

    def snapshot(self) -> dict:
        return {}

    def close(self) -> None:
        pass


class _Hot(ctypes.LittleEndianStructure):
    """The record's changing part, laid over the mapped page (the layout of `_HOT`): an
    update is a couple of attribute stores, about 0.1 us each."""

    _pack_ = 1
    _fields_ = [("updated", ctypes.c_double), ("epoch", ctypes.c_int64),
                ("step", ctypes.c_int64), ("collective", ctypes.c_int64),
                ("phase", ctypes.c_uint8), ("op", ctypes.c_uint8), ("state", ctypes.c_uint8)]


class Progress(NullProgress):
    """This rank's record (see the module docstring). A DDP hook on a backend thread may
    count a collective while the main thread marks a phase: each store is atomic under the
    GIL, and a reader wants the latest of each, not a consistent set."""

    def __init__(self, run_dir: Path, rank: int, local_rank: int = 0, world_size: int = 1):
        self.path = record_path(run_dir, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        with open(self.path, "w+b") as f:  # a fresh record each start of the rank
            f.truncate(SIZE)
            self._mm = mmap.mmap(f.fileno(), SIZE)
        _HEAD.pack_into(self._mm, 0, MAGIC, VERSION, rank, local_rank, world_size, os.getpid(),
                        time.time(), socket.gethostname().encode()[:64])
        name, addr = node_identity()
        _NODE.pack_into(self._mm, _NODE_AT, name.encode()[:64], addr.encode()[:48])
        self._hot = _Hot.from_buffer(self._mm, _HOT_AT)
        self._hot.phase = _PHASE["init"]
        self._hot.updated = time.time()

    def phase(self, name: str, _time=time.time) -> None:
        h = self._hot
        h.phase = _PHASE.get(name, _OTHER)
        h.updated = _time()

    def at(self, epoch: int, step: int) -> None:
        """An epoch starts (or resumes at `step`): `epoch` epochs done before it."""
        h = self._hot
        h.epoch, h.step, h.phase = epoch, step, _PHASE["setup"]
        h.updated = time.time()

    def step_done(self, _time=time.time) -> None:
        h = self._hot
        h.step += 1
        h.phase = _STEP_END
        h.updated = _time()

    def collective(self, op: str = "", _time=time.time) -> None:
        """Called as this rank enters a collective."""
        h = self._hot
        h.collective += 1
        h.op = _OP.get(op, _OTHER_OP)
        h.updated = _time()

    def state(self, state: str, message: str = "") -> None:
        if message:
            _MSG.pack_into(self._mm, _MSG_AT, message.encode()[:255])
        self._hot.state = STATES.index(state)
        self._hot.updated = time.time()

    def snapshot(self) -> dict:
        return parse(bytes(self._mm[:SIZE])) or {}

    def close(self) -> None:
        del self._hot  # the mapping cannot close while a structure points into it
        try:
            self._mm.close()
        except (BufferError, ValueError):
            pass


_CURRENT: NullProgress = NullProgress()


def current() -> NullProgress:
    """This process's record (a NullProgress before `start`)."""
    return _CURRENT


def start(run_dir: Path, rank: int, local_rank: int = 0, world_size: int = 1) -> NullProgress:
    """Open this rank's record; rank 0 also drops records of ranks a larger earlier world
    left behind. A record that cannot be made (a read-only folder) leaves a NullProgress."""
    global _CURRENT
    try:
        _CURRENT = Progress(run_dir, rank, local_rank, world_size)
    except OSError:
        _CURRENT = NullProgress()
        return _CURRENT
    if rank == 0:
        for path in (Path(run_dir) / FOLDER).glob("rank*.bin"):
            n = path.stem.removeprefix("rank")
            if n.isdigit() and int(n) >= world_size:
                path.unlink(missing_ok=True)
    return _CURRENT


def node_identity() -> tuple[str, str]:
    """(this node's name, the address its peers reach it at): SLURM's node name (several
    nodes may share a hostname: scripts/netlab.sh's do), else the hostname; the address the
    hostname resolves to, the one gloo gives its peers ('' if it does not resolve)."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname(), host_address() or ""


# ------------------------------------------------------------------ readers
def parse(data: bytes) -> Optional[dict]:
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


def process_state(pid: int, run_dir: Optional[Path] = None) -> str:
    """A pid of this machine: running | frozen (stopped by a signal, SIGSTOP) | dead (no
    such process, a zombie, or a process that is no longer one of this run's)."""
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
    """Every rank's record of the run folder's current (newest) world, in rank order. Each
    dict: rank, local_rank, world_size, pid, host, node, addr, started, updated (seconds
    since the epoch), age_s (since the last update), epoch (epochs done), step (steps done in the
    running epoch), collective, op, phase, state (starting|running|done|failed), message,
    where (the position in words), local (on this machine) and process (running|frozen|
    dead for a rank of this machine, None for another's)."""
    run_dir = Path(run_dir).resolve()
    records = []
    for path in (run_dir / FOLDER).glob("rank*.bin"):
        try:
            rec = parse(path.read_bytes())
            if rec is None:
                continue
            rec["local"] = is_local(rec)
            # the process first, the record again after it: a killer marks the record
            # before its SIGKILL, so a process seen gone has its record saying why
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


def where(r: dict) -> str:
    """'epoch 2 step 58 phase sync collective #171 (all_reduce)' (epoch and step 1-based:
    the step running, or just done at `step end`)."""
    if r["phase"] in ("init",):
        text = "init"
    else:
        step = r["step"] + 1 if r["phase"] in STEP_PHASES else r["step"]
        text = f"epoch {r['epoch'] + 1} step {step} phase {r['phase']}"
    text += f" collective #{r['collective']}"
    return text + (f" ({r['op']})" if r["op"] else "")


def who(r: dict) -> str:
    return f"rank {r['rank']} (pid {r['pid']} on host {r['host']})"


def answers(addr: str, timeout_s: float = PROBE_S) -> bool:
    """Whether the machine at `addr` answers a TCP connection attempt within `timeout_s`.
    Any reply counts, a refusal too: a live node's kernel refuses a port where nothing
    listens at once. A node behind a cut link sends nothing, and the attempt times out."""
    try:
        socket.create_connection((addr, PROBE_PORT), timeout=timeout_s).close()
    except ConnectionRefusedError:
        return True
    except OSError:  # timed out, or no route to it
        return False
    return True


def silent_nodes(records: list[dict], me: Optional[int]) -> list[dict]:
    """The ranks of the other nodes that do not answer `me`'s node any more, each with
    `why` and `silent_node` added; [] when every node answers (or nothing says where the
    nodes are: records without addresses, or `me` unknown)."""
    mine = next((r for r in records if r["rank"] == me), None)
    if mine is None or not mine.get("node"):
        return []
    nodes: dict[str, str] = {}
    for r in records:
        if r.get("node") and r.get("addr") and r["node"] != mine["node"]:
            nodes.setdefault(r["node"], r["addr"])
    with ThreadPoolExecutor(max(1, min(16, len(nodes)))) as pool:  # a few seconds at most
        quiet = {n for n, ok in zip(nodes, pool.map(answers, nodes.values())) if not ok}
    found = [r for r in records if r.get("node") in quiet]
    for r in found:
        r["silent_node"] = r["node"]
        r["why"] = (f"went silent: {r['addr']} sends no reply (a connection attempt from "
                    f"{mine['node']} timed out after {PROBE_S:.0f} s)")
    return found


def diagnose(run_dir: Path, me: Optional[int] = None, stale_s: float = 0.0,
             records: Optional[list[dict]] = None, probe: bool = False) -> list[dict]:
    """The rank(s) that stopped the others, each record with `why` added, in order of
    evidence: ranks of this machine whose record says running but whose process is dead
    ('dead (no process)') or stopped ('frozen (SIGSTOP)'), or that another rank killed for
    it (its record says so); with `probe`, the ranks of the nodes that no longer answer
    `me`'s node (`silent_nodes`: a cut link); else the live ranks behind the others (the
    smallest collective number) with no update for `stale_s` seconds or more ('no progress
    for N s'); else the rank that failed first, unless that is `me` ('failed (<its
    reason>)'). [] when nothing stands out (every rank waits in the same collective)."""
    records = read_all(run_dir) if records is None else records
    others = [r for r in records if r["rank"] != me]
    found = []
    for r in others:
        if r["state"] == "killed":
            r["why"] = r["message"] or "killed"
            found.append(r)
        elif r["state"] in ("starting", "running") and r["process"] in ("dead", "frozen"):
            r["why"] = "dead (no process)" if r["process"] == "dead" else "frozen (SIGSTOP)"
            found.append(r)
    if found:
        return found
    if probe:
        found = silent_nodes(records, me)
        if found:
            return found
    live = [r for r in others if r["state"] in ("starting", "running")]
    counts = [r["collective"] for r in live + [r for r in records if r["rank"] == me]]
    if live and min(counts) < max(counts):
        # another machine's record reaches a shared folder when its kernel writes the page
        # back (up to ~35 s later on NFS): only a longer silence counts against it
        behind = [r for r in live if r["collective"] == min(counts)
                  and r["age_s"] >= (stale_s if r["local"] else max(stale_s, REMOTE_STALE_S))]
        for r in behind:
            r["why"] = f"no progress for {r['age_s']:.0f} s"
        if behind:
            return behind
    failed = [r for r in records if r["state"] == "failed"]
    if failed:
        first = min(failed, key=lambda r: r["updated"])
        if first["rank"] != me:
            first["why"] = f"failed ({first['message'] or 'see its log'})"
            return [first]
    return []


def failure_line(culprits: list[dict]) -> str:
    """'rank 1 (pid P on host H) stopped at epoch E step S phase sync collective #C: frozen
    (SIGSTOP)', one clause per rank, joined by '; '. The ranks of a silent node make one
    clause: 'node node2 (ranks 2-3, last at ...) went silent: ...'."""
    clauses, named = [], set()
    for r in culprits:
        node = r.get("silent_node")
        if not node:
            clauses.append(f"{who(r)} stopped at {r['where']}: {r['why']}")
        elif node not in named:  # the node's first rank speaks for it
            named.add(node)
            ranks = rank_list([c["rank"] for c in culprits if c.get("silent_node") == node])
            clauses.append(f"node {node} (ranks {ranks}, last at {r['where']}) {r['why']}")
    return "; ".join(clauses)


def rank_list(ranks: list[int]) -> str:
    """[2, 3, 5] -> '2-3, 5'."""
    ranks, parts = sorted(ranks), []
    for r in ranks:
        if parts and parts[-1][1] == r - 1:
            parts[-1][1] = r
        else:
            parts.append([r, r])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in parts)


def end_stuck(culprits: list[dict], run_dir: Path, by: str = "") -> list[int]:
    """SIGKILL the culprits of this machine that cannot end themselves: frozen (a stopped
    process keeps its torchrun waiting 30 s more) or without progress (hung). Only
    processes whose command line names the run folder; the pids killed."""
    killed = []
    for r in culprits:
        if not r.get("local") or r.get("process") not in ("frozen", "running"):
            continue
        if r["process"] == "running" and not r.get("why", "").startswith("no progress"):
            continue
        if process_state(r["pid"], Path(run_dir).resolve()) == "dead":
            continue
        mark_killed(run_dir, r["rank"], f"{r['why']}, killed by {by}" if by else r["why"])
        try:
            os.kill(r["pid"], signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
        killed.append(r["pid"])
    return killed


def mark_killed(run_dir: Path, rank: int, message: str) -> None:
    """Say in a rank's record that another process killed it, and why (it cannot)."""
    try:
        fd = os.open(record_path(run_dir, rank), os.O_WRONLY)
    except OSError:
        return
    try:
        os.pwrite(fd, _MSG.pack(message.encode()[:255]), _MSG_AT)
        os.pwrite(fd, bytes([STATES.index("killed")]), _STATE_AT)
    finally:
        os.close(fd)


def short_error(e: BaseException, limit: int = 200) -> str:
    """'RuntimeError: Timed out waiting 15000ms for recv operation to complete': the
    exception's type and first meaningful line, without source paths. A full disk is
    said as `no space left on <folder> (writing <file>)`."""
    if isinstance(e, DiskFull):
        return str(e)
    text = " ".join(str(e).split("\n\n")[0].split())
    text = re.sub(r"\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", text)
    text = text.replace("Got the following error when running the callback: ", "")
    name = type(e).__name__
    text = text.removeprefix(f"{name}: ")
    text = f"{name}: {text}" if text else name
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ------------------------------------------------------------------ nccl
# (current name, name before, the torch that reads the current one): torch still reads the
# name before, but warns on every rank's console (TORCH_NCCL_TRACE_BUFFER_SIZE, seen on 2.11)
FLIGHT_RECORDER_NAMES = {"buffer": ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "2.9"),
                         "dump": ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "2.5")}


def flight_recorder_env(run_dir: Path, buffer_size: int = 2000,
                        torch_version: Optional[str] = None) -> dict[str, str]:
    """The variables that turn on PyTorch's NCCL flight recorder with its dumps in
    RUN_DIR/flight_recorder/rank_<N> (made here), each under the name the running torch
    reads (`torch_version`, default torch.__version__; FLIGHT_RECORDER_NAMES): the buffer's
    entries, the dump path, and TORCH_NCCL_DUMP_ON_TIMEOUT."""
    from torch.torch_version import TorchVersion, __version__

    version = TorchVersion(torch_version or __version__)
    folder = Path(run_dir) / "flight_recorder"
    folder.mkdir(parents=True, exist_ok=True)
    values = {"buffer": str(buffer_size), "dump": str(folder / "rank_")}
    env = {}
    for kind, (now, before, since) in FLIGHT_RECORDER_NAMES.items():
        env[now if version >= since else before] = values[kind]
    env["TORCH_NCCL_DUMP_ON_TIMEOUT"] = "1"
    return env


def enable_flight_recorder(run_dir: Path, environ: Optional[dict] = None,
                           torch_version: Optional[str] = None) -> dict[str, str]:
    """Set `flight_recorder_env` in `environ` (os.environ), keeping what a user set (under
    either name of a variable); call it before init_process_group. The variables now in
    effect."""
    environ = os.environ if environ is None else environ
    aliases = {name: names[:2] for names in FLIGHT_RECORDER_NAMES.values() for name in names[:2]}
    in_effect = {}
    for key, value in flight_recorder_env(run_dir, torch_version=torch_version).items():
        names = aliases.get(key, (key,))
        if not any(n in environ for n in names):
            environ[key] = value
        in_effect.update({n: environ[n] for n in sorted(names) if n in environ})
    return in_effect


# ------------------------------------------------------------------ hang watchdog
class Watchdog:
    """Dumps every thread's stack into the rank's log when the rank has made no progress
    for `timeout_s` (faulthandler.dump_traceback_later: a C thread, so it fires even when
    the main thread is stuck in a collective, holding the GIL or not). `rearm()` starts the
    wait again: cheap enough for a call every second or so (the stop checks)."""

    def __init__(self, timeout_s: float, file: Any = None):
        self.timeout_s, self.file, self.armed = float(timeout_s), file, False

    def rearm(self) -> None:
        if self.file is None or self.timeout_s <= 0:
            return
        import faulthandler

        faulthandler.dump_traceback_later(self.timeout_s, repeat=False, file=self.file)
        self.armed = True

    def cancel(self) -> None:
        if self.armed:
            import faulthandler

            faulthandler.cancel_dump_traceback_later()
            self.armed = False


_WATCHDOG = Watchdog(0)


def watchdog() -> Watchdog:
    """This process's watchdog (one that does nothing until `set_watchdog`)."""
    return _WATCHDOG


def set_watchdog(timeout_s: float, file: Any) -> Watchdog:
    global _WATCHDOG
    _WATCHDOG.cancel()
    _WATCHDOG = Watchdog(timeout_s, file)
    return _WATCHDOG
