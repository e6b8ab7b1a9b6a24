"""The pre-posted ring: :func:`all_reduce_ring`'s schedule with every
receive of a call posted during the call before (docs/collectives.md,
"Receives posted a call ahead").

Why: gloo's TCP sends rendezvous, so a send whose receive is not yet
posted waits for the peer's notice and leaves from gloo's event-loop
thread; ranks reach the all-reduce a little apart, so every ring step
paid that round trip. A plan, built once per tensor shape as MPI's
persistent requests, posts the *next* call's receives at the end of each
call. Same steps, bytes and bits as :func:`all_reduce_ring`. Receive
buffers take ``2(n-1)/n`` of the tensor (the all-gather cannot receive
in place a call ahead); the plan's messages carry a tag the group agrees
on; building, calling and ``close()`` are collective. gloo and CPU only:
on nccl a receive posted ahead would block the stream behind it."""

from __future__ import annotations

import itertools

import torch
import torch.distributed as dist

from ._common import (
    AVG,
    SUM,
    OpLike,
    check_op_dtype,
    combine_,
    flat_view,
    group_info,
    normalize_op,
)
from .ring_batched import DEFAULT_SEGMENT_BYTES, pieces
from .ring import ring_steps
from .ring_schedule import schedule_all_reduce

#: Tags of persistent plans start here (plain send/recv defaults to tag
#: 0).
TAG_BASE = 0x5249_0000
_tags = itertools.count(TAG_BASE)


def _agree_tag(group: dist.ProcessGroup | None) -> int:
    """A tag no earlier plan of this process used, the same on every
    rank of ``group``."""
    global _tags
    proposal = torch.tensor([next(_tags)], dtype=torch.int64)
    dist.all_reduce(proposal, op=dist.ReduceOp.MAX, group=group)
    tag = int(proposal.item())
    _tags = itertools.count(tag + 1)
    return tag


class PrepostedRingAllReduce:
    """A ring all-reduce for one tensor shape, callable many times,
    receives pre-posted.

    ``plan = PrepostedRingAllReduce(like, op, group)`` (collective);
    ``plan(tensor)`` reduces any tensor with ``like``'s numel, dtype and
    device in place, as ``all_reduce_ring``; ``plan.close()``
    (collective) when done, or use it as a context manager. Outside
    ``group``, or in a group of one, calls return at once."""

    def __init__(
        self,
        like: torch.Tensor,
        op: OpLike = SUM,
        group: dist.ProcessGroup | None = None,
        *,
        segment_bytes: int | None = DEFAULT_SEGMENT_BYTES,
    ) -> None:
        self.op = normalize_op(op)
        check_op_dtype(self.op, like.dtype)
        self.numel, self.dtype, self.device = (
            like.numel(),
            like.dtype,
            like.device,
        )
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
        self.tag = _agree_tag(group)
        self.segment_bytes = segment_bytes
        self.sizes = [
            c.numel()
            for c in torch.empty(self.numel, device="meta").tensor_split(n)
        ]
        # The schedule's steps, (chunk sent, chunk received), recorded
        # once: one receive buffer per step, and close() sends what the
        # next rank's receives expect.
        steps = [
            (send_chunk, recv_chunk)
            for send_chunk, recv_chunk, _ in ring_steps(r, n)
        ]
        self._sends = [send_chunk for send_chunk, _ in steps]
        self._recv = torch.empty(
            sum(self.sizes[c] for _, c in steps), dtype=self.dtype
        )
        self._recv_steps: list[list[torch.Tensor]] = []
        lo = 0
        for _, c in steps:
            self._recv_steps.append(
                pieces(self._recv[lo : lo + self.sizes[c]], segment_bytes)
            )
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
            [dist.irecv(p, src, group=group, tag=tag) for p in step]
            for step in self._recv_steps
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
        if (tensor.numel(), tensor.dtype, tensor.device) != (
            self.numel,
            self.dtype,
            self.device,
        ):
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

    def _exchange(
        self, send_chunk: int, recv_chunk: int, reduce: bool
    ) -> None:
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
