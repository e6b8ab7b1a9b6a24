"""Broadcast: copy ``tensor`` from one root rank to every rank of the group.

Cost notation used in the docstrings (alpha-beta model): ``n`` ranks, ``N`` bytes in
``tensor``, ``alpha`` = per-message latency, ``beta`` = seconds per byte on one link.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from ..measure.numbers import DEFAULT_RING_CHUNK_BYTES, num_pipeline_chunks
from ._common import GroupInfo, p2p, rooted


def _bcast_naive(info: GroupInfo, flat: torch.Tensor, root: int) -> None:
    if info.rank == root:
        p2p(info, sends=[(flat, r) for r in range(info.size) if r != root])
    else:
        p2p(info, recvs=[(flat, root)])


def _bcast_tree(info: GroupInfo, flat: torch.Tensor, root: int) -> None:
    n = info.size
    v = (info.rank - root) % n  # rank relative to the root: the root is v == 0

    def grank(u: int) -> int:
        return (u + root) % n

    # Receive once, from the parent: v minus its lowest set bit.
    mask = 1
    while mask < n:
        if v & mask:
            p2p(info, recvs=[(flat, grank(v - mask))])
            break
        mask <<= 1
    # Then forward to the children v + 2^k for every 2^k below that bit, largest
    # subtree first (for the root: every power of two below n).
    mask >>= 1
    while mask:
        if v + mask < n:
            p2p(info, sends=[(flat, grank(v + mask))])
        mask >>= 1


def _bcast_ring(info: GroupInfo, flat: torch.Tensor, root: int, chunk_bytes: int | None) -> None:
    n = info.size
    v = (info.rank - root) % n
    nxt, prv = info.rank + 1, info.rank - 1  # GroupInfo.peer takes these modulo n
    # Pipelining only pays off when some rank both receives and forwards (n > 2).
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


def broadcast_naive(
    tensor: torch.Tensor,
    src: int | None = None,
    group: dist.ProcessGroup | None = None,
    *,
    group_src: int | None = None,
) -> None:
    """Naive (flat) broadcast, in place: the root sends the whole tensor to each rank.

    The root posts ``n-1`` sends of ``N`` bytes at once and every other rank receives
    once. Cost: ``n-1`` messages serialised on the root's link, i.e. about
    ``(n-1)(alpha + N beta)``; bytes per rank: root sends ``(n-1)N``, others receive
    ``N``. ``src`` is a *global* rank as in :func:`torch.distributed.broadcast`; pass
    ``group_src=`` to name the root by its rank within ``group`` instead. Returns None;
    a process outside ``group`` returns immediately.
    """
    rooted(tensor, group, src, group_src, "src", False, _bcast_naive)


def broadcast_tree(
    tensor: torch.Tensor,
    src: int | None = None,
    group: dist.ProcessGroup | None = None,
    *,
    group_src: int | None = None,
) -> None:
    """Binomial-tree broadcast, in place: the set of ranks holding the data doubles each round.

    Relative to the root, rank ``v`` receives from ``v - lowbit(v)`` and forwards to
    ``v + 2^k`` for each ``2^k < lowbit(v)``, so there are ``ceil(log2 n)`` rounds and no
    barriers. Cost: ``ceil(log2 n)(alpha + N beta)``; bytes per rank: the root sends
    ``ceil(log2 n) N`` (the most), every non-root receives ``N``. Latency-optimal, good
    for small tensors. ``src``/``group_src`` as in :func:`broadcast_naive`. Returns None.
    """
    rooted(tensor, group, src, group_src, "src", False, _bcast_tree)


def broadcast_ring(
    tensor: torch.Tensor,
    src: int | None = None,
    group: dist.ProcessGroup | None = None,
    *,
    group_src: int | None = None,
    chunk_bytes: int | None = DEFAULT_RING_CHUNK_BYTES,
) -> None:
    """Pipelined ring broadcast, in place: data flows root -> root+1 -> ... -> root-1.

    The tensor is cut into ``k = ceil(N / chunk_bytes)`` pieces (uneven sizes allowed;
    ``chunk_bytes=None`` sends it whole, and with ``n <= 2`` it is never cut); each middle
    rank forwards piece ``i-1`` while receiving piece ``i`` in one paired step. Steps:
    ``n-2+k``, cost ``(n-2+k)(alpha + (N/k) beta)`` -> ``N beta`` for large tensors, so
    bandwidth is independent of ``n``. Bytes per rank: every rank but the last sends
    ``N``, every rank but the root receives ``N``. ``src``/``group_src`` as in
    :func:`broadcast_naive`. Returns None.
    """
    rooted(tensor, group, src, group_src, "src", False,
           lambda info, flat, root: _bcast_ring(info, flat, root, chunk_bytes))
