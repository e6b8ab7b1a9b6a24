"""One rank of a checked world: a forked process that joins a gloo
group and runs the cases its parent hands it, one at a time.

For each case (cases.py): make the inputs, run torch's collective on
copies, then the student's function inside a `Watch`
(collectives/watch.py), whose state goes to this rank's slot of the
shared board as every call starts and ends; compare, and send the
parent one result. A rank never decides a verdict: its parent sees
every rank's results and board, and says pass, wrong, crash, hang or
unsupported (world.py, diagnose.py).
"""

from __future__ import annotations

import ctypes
import datetime
import json
import os
import signal
import sys
import traceback
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist

from ..collectives.watch import Watch
from ..config.student import StudentFunction
from . import cases as C

_CHECK_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
SLOT = 8192


class Board:
    """Shared memory, one slot per rank: its Watch state as JSON (the
    parent reads it when a case does not end)."""

    def __init__(self, buf: Any, rank: int):
        self.buf, self.offset = buf, rank * SLOT

    def write(self, state: dict) -> None:
        data = json.dumps(state, default=repr).encode()[: SLOT - 8]
        self.buf[self.offset + 8:self.offset + 8 + len(data)] = data
        self.buf[self.offset:self.offset + 8] = len(data).to_bytes(8, "little")


def read_board(buf: Any, rank: int) -> dict:
    off = rank * SLOT
    n = int.from_bytes(buf[off:off + 8], "little")
    try:
        return json.loads(bytes(buf[off + 8:off + 8 + n])) if n else {}
    except ValueError:
        return {}


def student_frame(tb_or_frames: Any) -> Optional[tuple[str, int, str]]:
    """(file, line, source line) of the deepest frame outside torch and
    ddp_lab's check: the student's line."""
    frames = traceback.extract_tb(tb_or_frames) if tb_or_frames is not None else []
    mine = [f for f in frames if not f.filename.startswith((_TORCH_DIR, _CHECK_DIR))
            and not f.filename.endswith("collectives/watch.py")]
    if not mine:
        return None
    f = mine[-1]
    return f.filename, f.lineno or 0, (f.line or "").strip()


def _first_sentence(text: str) -> str:
    """An exception's first line, less a trailing sentence that only
    introduces what follows ("... are supported:")."""
    line = (text.strip().splitlines() or [""])[0][:300]
    if line.endswith(":") and ". " in line:
        line = line.rsplit(". ", 1)[0]
    return line.rstrip(":")


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _rebind_watch(files: set[str]):
    """A profile hook that notes a student's function that returns with
    one of its tensor arguments rebound to another tensor (`tensor =
    torch.max(...)`: the caller's tensor is left as it was)."""
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


def main(rank: int, world: int, conn: Any, buf: Any, store_path: str, fn: Callable,
         info: StudentFunction, namespaces: list, log_path: str) -> None:
    """The forked rank's whole life (it exits through os._exit)."""
    code = 0
    try:
        _die_with_parent()
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
    """The files the functions of the student's namespaces come from
    (a notebook's cells are a file each)."""
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
            returned = C.call(fn, prepared)
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
    n = len(members)
    tol = (C.tolerance(case, prepared.expected, prepared.scale, n)
           if isinstance(prepared.expected, torch.Tensor) else None)
    diff = C.first_difference(prepared.result, prepared.expected, tol)
    if diff is None:
        return out
    out["status"] = "wrong"
    out["difference"] = diff
    if prepared.written is not None and torch.equal(prepared.written, prepared.original):
        out["untouched"] = True
    if returned is not None and C.first_difference(returned, prepared.expected, tol) is None:
        out["returned_right"] = True
    if rebound:
        out["rebound"] = rebound
    return out
