"""The benchmarked operations: buffers, inputs, the call being timed, and its check.

Each op fills its inputs with a known pattern (`Pattern`, below), runs one implementation (the
library's `torch` or ddp_lab.collectives' algorithms, timed and checked alike) and checks every
element of the result; sizes follow nccl-tests (docs/bench.md, "What is measured").
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Callable, Optional

import torch
import torch.distributed as dist

from . import config
from ..collectives import ALL_GATHER, ALL_REDUCE, BROADCAST, GATHER, REDUCE, REDUCE_SCATTER
from ..config.registry import Registry
from ..world import torch_support


PERIOD = 8  # the pattern repeats every PERIOD elements
CHUNK = 1 << 22  # elements per fill/check slice: bounds the temporaries


class Pattern:
    """Fills and checks `t[i] = base + scale * ((i + off) % PERIOD)`, slice by slice."""

    def __init__(self, dtype: torch.dtype, device: torch.device):
        self.dtype = dtype
        self.pat = (torch.arange(CHUNK + PERIOD, device=device) % PERIOD).to(dtype)
        # half types round partial sums; every other type must match bit for bit
        self.rtol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 0.0

    def _slices(self, t: torch.Tensor, off: int):
        flat = t.view(-1)
        for s in range(0, flat.numel(), CHUNK):
            n = min(CHUNK, flat.numel() - s)
            o = (s + off) % PERIOD
            yield s, flat[s:s + n], self.pat[o:o + n]

    def fill(self, t: torch.Tensor, base: float, scale: float = 1, off: int = 0) -> None:
        for _, seg, pat in self._slices(t, off):
            seg.copy_(pat)
            if scale != 1:
                seg.mul_(scale)
            if base:
                seg.add_(base)

    def check(self, t: torch.Tensor, base: float, scale: float = 1, off: int = 0,
              what: str = "result", rtol: Optional[float] = None,
              atol: float = 0.0) -> Optional[str]:
        """None if every element is as expected (bit for bit, or within rtol/atol where the
        expected values themselves round), else where the first one is not."""
        rtol = max(self.rtol, rtol or 0.0)
        exact = rtol == 0 and atol == 0
        for s, seg, pat in self._slices(t, off):
            exp = pat * scale + base
            ok = torch.equal(seg, exp) if exact else torch.allclose(seg, exp, rtol=rtol, atol=atol)
            if not ok:
                bad = (seg != exp) if exact else ~torch.isclose(seg, exp, rtol=rtol, atol=atol)
                i = int(bad.nonzero()[0])
                return (f"{what}[{s + i}] = {seg[i].item()}, expected {exp[i].item()} "
                        f"({int(bad.sum())} of {seg.numel()} elements wrong in that slice)")
        return None


@dataclass(frozen=True)
class GroupCtx:
    """This rank's group for one measurement: global ranks, handle, own index."""

    ranks: tuple[int, ...]
    handle: Optional[dist.ProcessGroup]  # None = the default group
    grank: int

    @property
    def n(self) -> int:
        return len(self.ranks)

    @property
    def root(self) -> int:
        return self.ranks[0]  # global rank of the group's first member

    def peer(self, shift: int) -> int:
        return self.ranks[(self.grank + shift) % self.n]


