"""The ring all-reduce as a schedule. Read this file first; the rest of the ring only moves bytes.

The ``n`` ranks stand in a ring: rank ``r`` sends only to ``r+1`` and receives only from
``r-1`` (mod ``n``). Each rank cuts its tensor the same way into ``n`` chunks, numbered
``0..n-1``. At every step each rank calls ``exchange(send, recv, reduce)`` once: send chunk
``send`` to ``r+1`` while receiving chunk ``recv`` from ``r-1``. Rank ``r``'s step ``s``
pairs with rank ``r+1``'s step ``s``: the chunk one sends is the chunk the next receives.

* Reduce-scatter, ``n-1`` steps: rank ``r`` sends chunk ``r-s`` and adds the chunk
  ``r-1-s`` it receives into its own copy. Chunk ``c`` leaves rank ``c`` at step 0 and
  gains one rank's data per step, so after ``n-1`` steps rank ``c-1`` holds its full sum:
  rank ``r`` owns chunk ``r+1``.
* All-gather, ``n-1`` steps: rank ``r`` sends chunk ``r+1-s`` (the one it owns, then the
  one it has just received) and writes the chunk ``r-s`` it receives over its own copy.

Every rank sends and receives ``2(n-1)`` chunks, ``2(n-1)/n`` of the tensor, whatever ``n``
(``ddp_lab/measure/costmodel.py`` counts exactly these). Each chunk is summed once, in one order,
then copied, so every rank ends with the same bits. ``shift`` moves every index: with
``shift=0`` (``reduce_scatter_ring``, ``all_gather_ring``) rank ``r`` owns chunk ``r``.

Two transports carry out the same steps: ``_ring.py`` posts each step's receive with its
send (``batch_isend_irecv``: gloo and nccl); ``persistent.py`` posts all of a call's
receives during the call before (gloo, the default for ``sync=ring``).
"""

from __future__ import annotations

from collections.abc import Callable

#: ``exchange(send, recv, reduce)``: one step of this rank. Send chunk ``send`` to rank+1,
#: receive chunk ``recv`` from rank-1, add it into this rank's chunk ``recv`` (``reduce``
#: true) or write it over it (false).
Exchange = Callable[[int, int, bool], None]


def ring_reduce_scatter(rank: int, n: int, exchange: Exchange, shift: int = 1) -> int:
    """``n-1`` steps; returns the chunk this rank then holds fully reduced."""
    for s in range(n - 1):
        exchange((rank + shift - 1 - s) % n, (rank + shift - 2 - s) % n, True)
    return (rank + shift) % n


def ring_all_gather(rank: int, n: int, exchange: Exchange, shift: int = 1) -> None:
    """``n-1`` steps, from this rank holding chunk ``rank+shift`` to it holding them all."""
    for s in range(n - 1):
        exchange((rank + shift - s) % n, (rank + shift - 1 - s) % n, False)


def ring_all_reduce(rank: int, n: int, exchange: Exchange,
                    owned: Callable[[int], None] | None = None) -> None:
    """The ``2(n-1)`` steps of a ring all-reduce. ``owned(chunk)`` runs between the phases
    on the one chunk this rank has fully reduced (AVG divides it there: 1/n of the data)."""
    chunk = ring_reduce_scatter(rank, n, exchange)
    if owned is not None:
        owned(chunk)
    ring_all_gather(rank, n, exchange)
