"""The ring's schedule for the optimised transports: each step a call
``exchange(send_chunk, recv_chunk, reduce)`` that a transport supplies
(``ring_batched.py``, ``ring_preposted.py``), so one schedule serves
them all. Read ``ring.py`` first: the ring in one screen and why it is
correct (docs/collectives.md, *Optimising the ring*). Run alone
(``scatter_gather.py``), ``shift=0`` leaves rank ``r`` chunk ``r``, as
torch's reduce_scatter does; the all-reduce's ``shift=1`` leaves it
chunk ``r+1``, as ``ring_steps``."""

from __future__ import annotations

from collections.abc import Callable

from .ring import ring_steps

#: one step of this rank: send chunk ``send_chunk`` to rank+1, receive
#: chunk ``recv_chunk`` from rank-1 and add it into (``reduce``) or
#: write it over this rank's copy
Exchange = Callable[[int, int, bool], None]


def schedule_reduce_scatter(
    rank: int, n: int, exchange: Exchange, shift: int = 1
) -> int:
    """``n-1`` steps; returns the chunk this rank then holds fully
    reduced."""
    for s in range(n - 1):
        exchange((rank + shift - 1 - s) % n, (rank + shift - 2 - s) % n, True)
    return (rank + shift) % n


def schedule_all_gather(
    rank: int, n: int, exchange: Exchange, shift: int = 1
) -> None:
    """``n-1`` steps, from this rank holding chunk ``rank+shift`` to it
    holding them all."""
    for s in range(n - 1):
        exchange((rank + shift - s) % n, (rank + shift - 1 - s) % n, False)


def schedule_all_reduce(
    rank: int,
    n: int,
    exchange: Exchange,
    owned: Callable[[int], None] | None = None,
) -> None:
    """The ``2(n-1)`` steps of a ring all-reduce (``ring.ring_steps``).
    ``owned(chunk)`` runs between the phases on the one chunk this rank
    has fully reduced (AVG divides it there: 1/n of the data)."""
    for s, (send_chunk, recv_chunk, reduce) in enumerate(ring_steps(rank, n)):
        if s == n - 1 and owned is not None:
            owned((rank + 1) % n)
        exchange(send_chunk, recv_chunk, reduce)
