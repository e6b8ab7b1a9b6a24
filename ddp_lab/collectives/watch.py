"""A function's point-to-point calls, watched: what it sends and
receives, in how many rounds, and where it waits.

A student's collective calls `dist.send`, `dist.recv`, `dist.isend`,
`dist.irecv`, `dist.batch_isend_irecv` and maybe `dist.barrier`.
Inside `with Watch() as w:` each of those (and every collective) is
the real call, wrapped to count and to say where it is:

    w.sent, w.recv         bytes this rank sent and received
    w.rounds               its communication steps: a blocking send or
                           recv is one; posts waited together are one
    w.counts               collective calls by name ({"barrier": 3})
    w.pending              the calls this rank waits in now: op, peer,
                           elements, and the line of the caller's file
    w.history              its last point-to-point calls

`where` is the first frame outside torch and this file: the line of the
student's file that made the call. The check (ddp_lab/check/) runs each
rank's cases inside a Watch and publishes its state as it changes, so a
hang is explained by every rank's pending call; `sync=custom` counts
the bytes of each bucket's call with it.

The wrappers replace attributes of `torch.distributed` in this process
only while the `with` block runs (and names a student's module imported
from it, `from torch.distributed import send`); the real functions are
back when it ends.
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import os
import sys
import threading
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, MutableMapping, Optional

import torch
import torch.distributed as dist

#: point-to-point functions: name -> (direction, blocking)
P2P = {
    "send": ("sent", True),
    "recv": ("recv", True),
    "isend": ("sent", False),
    "irecv": ("recv", False),
}
#: collectives a student's code may call inside its own (counted; a
#: rank left in one the others never called is a hang's cause)
COLLECTIVE_CALLS = (
    "barrier",
    "broadcast",
    "all_reduce",
    "reduce",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "gather",
    "scatter",
    "all_to_all",
    "all_to_all_single",
    "monitored_barrier",
)

LOG_MAX = 4096
_HERE = os.path.abspath(__file__)
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))
_SKIP = (_TORCH, os.path.abspath(contextlib.__file__))


@dataclass
class Call:
    """One call a rank is in: op, peer (as given), elements, bytes, the
    caller's file:line."""

    op: str
    peer: Any
    numel: int
    nbytes: int
    where: str

    def as_dict(self) -> dict:
        d = asdict(self)
        d["peer"] = self.peer if isinstance(self.peer, (int, type(None))) else repr(self.peer)
        return d


def caller(skip: Iterable[str] = ()) -> str:
    """`file:line` of the first frame outside torch, the standard
    library's contextlib and this file (and `skip`'s folders)."""
    skip = (*_SKIP, *skip)
    f = sys._getframe(1)
    while f is not None:
        name = f.f_code.co_filename
        if name != _HERE and not name.startswith(skip):
            return f"{name}:{f.f_lineno}"
        f = f.f_back
    return "?"


def _numel(t: Any) -> tuple[int, int]:
    try:
        return int(t.numel()), int(t.nbytes)
    except Exception:
        return 0, 0


class _WatchedWork:
    """A Work whose wait() is watched (the call stays pending until it
    returns)."""

    def __init__(self, watch: "Watch", work: Any, call: Call):
        self._watch, self._work, self._call = watch, work, call

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        w = self._watch
        w._step_wait()
        w._enter(self._call, waiting=True)
        try:
            return self._work.wait(*args, **kwargs)
        finally:
            w._leave(self._call)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