@dataclass(frozen=True)
class Op:
    """One benchmarked operation. `impls` maps implementation names to callables `(bufs, g) ->
    None`; `mem` is the number of size-N buffers a rank holds (with scratch), for the memory cap;
    `factor` names the nccl-tests bus-bandwidth factor."""

    name: str
    factor: str
    mem: float
    setup: Callable[[int, GroupCtx, torch.dtype, torch.device], dict]
    reset: Callable[[dict, GroupCtx, Pattern], None]
    check: Callable[[dict, GroupCtx, Pattern], Optional[str]]
    impls: dict[str, Callable[[dict, GroupCtx], None]]
    full_array: bool = False  # elements = n pieces of N // n (all_gather, reduce_scatter)
    pairwise: bool = False  # ping-pong: runs on rank pairs, not on the process groups

    def elements(self, size: int, n: int) -> int:
        return (size // n) * n if self.full_array else size


LR = 0.1  # reduce_broadcast's learning rate: the assignment's (its check is allclose)


def _sum_ranks(n: int) -> int:
    return n * (n + 1) // 2  # sum of the inputs' bases 1..n


def _ours(table: dict, call: Callable, skip: str = "torch") -> dict:
    """ddp_lab's algorithms in `table`, each as run(bufs, g) = call(f, bufs, g) with its f."""
    return {k: partial(call, f) for k, f in table.items() if k != skip}


def _empty(*names: str) -> Callable:
    """An op's setup: one tensor of `size` elements per name."""
    return lambda size, g, dtype, device: {k: torch.empty(size, dtype=dtype, device=device)
                                           for k in names}


def _pieces(piece: str, whole: str) -> Callable:
    """An op's setup: `piece` of m = size // n elements, `whole` of the n pieces."""
    def setup(size, g, dtype, device):
        m = size // g.n
        return {piece: torch.empty(m, dtype=dtype, device=device),
                whole: torch.empty(m * g.n, dtype=dtype, device=device), "m": m}
    return setup


#: bench.ops -> how an implementation of ddp_lab.collectives' convention is called on the op's
#: buffers: our algorithms, and a student's function of that collective
CALLS = {
    "all_reduce": lambda f, b, g: f(b["t"], "SUM", group=g.handle),
    "reduce": lambda f, b, g: f(b["t"], g.root, "SUM", group=g.handle),
    "broadcast": lambda f, b, g: f(b["t"], g.root, group=g.handle),
    "all_gather": lambda f, b, g: f(b["out"], b["in"], group=g.handle),
    "reduce_scatter": lambda f, b, g: f(b["out"], b["in"], "SUM", group=g.handle),
}


# ----------------------------------------------------------------- all_reduce, reduce
def _fill_rank(key: str = "t", clear: str = "") -> Callable:
    """An op's reset: `key` filled from base = the rank + 1, `clear` (if named) with -1."""
    def reset(b, g, pat):
        pat.fill(b[key], base=g.grank + 1)
        if clear:
            b[clear].fill_(-1)
    return reset


def _check_sum(b, g, pat):
    return pat.check(b["t"], base=_sum_ranks(g.n), scale=g.n)


def _root_only(check: Callable) -> Callable:
    """`check` on the group's root, where alone the result is defined."""
    return lambda b, g, pat: check(b, g, pat) if g.grank == 0 else None


ALL_REDUCE_OP = Op(
    "all_reduce", "all_reduce", 2.0, _empty("t"), _fill_rank(), _check_sum,
    {"torch": lambda b, g: dist.all_reduce(b["t"], group=g.handle),
     **_ours(ALL_REDUCE, CALLS["all_reduce"])})

REDUCE_OP = Op(
    "reduce", "reduce", 2.0, _empty("t"), _fill_rank(), _root_only(_check_sum),
    {"torch": lambda b, g: dist.reduce(b["t"], dst=g.root, group=g.handle),
     **_ours(REDUCE, CALLS["reduce"])})


# ------------------------------------------------------------------------- broadcast
def _fill_root(b, g, pat):
    """Broadcast's and ping-pong's reset: the root's `t` the pattern (its echo buffer `r`, where
    there is one, -1), every other rank's -1."""
    if g.grank == 0:
        pat.fill(b["t"], base=1)
        if "r" in b:
            b["r"].fill_(-1)
    else:
        b["t"].fill_(-1)


BROADCAST_OP = Op(
    "broadcast", "broadcast", 1.5, _empty("t"), _fill_root,
    lambda b, g, pat: pat.check(b["t"], base=1),
    {"torch": lambda b, g: dist.broadcast(b["t"], src=g.root, group=g.handle),
     **_ours(BROADCAST, CALLS["broadcast"])})


# --------------------------------------------------- reduce + broadcast (root update)
def _rb_reset(b, g, pat):
    # the assignment's values: parameters 1, each rank's gradient its rank (here + the pattern,
    # which catches a misplaced chunk)
    pat.fill(b["grad"], base=g.grank)
    b["param"].fill_(1)


def _rb_update(b, g):
    """The root averages the summed gradients and takes an SGD step (the assignment)."""
    if g.grank != 0:
        return
    if b["grad"].dtype.is_floating_point:
        b["grad"].div_(g.n)
        b["param"].add_(b["grad"], alpha=-LR)
    else:  # integer dtypes: floor-average and a unit step
        b["grad"].floor_divide_(g.n)
        b["param"].sub_(b["grad"])


def _rb_check(b, g, pat):
    # mean gradient = (n-1)/2 + pattern; at element 0 (pattern 0) the parameter is the assignment's
    # expected_param = 1 - LR (n-1)/2, checked as it does: allclose
    if b["param"].dtype.is_floating_point:
        return pat.check(b["param"], base=1 - LR * (g.n - 1) / 2, scale=-LR, what="param",
                         rtol=1e-5, atol=1e-6)
    return pat.check(b["param"], base=1 - (g.n - 1) // 2, scale=-1, what="param")


def _rb_impl(reduce: Callable, bcast: Callable) -> Callable:
    """The gradients reduced to the root, its update, the parameters broadcast from it."""
    def run(b, g):
        reduce(b["grad"], g.root, "SUM", group=g.handle)
        _rb_update(b, g)
        bcast(b["param"], g.root, group=g.handle)
    return run


# busbw factor 1, as for reduce and broadcast (nccl-tests has no composite; bytes = the tensor)
REDUCE_BROADCAST_OP = Op(
    "reduce_broadcast", "reduce", 3.0, _empty("grad", "param"), _rb_reset, _rb_check,
    {"torch": _rb_impl(lambda t, dst, op, group: dist.reduce(t, dst, group=group),
                       dist.broadcast),
     **{k: _rb_impl(REDUCE[k], BROADCAST[k]) for k in REDUCE if k != "torch" and k in BROADCAST}})


# ------------------------------------------------------------- send/recv in a ring
def _ring_check(b, g, pat):
    return pat.check(b["r"], base=(g.grank - 1) % g.n + 1, what="received")


def _ring_blocking(b, g):
    # blocking send/recv: even ranks send first, odd ranks receive first, so no cycle of ranks all
    # waiting to send (an odd ring has two even neighbours: 0 and n-1; rank 1 receives first and
    # breaks the cycle)
    if g.grank % 2 == 0:
        dist.send(b["t"], dst=g.peer(1), group=g.handle)
        dist.recv(b["r"], src=g.peer(-1), group=g.handle)
    else:
        dist.recv(b["r"], src=g.peer(-1), group=g.handle)
        dist.send(b["t"], dst=g.peer(1), group=g.handle)


def _ring_async(b, g):
    # isend + irecv both in flight. Posted as one batch: with nccl that is one NCCL group, so two
    # ranks sending to each other first cannot deadlock on one pair's stream; with gloo it is
    # exactly dist.isend + dist.irecv.
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, b["t"], g.peer(1), g.handle),
                                   dist.P2POp(dist.irecv, b["r"], g.peer(-1), g.handle)])
    for r in reqs:
        r.wait()


