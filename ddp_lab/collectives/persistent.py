"""Persistent ring all-reduce: the ring of :func:`all_reduce_ring`, receives posted a call ahead.

Why it exists. gloo's TCP transport sends with a *rendezvous*: a send whose receiver has
not yet posted the matching receive is parked, a "send ready" notice goes to the peer, and
the data only leaves (from gloo's event-loop thread) when the peer's "recv ready" notice
comes back. In a training step the ranks reach the all-reduce a little apart, so every
ring step pays that extra notice round trip plus a thread hand-off on both sides; at 2
ranks and a 159 KB bucket that made the ring all-reduce cost about twice gloo's own.

MPI's answer is the *persistent request* (``MPI_Recv_init`` / ``MPI_Start``) and the
pre-posted receive, and that is what this class does: it is built once for a tensor
shape, owns one receive buffer per ring step, and posts every receive of the *next* call
at the end of the current one. When a rank reaches its next all-reduce its peers'
"recv ready" notices have long arrived, so each send is written to the socket at once
from the calling thread, and a rank that arrives late finds its data already received.
Same algorithm, same bytes on the wire (``2(n-1)/n * N`` per rank each way), same result
bit for bit as :func:`all_reduce_ring`; only the moment each receive is posted changes.

Costs and rules:

* receive buffers: ``2(n-1)`` chunks, about ``2(n-1)/n`` of the tensor (the all-gather
  cannot receive in place a call ahead: a fast peer's data would land in chunks this
  rank is still reducing), plus one copy per all-gather step out of them;
* the plan's messages carry their own tag (agreed by the group when it is built), so
  other point-to-point traffic between calls cannot be mistaken for them;
* every rank of the group builds, calls and closes its plans in the same order, as for
  any collective; ``close()`` is collective: it matches each pre-posted receive with a
  throw-away message so nothing is left in flight (skipping it only leaves receives
  pending until the process group is destroyed);
* gloo and CPU tensors only: nccl runs a group of sends and receives as one kernel on a
  stream, where a receive posted a call ahead would block everything queued behind it;
  :func:`all_reduce_ring` (grouped sends/receives) is the ring for nccl.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

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
    pieces,
)
from ._ring import DEFAULT_SEGMENT_BYTES

#: Tags of persistent plans start here (plain send/recv defaults to tag 0).
TAG_BASE = 0x5249_0000
_tags = itertools.count(TAG_BASE)


def _agree_tag(group: dist.ProcessGroup | None) -> int:
    """A tag no earlier plan of this process used, the same on every rank of ``group``."""
    global _tags
    proposal = torch.tensor([next(_tags)], dtype=torch.int64)
    dist.all_reduce(proposal, op=dist.ReduceOp.MAX, group=group)
    tag = int(proposal.item())
    _tags = itertools.count(tag + 1)
    return tag


class PersistentRingAllReduce:
    """A ring all-reduce for one tensor shape, callable many times, receives pre-posted.

    ``plan = PersistentRingAllReduce(like, op, group)`` (collective: every rank of
    ``group``); then ``plan(tensor)`` sums (``op``) ``tensor`` across the group in place,
    like ``all_reduce_ring(tensor, op, group)``, for any tensor with ``like``'s number of
    elements, dtype and device; ``plan.close()`` (collective) when done, or use it as a
    context manager. A process outside ``group``, or a group of one, gets a plan whose
    calls return at once. ``segment_bytes`` cuts each step's message into pieces as in
    :func:`all_reduce_ring` (each piece reduced as it lands).
    """

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
        self.numel, self.dtype, self.device = like.numel(), like.dtype, like.device
        self.info = info = group_info(group)
        self._active = info is not None and info.size > 1 and self.numel > 0
        self._posted: list[list[dist.Work]] | None = None
        self._broken: BaseException | None = None
        if not self._active:
            return
        backend = dist.get_backend(group)
        if backend != "gloo" or like.device.type != "cpu":
            raise ValueError(
                f"PersistentRingAllReduce needs a gloo group and CPU tensors (got backend "
                f"{backend!r}, device {like.device}); use all_reduce_ring, whose grouped "
                "sends and receives are what nccl needs")
        n, r = info.size, info.rank
        self.tag = _agree_tag(group)
        self.segment_bytes = segment_bytes
        self.sizes = [c.numel() for c in torch.empty(self.numel, device="meta").tensor_split(n)]
        # Chunk indices, step by step (shift=1: rank r ends the reduce-scatter owning r+1).
        self.rs_send = [(r - s) % n for s in range(n - 1)]
        self.rs_recv = [(r - 1 - s) % n for s in range(n - 1)]
        self.ag_send = [(r + 1 - s) % n for s in range(n - 1)]
        self.ag_recv = [(r - s) % n for s in range(n - 1)]
        steps = self.rs_recv + self.ag_recv
        self._recv = torch.empty(sum(self.sizes[c] for c in steps), dtype=self.dtype)
        self._recv_steps: list[list[torch.Tensor]] = []
        lo = 0
        for c in steps:
            self._recv_steps.append(pieces(self._recv[lo:lo + self.sizes[c]], segment_bytes))
            lo += self.sizes[c]
        self.to_next, self.from_prev = info.peer(r + 1), info.peer(r - 1)

    # -------------------------------------------------------------- plumbing
    def _post_receives(self) -> None:
        """Post every receive of one call, in step order: a ring link delivers in order,
        and gloo matches a peer's messages of one tag to receives first-in first-out."""
        group, tag, src = self.info.group, self.tag, self.from_prev
        self._posted = [[dist.irecv(p, src, group=group, tag=tag) for p in step]
                        for step in self._recv_steps]

    def _send(self, t: torch.Tensor) -> list[dist.Work]:
        return [dist.isend(p, self.to_next, group=self.info.group, tag=self.tag)
                for p in pieces(t, self.segment_bytes)]

    def _check(self, tensor: torch.Tensor) -> None:
        if self._broken is not None:
            raise RuntimeError(
                "this PersistentRingAllReduce failed in an earlier call "
                f"({type(self._broken).__name__}: {self._broken}); build a new one")
        if (tensor.numel(), tensor.dtype, tensor.device) != (self.numel, self.dtype, self.device):
            raise ValueError(
                f"this plan all-reduces {self.numel} elements of {self.dtype} on {self.device}, "
                f"got {tensor.numel()} of {tensor.dtype} on {tensor.device}; build one plan "
                "per tensor shape")

    # ------------------------------------------------------------------ calls
    def __call__(self, tensor: torch.Tensor) -> None:
        self._check(tensor)
        if not self._active:
            return
        try:
            if self._posted is None:  # first call, or first after close()
                self._post_receives()
            with flat_view(tensor) as flat:
                self._run(list(flat.tensor_split(self.info.size)))
            self._post_receives()  # the next call's, while this rank computes
        except BaseException as e:
            self._broken, self._posted = e, None
            raise

    def _run(self, chunks: Sequence[torch.Tensor]) -> None:
        n = self.info.size
        posted, recv = self._posted, self._recv_steps
        # Reduce-scatter: at step s send chunk rs_send[s] (own data, then the partial just
        # made), receive the previous rank's partial of rs_recv[s] and add it, piece by piece.
        for s in range(n - 1):
            sends = self._send(chunks[self.rs_send[s]])
            mine = chunks[self.rs_recv[s]]
            lo = 0
            for work, piece in zip(posted[s], recv[s]):
                work.wait()
                combine_(mine[lo:lo + piece.numel()], piece, self.op)
                lo += piece.numel()
            for w in sends:  # the sent chunk is overwritten in the all-gather
                w.wait()
        if self.op == AVG:
            chunks[(self.info.rank + 1) % n].div_(n)
        # All-gather: send the chunk completed last, receive the next into its place.
        for s in range(n - 1):
            sends = self._send(chunks[self.ag_send[s]])
            dest = chunks[self.ag_recv[s]]
            lo = 0
            for work, piece in zip(posted[n - 1 + s], recv[n - 1 + s]):
                work.wait()
                dest[lo:lo + piece.numel()].copy_(piece)
                lo += piece.numel()
            for w in sends:  # the caller may change the tensor once we return
                w.wait()

    def close(self) -> None:
        """Collective: answer every pre-posted receive with a throw-away message (the
        sizes the next rank expects, in its order) and wait, so nothing stays in flight.
        The plan stays usable: the next call posts its receives again."""
        if not self._active or self._posted is None:
            return
        posted, self._posted = self._posted, None
        filler = torch.zeros(max(self.sizes), dtype=self.dtype)
        sends = []
        for c in self.rs_send + self.ag_send:  # exactly what the next rank's receives expect
            sends += self._send(filler[: self.sizes[c]])
        for w in [w for step in posted for w in step] + sends:
            w.wait()

    def __enter__(self) -> "PersistentRingAllReduce":
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None:
            self.close()
