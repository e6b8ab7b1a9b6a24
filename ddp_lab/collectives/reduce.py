"""Reduce: combine ``tensor`` from every rank with ``op``; only the root
gets the result. Costs: docs/collectives.md, "Algorithms and alpha-beta
costs"."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ._common import (
    AVG,
    SUM,
    GroupInfo,
    OpLike,
    check_op_dtype,
    combine_,
    normalize_op,
    p2p,
    rooted,
    scratch,
)


def _reduce_linear(info: GroupInfo, flat: torch.Tensor, root: int, op: str) -> None:
    if info.rank != root:
        p2p(info, sends=[(flat, root)])
        return
    # Receive everything concurrently, then combine in group-rank order
    # so the result does not depend on which message arrived first.
    bufs = [(r, torch.empty_like(flat)) for r in range(info.size) if r != root]
    p2p(info, recvs=[(buf, r) for r, buf in bufs])
    for _, buf in bufs:
        combine_(flat, buf, op)
    if op == AVG:
        flat.div_(info.size)


def _reduce_tree(info: GroupInfo, flat: torch.Tensor, root: int, op: str, *, clobber: bool) -> None:
    """Binomial-tree reduce. With ``clobber`` inner nodes accumulate
    into ``flat`` itself (fine when a broadcast will overwrite it
    anyway); otherwise into a private copy."""
    n = info.size
    v = (info.rank - root) % n
    acc = flat
    buf = None
    mask = 1
    while mask < n:
        # hand the partial result to the parent and stop
        if v & mask:
            p2p(info, sends=[(acc, (v - mask + root) % n)])
            return
        child = v + mask
        if child < n:
            if buf is None:
                buf = scratch(flat.numel(), flat, slot=3)
            p2p(info, recvs=[(buf, (child + root) % n)])
            if acc is flat and v != 0 and not clobber:
                acc = flat.clone()
            combine_(acc, buf, op)
        mask <<= 1
    # Only the root (v == 0) gets here.
    if op == AVG:
        flat.div_(n)


def reduce_linear(
    tensor: torch.Tensor,
    dst: int | None = None,
    op: OpLike = SUM,
    group: dist.ProcessGroup | None = None,
    *,
    group_dst: int | None = None,
) -> None:
    """Naive (flat) reduce, in place on the root: it posts ``n-1``
    receives at once and combines them in rank order. ``op``:
    SUM/PRODUCT/MAX/MIN/AVG (AVG = SUM then divide on the root;
    float/complex only). ``dst`` is a *global* rank as in
    :func:`torch.distributed.reduce`, or give ``group_dst=``. Non-root
    tensors are unchanged."""
    op = normalize_op(op)
    check_op_dtype(op, tensor.dtype)
    rooted(
        tensor,
        group,
        dst,
        group_dst,
        "dst",
        True,
        lambda info, flat, root: _reduce_linear(info, flat, root, op),
    )


def reduce_tree(
    tensor: torch.Tensor,
    dst: int | None = None,
    op: OpLike = SUM,
    group: dist.ProcessGroup | None = None,
    *,
    group_dst: int | None = None,
) -> None:
    """Binomial-tree reduce, in place on the root, the mirror of
    :func:`broadcast_tree`: rank ``v`` combines its children's partials
    (smallest first) into a scratch copy and sends it to ``v -
    lowbit(v)``. Ops and ``dst``/``group_dst`` as in
    :func:`reduce_linear`."""
    op = normalize_op(op)
    check_op_dtype(op, tensor.dtype)
    rooted(
        tensor,
        group,
        dst,
        group_dst,
        "dst",
        True,
        lambda info, flat, root: _reduce_tree(info, flat, root, op, clobber=False),
    )