SEND_RECV_RING_OP = Op("send_recv_ring", "send_recv", 2.5, _empty("t", "r"),
                       _fill_rank("t", "r"), _ring_check, {"torch": _ring_blocking})
ISEND_IRECV_RING_OP = Op("isend_irecv_ring", "send_recv", 2.5, _empty("t", "r"),
                         _fill_rank("t", "r"), _ring_check, {"torch": _ring_async})


# ------------------------------------------------------- all_gather, reduce_scatter
def _ag_reset(b, g, pat):
    # piece i of the gathered array continues the pattern where piece i-1 stopped
    pat.fill(b["in"], base=g.grank + 1, off=g.grank * b["m"])
    b["out"].fill_(-1)


def _ag_check(b, g, pat):
    m = b["m"]
    for i in range(g.n):
        err = pat.check(b["out"][i * m:(i + 1) * m], base=i + 1, off=i * m, what=f"piece {i}")
        if err:
            return err
    return None


ALL_GATHER_OP = Op(
    "all_gather", "all_gather", 2.5, _pieces("in", "out"), _ag_reset, _ag_check,
    {"torch": lambda b, g: torch_support.all_gather_single(b["out"], b["in"], group=g.handle),
     **_ours(ALL_GATHER, CALLS["all_gather"])},
    full_array=True)

