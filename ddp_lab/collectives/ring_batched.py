"""The batched transport of the ring (schedule:
:mod:`~ddp_lab.collectives.ring_schedule`): each step one
:func:`torch.distributed.batch_isend_irecv` of this rank's send to
``r+1`` and receive from ``r-1``, so on nccl one group per step and no
deadlock. Runs ``all_reduce_ring`` (``sync=ring`` on nccl, the bench),
``reduce_scatter_ring`` and ``all_gather_ring`` (docs/collectives.md,
"Each step one batch, cut into pieces")."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from ..predict.costmodel import num_pipeline_chunks
from ._common import GroupInfo, combine_into, scratch
from .ring_schedule import Exchange

#: Default size of the pieces each ring step's message is cut into (see
#: p2p_pipelined).
DEFAULT_SEGMENT_BYTES = 1 << 21


def pieces(t: torch.Tensor, segment_bytes: int | None) -> list[torch.Tensor]:
    """``t`` (1-D) cut into the non-empty pieces of at most about
    ``segment_bytes`` that a pipelined ring step sends; both ends of a
    transfer compute the same cut from the size."""
    return [
        p
        for p in t.tensor_split(
            num_pipeline_chunks(t.numel(), t.element_size(), segment_bytes)
        )
        if p.numel()
    ]


def p2p_pipelined(
    info: GroupInfo,
    send: torch.Tensor,
    send_to: int,
    recv: torch.Tensor,
    recv_from: int,
    segment_bytes: int | None,
    on_piece: Callable[[int, int], None] | None = None,
) -> None:
    """One ring step: send ``send`` to ``send_to`` while receiving
    ``recv`` from ``recv_from``, both cut into the same
    ``segment_bytes`` pieces (``None``: whole) posted as one batch.
    ``on_piece(lo, hi)`` runs as ``recv[lo:hi]`` lands, in order, so
    reducing a piece overlaps the next one's transfer; where the backend
    coalesces the batch (nccl), after all of it."""
    send_pieces, recv_pieces = pieces(send, segment_bytes), pieces(
        recv, segment_bytes
    )
    # receives first: sends first, the two directions of a shaped link
    # took turns (docs/network.md, "The bench across the link")
    ops = [
        dist.P2POp(dist.irecv, t, info.peer(recv_from), info.group)
        for t in recv_pieces
    ]
    ops += [
        dist.P2POp(dist.isend, t, info.peer(send_to), info.group)
        for t in send_pieces
    ]
    if not ops:
        return
    works = dist.batch_isend_irecv(ops)
    bounds, lo = [], 0
    for t in recv_pieces:
        bounds.append((lo, lo + t.numel()))
        lo += t.numel()
    # one request per op (gloo): consume pieces as they land
    if len(works) == len(ops):
        for work, (lo, hi) in zip(works[: len(recv_pieces)], bounds):
            work.wait()
            if on_piece is not None:
                on_piece(lo, hi)
        for work in works[len(recv_pieces) :]:
            work.wait()
    else:
        # one request for the whole batch (nccl coalescing)
        for work in works:
            work.wait()
        if on_piece is not None:
            for lo, hi in bounds:
                on_piece(lo, hi)


def batched_exchange(
    info: GroupInfo,
    chunks: Sequence[torch.Tensor],
    op: str,
    *,
    out: torch.Tensor | None = None,
    segment_bytes: int | None = DEFAULT_SEGMENT_BYTES,
) -> Exchange:
    """The schedule's ``exchange`` over ``n`` contiguous 1-D ``chunks``
    (uneven, even empty), each step one batch. A reduce step receives
    into scratch and combines each piece as it lands; a copy step
    receives in place. ``out`` given (a reduce-scatter that must not
    touch ``chunks``): partials alternate between two scratch buffers
    (one may still be in flight) and the last reduce step writes into
    ``out``. AVG combines like SUM."""
    n, r = info.size, info.rank
    biggest = max(c.numel() for c in chunks)
    # chunk -> where this rank's partial of it is
    partial: dict[int, torch.Tensor] = {}

    def exchange(send_chunk: int, recv_chunk: int, reduce: bool) -> None:
        mine = chunks[recv_chunk]
        if not reduce:
            p2p_pipelined(
                info, chunks[send_chunk], r + 1, mine, r - 1, segment_bytes
            )
            return
        got = scratch(biggest, mine, slot=0)[: mine.numel()]
        if out is None:
            target = mine
        elif len(partial) == n - 2:  # the last reduce step
            target = out
        else:
            target = scratch(biggest, mine, slot=1 + len(partial) % 2)[
                : mine.numel()
            ]
        outgoing = partial.get(send_chunk, chunks[send_chunk])
        p2p_pipelined(
            info,
            outgoing,
            r + 1,
            got,
            r - 1,
            segment_bytes,
            lambda lo, hi: combine_into(
                target[lo:hi], mine[lo:hi], got[lo:hi], op
            ),
        )
        partial[recv_chunk] = target

    return exchange
