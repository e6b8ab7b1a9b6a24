"""All-reduce: every rank ends with ``op`` applied over all ranks'
tensors, bitwise identical on every rank (each element reduced once then
copied, or reduced symmetrically), which keeps data-parallel replicas in
lock-step. Costs: docs/collectives.md, "Algorithms and alpha-beta
costs"."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ._common import (
    AVG,
    check_op_dtype,
    combine_,
    flat_view,
    group_info,
    GroupInfo,
    normalize_op,
    OpLike,
    p2p,
    scratch,
    SUM,
)
from .broadcast import _bcast_linear, _bcast_tree
from .reduce import _reduce_linear, _reduce_tree
from .ring_optimised import batched_exchange, DEFAULT_SEGMENT_BYTES, schedule_all_reduce


def _prepare(tensor: torch.Tensor, op: OpLike, group: dist.ProcessGroup | None):
    op = normalize_op(op)
    check_op_dtype(op, tensor.dtype)
    info = group_info(group)
    if info is None or info.size == 1 or tensor.numel() == 0:
        return op, None
    return op, info


def _all_reduce_butterfly(info: GroupInfo, flat: torch.Tensor, op: str) -> None:
    n, r = info.size, info.rank
    # largest power of two <= n
    p = 1 << (n.bit_length() - 1)
    extra = n - p
    if r >= p:
        # Folded rank: hand the data to rank r-p, get the final result
        # back from it.
        p2p(info, sends=[(flat, r - p)])
        p2p(info, recvs=[(flat, r - p)])
        return
    buf = scratch(flat.numel(), flat, slot=3)
    if r < extra:
        p2p(info, recvs=[(buf, r + p)])
        combine_(flat, buf, op)
    mask = 1
    while mask < p:  # recursive doubling among ranks 0..p-1
        partner = r ^ mask
        p2p(info, sends=[(flat, partner)], recvs=[(buf, partner)])
        # a+b == b+a bitwise, so both partners agree
        combine_(flat, buf, op)
        mask <<= 1
    if op == AVG:
        flat.div_(n)
    if r < extra:
        p2p(info, sends=[(flat, r + p)])


def _all_reduce_ring(
    info: GroupInfo, flat: torch.Tensor, op: str, segment_bytes: int | None
) -> None:
    n = info.size
    # views; the first numel % n chunks are one longer
    chunks = flat.tensor_split(n)
    exchange = batched_exchange(info, chunks, op, segment_bytes=segment_bytes)
    # AVG: divide the one chunk this rank owns, once, before it is
    # replicated
    schedule_all_reduce(
        info.rank, n, exchange, (lambda c: chunks[c].div_(n)) if op == AVG else None
    )


def all_reduce_linear(
    tensor: torch.Tensor, op: OpLike = SUM, group: dist.ProcessGroup | None = None
) -> None:
    """Linear all-reduce, in place: :func:`reduce_linear` to group rank
    0, then :func:`broadcast_linear` from it; ``2(n-1)`` messages
    through rank 0's link. ``op``: SUM/PRODUCT/MAX/MIN/AVG (AVG = SUM,
    divide by ``n`` once on rank 0; float/complex only)."""
    op, info = _prepare(tensor, op, group)
    if info is None:
        return
    with flat_view(tensor) as flat:
        _reduce_linear(info, flat, 0, op)
        _bcast_linear(info, flat, 0)


def all_reduce_tree(
    tensor: torch.Tensor, op: OpLike = SUM, group: dist.ProcessGroup | None = None
) -> None:
    """Tree all-reduce, in place: binomial-tree reduce to group rank 0,
    then binomial-tree broadcast from it (``2 ceil(log2 n)`` rounds).
    Ops as in :func:`all_reduce_linear`."""
    op, info = _prepare(tensor, op, group)
    if info is None:
        return
    with flat_view(tensor) as flat:
        _reduce_tree(info, flat, 0, op, clobber=True)
        _bcast_tree(info, flat, 0)


def all_reduce_butterfly(
    tensor: torch.Tensor, op: OpLike = SUM, group: dist.ProcessGroup | None = None
) -> None:
    """Butterfly (recursive-doubling) all-reduce, in place, any ``n``:
    with ``p`` the largest power of two <= ``n``, ranks ``p..n-1`` fold
    into ``0..n-p-1``, ranks ``0..p-1`` exchange the whole tensor with
    ``rank XOR 2^k`` for ``log2 p`` rounds, the folded ranks get the
    result back. Latency-optimal for small tensors. Ops as in
    :func:`all_reduce_linear`."""
    op, info = _prepare(tensor, op, group)
    if info is None:
        return
    with flat_view(tensor) as flat:
        _all_reduce_butterfly(info, flat, op)


def all_reduce_ring(
    tensor: torch.Tensor,
    op: OpLike = SUM,
    group: dist.ProcessGroup | None = None,
    *,
    segment_bytes: int | None = DEFAULT_SEGMENT_BYTES,
) -> None:
    """Ring all-reduce (reduce-scatter + all-gather of ``n`` chunks), in
    place; bandwidth-optimal. The schedule is
    :mod:`~ddp_lab.collectives.ring_optimised`, each step one batch
    (``ring_optimised.py``) whose message is cut into ``segment_bytes``
    pieces (``None``: whole), each reduced as it lands. Ops as in
    :func:`all_reduce_linear` (AVG divides the owned chunk once, between
    the phases)."""
    op, info = _prepare(tensor, op, group)
    if info is None:
        return
    with flat_view(tensor) as flat:
        _all_reduce_ring(info, flat, op, segment_bytes)
