"""Shared plumbing for the collectives: reduction ops, group
bookkeeping, point-to-point (private; the package ``__init__``
re-exports the public names)."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Union

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

# Canonical op names; callers may also pass any case or a ``ReduceOp``
# (docs/collectives.md)
SUM = "SUM"
PRODUCT = "PRODUCT"
MAX = "MAX"
MIN = "MIN"
AVG = "AVG"
SUPPORTED_OPS: tuple[str, ...] = (SUM, PRODUCT, MAX, MIN, AVG)

#: What the ``op=`` arguments accept.
OpLike = Union[str, ReduceOp, ReduceOp.RedOpType]


def normalize_op(op: object) -> str:
    """Return the canonical name (``"SUM"``, ...) of a reduction op, or
    raise ValueError."""
    name = None
    if not isinstance(op, ReduceOp.RedOpType) and isinstance(op, ReduceOp):
        # ReduceOp(ReduceOp.SUM) wraps the enum value; unwrap it
        op = op.op
    if isinstance(op, ReduceOp.RedOpType):
        name = op.name
    elif isinstance(op, str):
        name = op.upper()
    if name not in SUPPORTED_OPS:
        raise ValueError(
            f"unsupported reduction op {op!r}; supported ops are "
            f"{', '.join(SUPPORTED_OPS)} (as torch.distributed.ReduceOp values or names)"
        )
    return name


def check_op_dtype(op: str, dtype: torch.dtype) -> None:
    """AVG is SUM followed by a division, which only makes sense for
    float/complex tensors."""
    if op == AVG and not (dtype.is_floating_point or dtype.is_complex):
        raise ValueError(
            f"op AVG needs a floating-point or complex tensor, got {dtype}; "
            "use SUM and divide (with the rounding you want) instead"
        )


# AVG combines like SUM (divided once at the end)
_COMBINE = {
    SUM: torch.add,
    AVG: torch.add,
    PRODUCT: torch.mul,
    MAX: torch.maximum,
    MIN: torch.minimum,
}


def combine_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, op: str) -> None:
    """``out = a (op) b`` without touching ``a`` or ``b`` (``out`` may
    alias ``a``)."""
    _COMBINE[op](a, b, out=out)


def combine_(acc: torch.Tensor, other: torch.Tensor, op: str) -> None:
    """``acc = acc (op) other`` in place."""
    _COMBINE[op](acc, other, out=acc)


@dataclass(frozen=True)
class GroupInfo:
    """This process's view of a process group: ``rank``/``size``
    group-local, ``ranks[i]`` the global rank of group rank ``i`` (what
    point-to-point calls need)."""

    group: dist.ProcessGroup | None
    rank: int
    size: int
    ranks: tuple[int, ...]

    def peer(self, group_rank: int) -> int:
        """Global rank of group rank ``group_rank`` (taken modulo the
        group size)."""
        return self.ranks[group_rank % self.size]


def group_info(group: dist.ProcessGroup | None) -> GroupInfo | None:
    """Describe ``group`` (None = default group); None if this process
    is not a member."""
    if not dist.is_initialized():
        raise RuntimeError(
            "torch.distributed is not initialised; call dist.init_process_group() first"
        )
    rank = dist.get_rank(group)
    # torch returns -1 for processes outside ``group``
    if rank < 0:
        return None
    size = dist.get_world_size(group)
    if group is None or group is dist.GroupMember.WORLD:
        ranks = tuple(range(size))
    else:
        # Same as [dist.get_global_rank(group, r) for r in range(size)],
        # in O(size).
        ranks = tuple(dist.get_process_group_ranks(group))
    return GroupInfo(group, rank, size, ranks)


def resolve_root(info: GroupInfo, root: int | None, group_root: int | None, name: str) -> int:
    """Group-local rank of the root, from its global rank
    (``src``/``dst``, as in ``torch.distributed``) or its group rank
    (``group_src``/``group_dst``)."""
    if (root is None) == (group_root is None):
        raise ValueError(f"pass exactly one of {name}= (global rank) or group_{name}= (group rank)")
    if group_root is not None:
        if not 0 <= group_root < info.size:
            raise ValueError(
                f"group_{name}={group_root} out of range for a group of size {info.size}"
            )
        return group_root
    try:
        return info.ranks.index(root)
    except ValueError:
        raise ValueError(
            f"{name}={root} is not a member of the group (its global ranks are {list(info.ranks)})"
        ) from None


def p2p(
    info: GroupInfo,
    sends: Sequence[tuple[torch.Tensor, int]] = (),
    recvs: Sequence[tuple[torch.Tensor, int]] = (),
) -> None:
    """Post ``sends``/``recvs`` (``(tensor, group_rank)`` pairs) as ONE
    :func:`torch.distributed.batch_isend_irecv` and wait for all: on
    nccl one group, so exchanges cannot deadlock. Zero-element tensors
    are skipped (both ends agree on sizes)."""
    # receives first, as the ring's (ring_optimised.py's p2p_pipelined
    # says why)
    ops = [dist.P2POp(dist.irecv, t, info.peer(r), info.group) for t, r in recvs if t.numel()]
    ops += [dist.P2POp(dist.isend, t, info.peer(r), info.group) for t, r in sends if t.numel()]
    if not ops:
        return
    for work in dist.batch_isend_irecv(ops):
        work.wait()


_scratch = threading.local()


def scratch(numel: int, like: torch.Tensor, slot: int = 0) -> torch.Tensor:
    """A reusable 1-D buffer of ``numel`` elements with ``like``'s dtype
    and device, cached per thread, (device, dtype, slot), only ever
    growing: a fresh ``torch.empty`` of many MB costs page faults on CPU
    each call. Never hold two live buffers of one slot."""
    cache = getattr(_scratch, "buffers", None)
    if cache is None:
        cache = _scratch.buffers = {}
    key = (like.device, like.dtype, slot)
    buf = cache.get(key)
    if buf is None or buf.numel() < numel:
        buf = cache[key] = torch.empty(numel, dtype=like.dtype, device=like.device)
    return buf[:numel]


def clear_scratch() -> None:
    """Drop this thread's cached scratch buffers (see
    :func:`scratch`)."""
    _scratch.buffers = {}


@contextlib.contextmanager
def flat_view(t: torch.Tensor, *, writeback: bool = True) -> Iterator[torch.Tensor]:
    """A contiguous 1-D view of ``t``; for a non-contiguous ``t`` a
    copy, written back on normal exit when ``writeback``, so callers
    always work "in place" on it."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(t).__name__}")
    if t.is_contiguous():
        yield t.view(-1)
    else:
        tmp = t.contiguous()
        yield tmp.view(-1)
        if writeback:
            t.copy_(tmp.view(t.shape))


def rooted(
    tensor: torch.Tensor,
    group: dist.ProcessGroup | None,
    root: int | None,
    group_root: int | None,
    name: str,
    result_on_root: bool,
    body: Callable[[GroupInfo, torch.Tensor, int], None],
) -> None:
    """The frame every rooted collective (broadcast, reduce) shares:
    resolve the group and the root, skip when there is nothing to do
    (not a member, one rank, empty tensor), and run ``body(info, flat,
    root)`` on a flat view written back where the result lands (the root
    for a reduce, every other rank for a broadcast)."""
    info = group_info(group)
    if info is None:
        return
    r = resolve_root(info, root, group_root, name)
    if info.size == 1 or tensor.numel() == 0:
        return
    with flat_view(tensor, writeback=(info.rank == r) == result_on_root) as flat:
        body(info, flat, r)
