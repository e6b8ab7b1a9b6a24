"""A checked world of n real gloo ranks, forked from this process (which imported torch once),
and its cases run one at a time.

The parent hands every rank a case and waits for all of them, at most the case's time limit. A
rank that does not answer in time is waiting in a call (the board says which); a rank that
raised is a crash; then the world is ended (every rank killed) and the next world starts fresh.
Forked ranks die with their parent (PR_SET_PDEATHSIG), so no verdict leaves a process behind.
Each rank (`rank_process`) joins a gloo group and runs the student's function inside a `Watch`,
whose state it writes to its slot of the shared board as every call starts and ends.
"""

from __future__ import annotations

import datetime
import json
import mmap
import multiprocessing
import multiprocessing.connection
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from . import cases as C
from ..collectives.watch import Watch
from ..config.student import StudentFunction
from ..world.env import set_parent_death_signal
from .cases import Case


_CHECK_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
SLOT = 8192


class Board:
    """Shared memory, one slot per rank: its Watch state as JSON (the parent reads it when a
    case does not end)."""

    def __init__(self, buf: Any, rank: int):
        self.buf, self.offset = buf, rank * SLOT

    def write(self, state: dict) -> None:
        data = json.dumps(state, default=repr).encode()[: SLOT - 8]
        self.buf[self.offset + 8:self.offset + 8 + len(data)] = data
        self.buf[self.offset:self.offset + 8] = len(data).to_bytes(8, "little")

    def read(self) -> dict:
        n = int.from_bytes(self.buf[self.offset:self.offset + 8], "little")
        try:
            return json.loads(bytes(self.buf[self.offset + 8:self.offset + 8 + n])) if n else {}
        except ValueError:
            return {}


def student_frame(tb_or_frames: Any) -> Optional[tuple[str, int, str]]:
    """(file, line, source line) of the deepest frame outside torch and ddp_lab's check: the
    student's line."""
    frames = traceback.extract_tb(tb_or_frames) if tb_or_frames is not None else []
    mine = [f for f in frames if not f.filename.startswith((_TORCH_DIR, _CHECK_DIR))
            and not f.filename.endswith("collectives/watch.py")]
    if not mine:
        return None
    f = mine[-1]
    return f.filename, f.lineno or 0, (f.line or "").strip()


def _first_sentence(text: str) -> str:
    """An exception's first line, less a trailing sentence that only introduces what follows
    ("... are supported:")."""
    line = (text.strip().splitlines() or [""])[0][:300]
    if line.endswith(":") and ". " in line:
        line = line.rsplit(". ", 1)[0]
    return line.rstrip(":")


def _rebind_watch(files: set[str]):
    """A profile hook that notes a student's function that returns with one of its tensor
    arguments rebound to another tensor (`tensor = torch.max(...)`: the caller's tensor is left
    as it was)."""
    entered: dict[int, dict[str, int]] = {}
    found: list[dict] = []

    def hook(frame, event, arg):
        code = frame.f_code
        if code.co_filename not in files:
            return
        if event == "call":
            names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
            entered[id(frame)] = {n: id(frame.f_locals[n]) for n in names
                                  if isinstance(frame.f_locals.get(n), torch.Tensor)}
        elif event == "return" and id(frame) in entered:
            before = entered.pop(id(frame))
            for name, ident in before.items():
                now = frame.f_locals.get(name)
                if isinstance(now, torch.Tensor) and id(now) != ident:
                    found.append({"function": code.co_name, "argument": name})
    return hook, found


def rank_process(rank: int, world: int, conn: Any, buf: Any, store_path: str, fn: Callable,
                 info: StudentFunction, namespaces: list, log_path: str) -> None:
    """The forked rank's whole life (it exits through os._exit)."""
    code = 0
    try:
        set_parent_death_signal(signal.SIGKILL)
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
        sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        torch.set_num_threads(1)
        store = dist.FileStore(store_path, world)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=300))
        sub = dist.new_group(list(range(1, world))) if info.signature.group and world >= 3 else None
        board = Board(buf, rank)
        watch = Watch(publish=board.write, modules=namespaces)
        files = {info.path, *student_files(namespaces)}
        conn.send(("ready", rank))
        while True:
            msg = conn.recv()
            if msg[0] == "stop":
                break
            _, index, case = msg
            conn.send(("result", index,
                       run_case(rank, index, case, fn, info, sub, watch, board, files)))
        dist.destroy_process_group()
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def student_files(namespaces: list) -> set[str]:
    """The files the functions of the student's namespaces come from (a notebook's cells are a
    file each)."""
    own = os.path.dirname(_CHECK_DIR)
    return {v.__code__.co_filename for ns in namespaces for v in list(ns.values())
            if callable(v) and hasattr(v, "__code__")
            and not v.__code__.co_filename.startswith((own, _TORCH_DIR))}