class Watch:
    """Counts and locates this process's distributed calls while
    active (see the module's docstring). `publish(state)` is called
    with `state()` whenever the rank enters or leaves a call (the check
    writes it where its parent reads it)."""

    def __init__(
        self,
        publish: Optional[Callable[[dict], None]] = None,
        modules: Iterable[MutableMapping[str, Any]] = (),
        skip: Iterable[str] = (),
        bound_s: Optional[float] = None,
    ):
        self.publish = publish
        # a blocking send/recv becomes isend/irecv waited at most this
        # long, then raises naming the call (gloo's own p2p wait ignores
        # the group's timeout)
        self.bound_s = bound_s
        self.namespaces = list(modules)
        self.skip = tuple(skip)
        self._saved: list[tuple[Any, str, Any]] = []
        self._isends: list[Any] = []
        self._built: Optional[tuple] = None
        self._wrappers: dict[str, Callable] = {}
        self._by_id: dict[int, Callable] = {}
        self._lock = threading.Lock()
        self.reset()

    # -------------------------------------------------------- counters
    def reset(self) -> None:
        """Zero the counters (the check: before each case)."""
        self.sent = self.recv = self.rounds = 0
        self.messages_sent = self.messages_recv = 0
        self.counts: collections.Counter[str] = collections.Counter()
        self.pending: list[Call] = []
        self.posted: list[Call] = []
        self.history: collections.deque[Call] = collections.deque(maxlen=8)
        #: every point-to-point call since reset: (direction, peer,
        #: elements), at most LOG_MAX of them
        self.log: list[tuple[str, Any, int]] = []
        self._posts_since_wait = False

    def state(self) -> dict:
        return {
            "pending": [c.as_dict() for c in self.pending],
            "posted": [c.as_dict() for c in self.posted[-4:]],
            "history": [c.as_dict() for c in self.history],
            "counts": dict(self.counts),
            "sent": self.sent,
            "recv": self.recv,
            "rounds": self.rounds,
        }

    def _publish(self) -> None:
        if self.publish is not None:
            self.publish(self.state())

    def _enter(self, call: Call, waiting: bool = False) -> None:
        with self._lock:
            if waiting and call in self.posted:
                self.posted.remove(call)
            self.pending.append(call)
        self._publish()

    def _leave(self, call: Call) -> None:
        with self._lock:
            if call in self.pending:
                self.pending.remove(call)
        self._publish()

    def _step_wait(self) -> None:
        # posts waited together are one round
        if self._posts_since_wait:
            self.rounds += 1
            self._posts_since_wait = False

    def _count(self, name: str, tensor: Any, peer: Any) -> Call:
        direction, blocking = P2P[name]
        numel, nbytes = _numel(tensor)
        call = Call(name, peer, numel, nbytes, caller(self.skip))
        if direction == "sent":
            self.sent += nbytes
            self.messages_sent += 1
        else:
            self.recv += nbytes
            self.messages_recv += 1
        self.history.append(call)
        if len(self.log) < LOG_MAX:
            self.log.append((direction, peer if isinstance(peer, int) else repr(peer), numel))
        if blocking:
            self.rounds += 1
            self._posts_since_wait = False
        else:
            self._posts_since_wait = True
        return call

    # -------------------------------------------------------- wrappers
    def _p2p(self, name: str, real: Callable, posting_real: Optional[Callable] = None) -> Callable:
        def blocking(tensor, peer=None, *args, **kwargs):
            call = self._count(name, tensor, peer)
            self._enter(call)
            try:
                if self.bound_s is None or posting_real is None or peer is None:
                    return real(tensor, peer, *args, **kwargs)
                work = posting_real(tensor, peer, *args, **kwargs)
                try:
                    work.wait(datetime.timedelta(seconds=self.bound_s))
                except RuntimeError as e:
                    to = "to" if name == "send" else "from"
                    raise RuntimeError(
                        f"rank {dist.get_rank()} waited {self.bound_s:.0f} s in {name} {to} "
                        f"rank {peer} ({call.numel} elements) at {call.where}: no answer "
                        f"({str(e).splitlines()[0][:120]})"
                    ) from None
                return peer if name == "recv" else None
            finally:
                self._leave(call)

        def posting(tensor, peer=None, *args, **kwargs):
            call = self._count(name, tensor, peer)
            work = real(tensor, peer, *args, **kwargs)
            if work is None:
                return None
            with self._lock:
                self.posted.append(call)
            return _WatchedWork(self, work, call)

        wrapper = blocking if P2P[name][1] else posting
        wrapper.__wrapped__ = real  # type: ignore[attr-defined]
        wrapper.__name__ = name
        return wrapper

    def _batch(self, real: Callable) -> Callable:
        def batch_isend_irecv(p2p_op_list, *args, **kwargs):
            calls = [
                self._count(
                    (
                        "isend"
                        if op.op in self._isends or _original(op.op) is _ORIGINALS.get("isend")
                        else "irecv"
                    ),
                    op.tensor,
                    op.peer,
                )
                for op in p2p_op_list
            ]
            works = real(p2p_op_list, *args, **kwargs)
            with self._lock:
                self.posted.extend(calls)
            return [_WatchedWork(self, w, c) for w, c in zip(works, calls)]

        batch_isend_irecv.__wrapped__ = real  # type: ignore[attr-defined]
        return batch_isend_irecv

    def _collective(self, name: str, real: Callable) -> Callable:
        def collective(*args, **kwargs):
            self.counts[name] += 1
            numel, nbytes = _numel(args[0]) if args else (0, 0)
            call = Call(name, None, numel, nbytes, caller(self.skip))
            self._enter(call)
            try:
                out = real(*args, **kwargs)
                if kwargs.get("async_op") and out is not None:
                    out.wait()
                return out
            finally:
                self._leave(call)

        collective.__wrapped__ = real  # type: ignore[attr-defined]
        collective.__name__ = name
        return collective

    # -------------------------------------------------------- install
    def _build(self, current: dict[str, Any]) -> dict[str, Callable]:
        wrappers: dict[str, Callable] = {}
        self._isends = [current["isend"], _ORIGINALS["isend"]]
        for name in P2P:
            wrappers[name] = self._p2p(
                name, current[name], current.get({"send": "isend", "recv": "irecv"}.get(name, ""))
            )
        wrappers["batch_isend_irecv"] = self._batch(current["batch_isend_irecv"])
        for name in COLLECTIVE_CALLS:
            if name in current:
                wrappers[name] = self._collective(name, current[name])
        wrappers["P2POp"] = _P2POp
        self._isends.append(wrappers["isend"])
        return wrappers

    def __enter__(self) -> "Watch":
        # the functions as they are now (a test's own logging wrapper
        # stays under ours); the wrappers are made once, while those
        # stay the same (a training step enters once per bucket)
        current = {n: getattr(dist, n) for n in _ORIGINALS}
        key = tuple(id(f) for f in current.values())
        if self._built != key:
            self._wrappers, self._built = self._build(current), key
            self._by_id = {
                id(f): self._wrappers[n]
                for table in (_ORIGINALS, current)
                for n, f in table.items()
                if n in self._wrappers
            }
        for name, w in self._wrappers.items():
            self._swap(dist, name, w)
        # a student's `from torch.distributed import send`
        for ns in self.namespaces:
            for key_, value in list(ns.items()):
                if id(value) in self._by_id:
                    self._swap(ns, key_, self._by_id[id(value)])
        return self

    def _swap(self, where: Any, name: str, value: Any) -> None:
        if isinstance(where, MutableMapping):
            self._saved.append((where, name, where[name]))
            where[name] = value
        else:
            self._saved.append((where, name, getattr(where, name)))
            setattr(where, name, value)

    def __exit__(self, *exc: object) -> None:
        while self._saved:
            where, name, value = self._saved.pop()
            if isinstance(where, MutableMapping):
                where[name] = value
            else:
                setattr(where, name, value)


#: the real functions, taken once at import (a Watch inside a Watch
#: wraps the real ones, never a wrapper)
_ORIGINALS: dict[str, Any] = {
    n: getattr(dist, n)
    for n in (*P2P, "batch_isend_irecv", "P2POp", *COLLECTIVE_CALLS)
    if hasattr(dist, n)
}


def _original(op: Any) -> Any:
    """The real function under every wrapper."""
    while hasattr(op, "__wrapped__"):
        op = op.__wrapped__
    return op


class _P2POp(_ORIGINALS["P2POp"]):  # type: ignore[misc, valid-type]
    """torch's P2POp, taking a watched isend/irecv for the real one
    (torch checks that `op` is its own function)."""

    def __new__(cls, op, *args, **kwargs):
        return super().__new__(cls, _original(op), *args, **kwargs)

    def __init__(self, op, *args, **kwargs):
        super().__init__(_original(op), *args, **kwargs)
