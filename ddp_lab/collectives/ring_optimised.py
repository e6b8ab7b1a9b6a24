"""The ring's optimised transports and the schedule they share: each
step a call ``exchange(send_chunk, recv_chunk, reduce)`` that a
transport supplies (the batched one, ``batched_exchange``; the
pre-posted one, ``PrepostedRingAllReduce``), so one schedule serves
them all. Read ``ring.py`` first: the ring in one screen and why it is
correct (docs/collectives.md, *Optimising the ring*). Run alone
(``scatter_gather.py``), ``shift=0`` leaves rank ``r`` chunk ``r``, as
torch's reduce_scatter does; the all-reduce's ``shift=1`` leaves it
chunk ``r+1``, as ``ring_steps``."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist

from ..predict.costmodel import num_pipeline_chunks
from ._common import (
    AVG,
    check_op_dtype,
    combine_,
    combine_into,
    flat_view,
    group_info,
    GroupInfo,
    normalize_op,
    OpLike,
    scratch,
    SUM,
)
from .ring import ring_steps

#: one step of this rank: send chunk ``send_chunk`` to rank+1, receive
#: chunk ``recv_chunk`` from rank-1 and add it into (``reduce``) or
#: write it over this rank's copy
Exchange = Callable[[int, int, bool], None]


def schedule_reduce_scatter(rank: int, n: int, exchange: Exchange, shift: int = 1) -> int:
    """``n-1`` steps; returns the chunk this rank then holds fully
    reduced."""
    for s in range(n - 1):
        exchange((rank + shift - 1 - s) % n, (rank + shift - 2 - s) % n, True)
    return (rank + shift) % n


def schedule_all_gather(rank: int, n: int, exchange: Exchange, shift: int = 1) -> None:
    """``n-1`` steps, from this rank holding chunk ``rank+shift`` to it
    holding them all."""
    for s in range(n - 1):
        exchange((rank + shift - s) % n, (rank + shift - 1 - s) % n, False)


def schedule_all_reduce(
    rank: int, n: int, exchange: Exchange, owned: Callable[[int], None] | None = None
) -> None:
    """The ``2(n-1)`` steps of a ring all-reduce (``ring.ring_steps``).
    ``owned(chunk)`` runs between the phases on the one chunk this rank
    has fully reduced (AVG divides it there: 1/n of the data)."""
    for s, (send_chunk, recv_chunk, reduce) in enumerate(ring_steps(rank, n)):
        if s == n - 1 and owned is not None:
            owned((rank + 1) % n)
        exchange(send_chunk, recv_chunk, reduce)


# The batched transport of the ring (the schedule above): each step one
# :func:`torch.distributed.batch_isend_irecv` of this rank's send to
# ``r+1`` and receive from ``r-1``, so on nccl one group per step and no
# deadlock. Runs ``all_reduce_ring`` (``sync=ring`` on nccl, the bench),
# ``reduce_scatter_ring`` and ``all_gather_ring`` (docs/collectives.md,
# "Each step one batch, cut into pieces").

#: Default size of the pieces each ring step's message is cut into (see
#: p2p_pipelined).
DEFAULT_SEGMENT_BYTES = 1 << 21


def pieces(t: torch.Tensor, segment_bytes: int | None) -> list[torch.Tensor]:
    """``t`` (1-D) cut into the non-empty pieces of at most about
    ``segment_bytes`` that a pipelined ring step sends; both ends of a
    transfer compute the same cut from the size."""
    return [
        p
        for p in t.tensor_split(num_pipeline_chunks(t.numel(), t.element_size(), segment_bytes))
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
    send_pieces, recv_pieces = pieces(send, segment_bytes), pieces(recv, segment_bytes)
    # receives first: sends first, the two directions of a shaped link
    # took turns (docs/network.md, "The bench across the link")
    ops = [dist.P2POp(dist.irecv, t, info.peer(recv_from), info.group) for t in recv_pieces]
    ops += [dist.P2POp(dist.isend, t, info.peer(send_to), info.group) for t in send_pieces]
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
            p2p_pipelined(info, chunks[send_chunk], r + 1, mine, r - 1, segment_bytes)
            return
        got = scratch(biggest, mine, slot=0)[: mine.numel()]
        if out is None:
            target = mine
        elif len(partial) == n - 2:  # the last reduce step
            target = out
        else:
            target = scratch(biggest, mine, slot=1 + len(partial) % 2)[: mine.numel()]
        outgoing = partial.get(send_chunk, chunks[send_chunk])
        p2p_pipelined(
            info,
            outgoing,
            r + 1,
            got,
            r - 1,
            segment_bytes,
            lambda lo, hi: combine_into(target[lo:hi], mine[lo:hi], got[lo:hi], op),
        )
        partial[recv_chunk] = target

    return exchange


# The pre-posted ring: :func:`all_reduce_ring`'s schedule with every
# receive of a call posted during the call before (docs/collectives.md,
# "Receives posted a call ahead").

#: Tags of persistent plans start here (plain send/recv defaults to tag
#: 0).
TAG_BASE = 0x5249_0000


class PlanTags:
    """The message tags of plans that live at the same time (a
    synchroniser's, one per bucket): each new plan's tag is one no
    earlier plan of these tags used, the same on every rank of its
    group."""

    def __init__(self) -> None:
        self.next = TAG_BASE

    def agree(self, group: dist.ProcessGroup | None) -> int:
        proposal = torch.tensor([self.next], dtype=torch.int64)
        dist.all_reduce(proposal, op=dist.ReduceOp.MAX, group=group)
        tag = int(proposal.item())
        self.next = tag + 1
        return tag


def preposted_plans(
    wires: list[torch.Tensor], group: dist.ProcessGroup | None = None
) -> dict[int, "PrepostedRingAllReduce"]:
    """Collective: one plan per tensor of ``wires``, found by its address
    (a bucket's buffer never moves), their tags from one ``PlanTags``."""
    tags = PlanTags()
    return {w.data_ptr(): PrepostedRingAllReduce(w, group=group, tags=tags) for w in wires}


class PrepostedRingAllReduce:
    """A ring all-reduce for one tensor shape, callable many times,
    receives pre-posted.

    ``plan = PrepostedRingAllReduce(like, op, group)`` (collective);
    ``plan(tensor)`` reduces any tensor with ``like``'s numel, dtype and
    device in place, as ``all_reduce_ring``; ``plan.close()``
    (collective) when done, or use it as a context manager. Outside
    ``group``, or in a group of one, calls return at once. Plans alive
    at the same time on one group take their tags from one ``tags``
    (``preposted_plans``)."""

    def __init__(
        self,
        like: torch.Tensor,
        op: OpLike = SUM,
        group: dist.ProcessGroup | None = None,
        *,
        segment_bytes: int | None = DEFAULT_SEGMENT_BYTES,
        tags: PlanTags | None = None,
    ) -> None:
        self.op = normalize_op(op)
        check_op_dtype(self.op, like.dtype)
        self.numel, self.dtype, self.device = (like.numel(), like.dtype, like.device)
        self.info = info = group_info(group)
        self._active = info is not None and info.size > 1 and self.numel > 0
        self._posted: list[list[dist.Work]] | None = None
        self._broken: BaseException | None = None
        if not self._active:
            return
        backend = dist.get_backend(group)
        if backend != "gloo" or like.device.type != "cpu":
            raise ValueError(
                f"PrepostedRingAllReduce needs a gloo group and CPU tensors (got backend "
                f"{backend!r}, device {like.device}); use all_reduce_ring, whose grouped "
                "sends and receives are what nccl needs"
            )
        n, r = info.size, info.rank
        self.tag = (tags or PlanTags()).agree(group)
        self.segment_bytes = segment_bytes
        self.sizes = [c.numel() for c in torch.empty(self.numel, device="meta").tensor_split(n)]
        # The schedule's steps, (chunk sent, chunk received), recorded
        # once: one receive buffer per step, and close() sends what the
        # next rank's receives expect.
        steps = [(send_chunk, recv_chunk) for send_chunk, recv_chunk, _ in ring_steps(r, n)]
        self._sends = [send_chunk for send_chunk, _ in steps]
        self._recv = torch.empty(sum(self.sizes[c] for _, c in steps), dtype=self.dtype)
        self._recv_steps: list[list[torch.Tensor]] = []
        lo = 0
        for _, c in steps:
            self._recv_steps.append(pieces(self._recv[lo : lo + self.sizes[c]], segment_bytes))
            lo += self.sizes[c]
        self.to_next, self.from_prev = info.peer(r + 1), info.peer(r - 1)
        # during a call: the tensor's n chunks
        self._chunks: tuple[torch.Tensor, ...] = ()
        # during a call: the index of the next step
        self._step = 0

    # -------------------------------------------------------------- plumbing
    def _post_receives(self) -> None:
        """Post every receive of one call, in step order: a ring link
        delivers in order, and gloo matches a peer's messages of one tag
        to receives first-in first-out."""
        group, tag, src = self.info.group, self.tag, self.from_prev
        self._posted = [
            [dist.irecv(p, src, group=group, tag=tag) for p in step] for step in self._recv_steps
        ]

    def _send(self, t: torch.Tensor) -> list[dist.Work]:
        return [
            dist.isend(p, self.to_next, group=self.info.group, tag=self.tag)
            for p in pieces(t, self.segment_bytes)
        ]

    def _check(self, tensor: torch.Tensor) -> None:
        if self._broken is not None:
            raise RuntimeError(
                "this PrepostedRingAllReduce failed in an earlier call "
                f"({type(self._broken).__name__}: {self._broken}); build a new one"
            )
        if (tensor.numel(), tensor.dtype, tensor.device) != (self.numel, self.dtype, self.device):
            raise ValueError(
                f"this plan all-reduces {self.numel} elements of {self.dtype} on {self.device}, "
                f"got {tensor.numel()} of {tensor.dtype} on {tensor.device}; build one plan "
                "per tensor shape"
            )

    # ------------------------------------------------------------------ calls
    def __call__(self, tensor: torch.Tensor) -> None:
        self._check(tensor)
        if not self._active:
            return
        try:
            # first call, or first after close()
            if self._posted is None:
                self._post_receives()
            with flat_view(tensor) as flat:
                self._chunks, self._step = flat.tensor_split(self.info.size), 0
                schedule_all_reduce(
                    self.info.rank,
                    self.info.size,
                    self._exchange,
                    self._divide if self.op == AVG else None,
                )
                self._chunks = ()
            # the next call's, while this rank computes
            self._post_receives()
        except BaseException as e:
            self._broken, self._posted = e, None
            raise

    def _exchange(self, send_chunk: int, recv_chunk: int, reduce: bool) -> None:
        """The schedule's step: send chunk ``send_chunk`` and take chunk
        ``recv_chunk`` piece by piece from the receives posted a call
        ago, adding it into (``reduce``) or copying it over this rank's
        copy."""
        chunks, step = self._chunks, self._step
        sends = self._send(chunks[send_chunk])
        mine, lo = chunks[recv_chunk], 0
        for work, got in zip(self._posted[step], self._recv_steps[step]):
            work.wait()
            hi = lo + got.numel()
            if reduce:
                combine_(mine[lo:hi], got, self.op)
            else:
                mine[lo:hi].copy_(got)
            lo = hi
        # a sent chunk is written later, or by the caller once we return
        for w in sends:
            w.wait()
        self._step = step + 1

    # AVG: the owned chunk, between the phases
    def _divide(self, chunk: int) -> None:
        self._chunks[chunk].div_(self.info.size)

    def close(self) -> None:
        """Collective: answer every pre-posted receive with a throw-away
        message (the sizes the next rank expects, in its order) and
        wait, so nothing stays in flight. The plan stays usable: the
        next call posts its receives again."""
        if not self._active or self._posted is None:
            return
        posted, self._posted = self._posted, None
        filler = torch.zeros(max(self.sizes), dtype=self.dtype)
        sends = []
        # exactly what the next rank's receives expect
        for c in self._sends:
            sends += self._send(filler[: self.sizes[c]])
        for w in [w for step in posted for w in step] + sends:
            w.wait()

    def __enter__(self) -> "PrepostedRingAllReduce":
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
