"""The ring all-reduce in one screen. Read this first;
ring_optimised.py holds the optimisations.

The ``n`` ranks stand in a ring: rank ``r`` sends only to ``r+1`` and
receives only from ``r-1`` (mod ``n``). Every rank cuts its tensor the
same way into ``n`` chunks. At step ``s`` rank ``r`` sends chunk ``r-s``
and receives chunk ``r-s-1``: the chunk one rank sends is the chunk the
next receives.

* Reduce-scatter, steps ``0..n-2``: the received chunk is *added* into
  this rank's copy. Chunk ``c`` leaves rank ``c`` at step 0 and gains
  one rank's data per step, so after ``n-1`` steps rank ``c-1`` holds
  its full sum: rank ``r`` owns chunk ``r+1``.
* All-gather, steps ``n-1..2n-3``: the same indices carry on, so each
  rank first sends the chunk it owns, then the one it has just received;
  it *copies* what arrives.

Every rank sends and receives ``2(n-1)`` chunks, ``2(n-1)/n`` of the
tensor whatever ``n``: the least any all-reduce can move
(``ddp_lab/predict/costmodel.py`` counts these bytes). Each chunk is
summed once, in one order, then copied, so every rank ends with the same
bits.

This is what ``sync=ring`` runs with ``sync.prepost=false`` on gloo. The
optimised transports run the same steps with the same bits
(docs/collectives.md, *Optimising the ring*, has the measured reason for
each, ``ring_optimised.py`` holds both): one posts a call's receives
during the call before (``sync.prepost=true``, gloo only); one posts
each step's send and receive as one batch, cut into pieces reduced as
they land (nccl needs the batch: a lone receive queued before a send to
the same peer would wait for ever).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def ring_steps(rank: int, n: int) -> list[tuple[int, int, bool]]:
    """Rank ``rank``'s ``2(n-1)`` steps: (chunk sent to rank+1, chunk
    received from rank-1, whether the received chunk is added
    (reduce-scatter) or copied (all-gather))."""
    return [
        ((rank - s) % n, (rank - s - 1) % n, s < n - 1)
        for s in range(2 * (n - 1))
    ]


def all_reduce_ring_textbook(
    tensor: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    landing: torch.Tensor | None = None,
) -> None:
    """Sum the contiguous ``tensor`` over the ranks of ``group`` (None:
    every rank) in place: the ring with plain isend/irecv, one step
    after the other. gloo; on nccl use ``all_reduce_ring`` (module
    docstring). ``landing``: where a chunk to add arrives, at least a
    chunk long (``numel / n`` rounded up), ``tensor``'s dtype; None:
    allocated for this call (``sync=ring`` keeps one, so that no step
    allocates it)."""
    rank, n = dist.get_rank(group), dist.get_world_size(group)
    # -1: this process is not in ``group``
    if rank < 0 or n == 1 or tensor.numel() == 0:
        return
    # isend/irecv name their peer by its global rank
    ranks = dist.get_process_group_ranks(
        dist.group.WORLD if group is None else group
    )
    to_next, from_prev = ranks[(rank + 1) % n], ranks[(rank - 1) % n]
    # the first numel % n are one element longer
    chunks = tensor.view(-1).tensor_split(n)
    if landing is None:  # (a copied chunk lands in place)
        # chunks[0] is the longest
        landing = torch.empty_like(chunks[0])
    for send_chunk, recv_chunk, add in ring_steps(rank, n):
        mine = chunks[recv_chunk]
        into = landing[: mine.numel()] if add else mine
        # the receive is posted before the send (docs/network.md: sends
        # first, a shaped link carried one direction at a time)
        incoming = dist.irecv(into, from_prev, group=group)
        outgoing = dist.isend(chunks[send_chunk], to_next, group=group)
        incoming.wait()
        # the chunk sent may be written in a later step
        outgoing.wait()
        if add:
            mine += into
