"""Broadcast: copy ``tensor`` from one root rank to every rank of the
group. Costs (``n`` ranks, ``N`` bytes, alpha-beta):
docs/collectives.md, "Algorithms and alpha-beta costs"."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..predict.costmodel import DEFAULT_RING_CHUNK_BYTES, num_pipeline_chunks
from ._common import GroupInfo, p2p, rooted


def _bcast_linear(info: GroupInfo, flat: torch.Tensor, root: int) -> None:
    if info.rank == root:
        p2p(info, sends=[(flat, r) for r in range(info.size) if r != root])
    else:
        p2p(info, recvs=[(flat, root)])


def _bcast_tree(info: GroupInfo, flat: torch.Tensor, root: int) -> None:
    n = info.size
    # rank relative to the root: the root is v == 0
    v = (info.rank - root) % n

    def grank(u: int) -> int:
        return (u + root) % n

    # Receive once, from the parent: v minus its lowest set bit.
    mask = 1
    while mask < n:
        if v & mask:
            p2p(info, recvs=[(flat, grank(v - mask))])
            break
        mask <<= 1
    # Then forward to the children v + 2^k for every 2^k below that bit,
    # largest subtree first (for the root: every power of two below n).
    mask >>= 1
    while mask:
        if v + mask < n:
            p2p(info, sends=[(flat, grank(v + mask))])
        mask >>= 1


def _bcast_ring(info: GroupInfo, flat: torch.Tensor, root: int, chunk_bytes: int | None) -> None:
    n = info.size
    v = (info.rank - root) % n
    # GroupInfo.peer takes these modulo n
    nxt, prv = info.rank + 1, info.rank - 1
    # Pipelining only pays off when some rank both receives and forwards
    # (n > 2).
    k = num_pipeline_chunks(flat.numel(), flat.element_size(), chunk_bytes) if n > 2 else 1
    pieces = flat.tensor_split(k)
    if v == 0:  # root: push the pieces down the ring
        for piece in pieces:
            p2p(info, sends=[(piece, nxt)])
    elif v == n - 1:  # tail: only receives
        for piece in pieces:
            p2p(info, recvs=[(piece, prv)])
    else:  # middle: forward piece i-1 while piece i arrives
        p2p(info, recvs=[(pieces[0], prv)])
        for i in range(1, k):
            p2p(info, sends=[(pieces[i - 1], nxt)], recvs=[(pieces[i], prv)])
        p2p(info, sends=[(pieces[-1], nxt)])


def broadcast_linear(
    tensor: torch.Tensor,
    src: int | None = None,
    group: dist.ProcessGroup | None = None,
    *,
    group_src: int | None = None,
) -> None:
    """Naive (flat) broadcast, in place: the root posts ``n-1`` sends of
    the whole tensor at once. ``src`` is a *global* rank as in
    :func:`torch.distributed.broadcast`; or name the root by its rank in
    ``group`` with ``group_src=``. A process outside ``group``
    returns."""
    rooted(tensor, group, src, group_src, "src", False, _bcast_linear)


def broadcast_tree(
    tensor: torch.Tensor,
    src: int | None = None,
    group: dist.ProcessGroup | None = None,
    *,
    group_src: int | None = None,
) -> None:
    """Binomial-tree broadcast, in place: relative to the root, rank
    ``v`` receives from ``v - lowbit(v)`` and forwards to ``v + 2^k``
    for each ``2^k < lowbit(v)`` (``ceil(log2 n)`` rounds).
    ``src``/``group_src`` as in :func:`broadcast_linear`."""
    rooted(tensor, group, src, group_src, "src", False, _bcast_tree)


def broadcast_ring(
    tensor: torch.Tensor,
    src: int | None = None,
    group: dist.ProcessGroup | None = None,
    *,
    group_src: int | None = None,
    chunk_bytes: int | None = DEFAULT_RING_CHUNK_BYTES,
) -> None:
    """Pipelined ring broadcast, in place: root -> root+1 -> ... ->
    root-1, the tensor cut into ``ceil(N / chunk_bytes)`` pieces
    (``None``: whole; never cut for ``n <= 2``), each middle rank
    forwarding piece ``i-1`` while receiving piece ``i``.
    ``src``/``group_src`` as in :func:`broadcast_linear`."""
    rooted(
        tensor,
        group,
        src,
        group_src,
        "src",
        False,
        lambda info, flat, root: _bcast_ring(info, flat, root, chunk_bytes),
    )