def run_case(rank: int, index: int, case: C.Case, fn: Callable, info: StudentFunction,
             sub: Optional[dist.ProcessGroup], watch: Watch, board: Board,
             files: set[str]) -> dict:
    members = case.group or tuple(range(case.world_size))
    if rank not in members:
        return {"status": "idle"}
    group = sub if case.group else None
    prepared = C.prepare(info, case, rank, index, group)
    watch.reset()
    board.write({"case": index, "in_function": True, **watch.state()})
    hook, rebound = _rebind_watch(files)
    out: dict = {"status": "ok"}
    returned = None
    with watch:
        sys.setprofile(hook)
        try:
            returned = fn(*prepared.args, **prepared.kwargs)
        except NotImplementedError as e:
            out = {"status": "unsupported", "message": str(e) or "NotImplementedError"}
        except BaseException as e:  # the student's exception, whatever it is
            where = student_frame(e.__traceback__)
            out = {"status": "raised", "type": type(e).__name__,
                   "message": _first_sentence(str(e)),
                   "where": f"{where[0]}:{where[1]}" if where else None,
                   "source": where[2] if where else None}
        finally:
            sys.setprofile(None)
    out.update({"sent": watch.sent, "recv": watch.recv, "rounds": watch.rounds,
                "counts": dict(watch.counts), "messages_sent": watch.messages_sent,
                "messages_recv": watch.messages_recv, "p2p": watch.log})
    board.write({"case": index, "in_function": False, "returned": True, **watch.state()})
    if prepared.expected is None:
        # torch leaves this rank's result undefined (a reduce's non-root)
        out["compared"] = False
    if out["status"] != "ok" or prepared.expected is None:
        return out
    tol = (C.tolerance(case, prepared.expected, prepared.scale, len(members))
           if isinstance(prepared.expected, torch.Tensor) else None)
    diff = C.first_difference(prepared.result, prepared.expected, tol)
    if diff is None:
        return out
    out.update(status="wrong", difference=diff)
    if prepared.written is not None and torch.equal(prepared.written, prepared.original):
        out["untouched"] = True
    if returned is not None and C.first_difference(returned, prepared.expected, tol) is None:
        out["returned_right"] = True
    if rebound:
        out["rebound"] = rebound
    return out


#: how long a world may take to start (fork + gloo's rendezvous)
START_S = 60.0


@dataclass
class CaseRun:
    """What the ranks of one case did: results by rank, and the board of every rank."""

    case: Case
    results: dict[int, dict] = field(default_factory=dict)
    states: dict[int, dict] = field(default_factory=dict)
    dead: list[int] = field(default_factory=list)
    exitcodes: dict[int, Optional[int]] = field(default_factory=dict)


class WorldFailed(RuntimeError):
    """The world itself did not start (not the student's doing)."""


class World:
    def __init__(self, fn: Callable, info: StudentFunction, size: int, namespaces: list,
                 log_dir: Path):
        self.fn, self.info, self.size = fn, info, size
        self.namespaces, self.log_dir = namespaces, log_dir
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self.tmp: Optional[str] = None
        self.buf: Optional[mmap.mmap] = None

    def log_path(self, rank: int) -> Path:
        return self.log_dir / f"{self.info.name}_w{self.size}_rank{rank}.log"

    def start(self) -> "World":
        ctx = multiprocessing.get_context("fork")
        self.tmp = tempfile.mkdtemp(prefix="ddp_lab_check_")
        self.buf = mmap.mmap(-1, SLOT * self.size)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for rank in range(self.size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=rank_process, daemon=True, args=(
                rank, self.size, child, self.buf, f"{self.tmp}/store", self.fn, self.info,
                self.namespaces, str(self.log_path(rank))))
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
        deadline = time.monotonic() + START_S
        for rank, conn in enumerate(self.conns):
            if not conn.poll(max(deadline - time.monotonic(), 0)):
                self.close()
                raise WorldFailed(f"{self.size} gloo ranks did not start in {START_S:.0f} s "
                                  f"(see {self.log_path(rank)})")
            try:
                conn.recv()
            except EOFError:
                self.close()
                raise WorldFailed(f"rank {rank} of {self.size} died while starting "
                                  f"(see {self.log_path(rank)})") from None
        return self

    def run(self, index: int, case: Case, limit_s: float, grace_s: float = 0.5) -> CaseRun:
        """Run one case on every rank; wait at most `limit_s` (and only `grace_s` more once a
        rank has raised: the others wait on it)."""
        out = CaseRun(case)
        for conn in self.conns:
            conn.send(("case", index, case))
        waiting = dict(enumerate(self.conns))
        deadline = time.monotonic() + limit_s
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            ready = multiprocessing.connection.wait(list(waiting.values()), timeout=left)
            for conn in ready:
                rank = next(r for r, c in waiting.items() if c is conn)
                try:
                    _, got, result = conn.recv()
                except EOFError:
                    out.dead.append(rank)
                    waiting.pop(rank)
                    deadline = min(deadline, time.monotonic() + grace_s)
                    continue
                if got == index:
                    out.results[rank] = result
                    waiting.pop(rank)
                    if result.get("status") in ("raised", "unsupported"):
                        deadline = min(deadline, time.monotonic() + grace_s)
        for rank in out.dead:
            self.procs[rank].join(1.0)
            out.exitcodes[rank] = self.procs[rank].exitcode
        assert self.buf is not None
        out.states = {r: Board(self.buf, r).read() for r in range(self.size)}
        return out

    def close(self) -> None:
        """Every rank ended: asked to stop if the world is sound, else killed."""
        for conn, p in zip(self.conns, self.procs):
            try:
                if p.is_alive():
                    conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
        deadline = time.monotonic() + 2.0
        for p in self.procs:
            p.join(max(deadline - time.monotonic(), 0))
            if p.is_alive():
                p.kill()
                p.join()
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
        for rank in range(self.size):
            log = self.log_path(rank)
            if log.exists() and log.stat().st_size == 0:
                log.unlink()

    def kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
        self.close()