# the root is the group's first rank (g.root, a global rank); the others pass no output
GATHER_OP = Op(
    "gather", "gather", 2.5, _pieces("in", "out"), _ag_reset, _root_only(_ag_check),
    _ours(GATHER, lambda f, b, g: f(b["out"] if g.grank == 0 else None,
                                    b["in"], g.root, group=g.handle),
          skip=""),
    full_array=True)


REDUCE_SCATTER_OP = Op(
    "reduce_scatter", "reduce_scatter", 2.5, _pieces("out", "in"), _fill_rank("in", "out"),
    lambda b, g, pat: pat.check(b["out"], base=_sum_ranks(g.n), scale=g.n, off=g.grank * b["m"]),
    {"torch": lambda b, g: torch_support.reduce_scatter_single(b["out"], b["in"], group=g.handle),
     **_ours(REDUCE_SCATTER, CALLS["reduce_scatter"])},
    full_array=True)


# ------------------------------------------------------------------------ ping-pong
def _pp_run(b, g):
    # rank a sends, b echoes the same bytes back: the time is a round trip
    if g.grank == 0:
        dist.send(b["t"], dst=g.peer(1))
        dist.recv(b["r"], src=g.peer(1))
    else:
        dist.recv(b["t"], src=g.peer(1))
        dist.send(b["t"], dst=g.peer(1))


PING_PONG_OP = Op("ping_pong", "send_recv", 2.5, _empty("t", "r"), _fill_root,
                  lambda b, g, pat: pat.check(b["r"] if g.grank == 0 else b["t"], base=1, what="echo"),
                  {"torch": _pp_run}, pairwise=True)

# the benchmarked ops (bench.ops); their implementations come from ddp_lab.collectives' tables. The
# config's table (what the submitting side checks, without torch) must say the same.
OPS: Registry[Op] = Registry("bench.ops", {op.name: op for op in (
    ALL_REDUCE_OP, REDUCE_OP, BROADCAST_OP, REDUCE_BROADCAST_OP, SEND_RECV_RING_OP,
    ISEND_IRECV_RING_OP, ALL_GATHER_OP, GATHER_OP, REDUCE_SCATTER_OP, PING_PONG_OP)})
_HAVE = {n: tuple(op.impls) for n, op in OPS.items()}
if _HAVE != dict(config.OPS):
    raise RuntimeError("ddp_lab.bench.config.OPS lists other ops or implementations than "
                       f"ddp_lab.bench.ops.OPS: {_HAVE}")


def student_label(spec: str) -> str:
    """A student's implementation as the bench's tables and plots name it: the function's name
    (with its file's where it is a built-in's name)."""
    from ..config.student import spec_label, split_spec

    name = spec_label(spec)
    return name if name not in config.IMPLS else f"{Path(split_spec(spec)[0]).stem}.{name}"


def with_students(op: Op, impls: list[str]) -> Op:
    """`op` with the student's functions of `impls` (FILE.py:fn) that are its collective added,
    each named by `student_label`."""
    from ..collectives.student import as_registry_entry, one
    from ..config.student import find_functions, is_spec

    extra = {}
    for spec in impls:
        if not is_spec(spec) or op.name not in CALLS:
            continue
        found = find_functions(spec, "bench.impl")
        if len(found) != 1 or found[0].collective != op.name:
            continue
        fn, info, _ = one(spec, op.name, "bench.impl")
        extra[student_label(spec)] = partial(CALLS[op.name], as_registry_entry(fn, info))
    return replace(op, impls={**op.impls, **extra}) if extra else op
