"""The two ring phases shared by ring all-reduce, reduce-scatter and all-gather.

Both work on a list of ``n`` contiguous 1-D chunks (views, uneven sizes allowed, even
empty ones). Rank ``r`` sends to ``r+1`` and receives from ``r-1``; each step is one
batch of paired sends/recvs (:func:`~ddp_lab.collectives._common.p2p_pipelined`), so
there is no barrier and no deadlock, and chunk ``c`` always has the same size on both
ends.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from ._common import GroupInfo, combine_, combine_into, p2p_pipelined, scratch


#: Default size of the pieces each ring step's message is cut into (see p2p_pipelined).
DEFAULT_SEGMENT_BYTES = 1 << 21


def ring_reduce_scatter(
    info: GroupInfo,
    chunks: Sequence[torch.Tensor],
    op: str,
    *,
    shift: int,
    out: torch.Tensor | None = None,
    segment_bytes: int | None = DEFAULT_SEGMENT_BYTES,
) -> torch.Tensor:
    """``n-1`` steps after which this rank holds the reduction of chunk ``(rank+shift) % n``.

    At step ``s`` rank ``r`` sends its running partial of chunk ``r+shift-1-s`` and
    receives the partial of chunk ``r+shift-2-s``, which it combines with its own copy
    piece by piece as the pieces arrive.

    * ``out is None``: in place -- partials accumulate in ``chunks`` themselves (chunks
      other than the owned one end up holding partial results); returns the owned chunk.
    * ``out`` given: ``chunks`` are only read; partials live in two alternating scratch
      buffers (a step writes pieces while the previous partial may still be in flight)
      and the last step writes the result straight into ``out`` (which may alias the
      owned chunk); returns ``out``.

    AVG is combined like SUM; the caller divides.
    """
    n, r = info.size, info.rank
    biggest = max(c.numel() for c in chunks)
    proto = chunks[0]
    recv_buf = scratch(biggest, proto, slot=0)
    acc_bufs = () if out is None else (scratch(biggest, proto, 1), scratch(biggest, proto, 2))
    to_send = chunks[(r + shift - 1) % n]
    for s in range(n - 1):
        mine = chunks[(r + shift - 2 - s) % n]
        incoming = recv_buf[: mine.numel()]
        if out is None:
            target = mine

            def on_piece(lo: int, hi: int) -> None:
                combine_(mine[lo:hi], incoming[lo:hi], op)
        else:
            target = out if s == n - 2 else acc_bufs[s % 2][: mine.numel()]

            def on_piece(lo: int, hi: int) -> None:
                combine_into(target[lo:hi], mine[lo:hi], incoming[lo:hi], op)

        p2p_pipelined(info, to_send, r + 1, incoming, r - 1, segment_bytes, on_piece)
        to_send = target
    return to_send if n > 1 else chunks[(r + shift) % n]


def ring_all_gather(
    info: GroupInfo,
    chunks: Sequence[torch.Tensor],
    *,
    shift: int,
    segment_bytes: int | None = DEFAULT_SEGMENT_BYTES,
) -> None:
    """``n-1`` steps after which every chunk holds its owner's data.

    Rank ``r`` starts with chunk ``(r+shift) % n`` filled; at step ``s`` it sends chunk
    ``r+shift-s`` (its own, then whatever it received last) and receives chunk
    ``r+shift-s-1`` directly into place -- no scratch buffers, no copies.
    """
    n, r = info.size, info.rank
    for s in range(n - 1):
        p2p_pipelined(info, chunks[(r + shift - s) % n], r + 1,
                      chunks[(r + shift - s - 1) % n], r - 1, segment_bytes)
