"""sync=custom: your own all-reduce, trained with.

    python -m ddp_lab sync=custom sync.all_reduce=mine.py:all_reduce_ring

Everything but the sum is allreduce.py's: the gradients packed into
flat buckets, each divided by the world size, then your function sums
the bucket in place across ranks, as `dist.all_reduce` would:

    with self.timed("all_reduce", wire):
        with self.watch:              # your send/recv, counted and located
            your_all_reduce(wire)

The bytes each rank sent and received are the ones your function's
send/recv/isend/irecv calls really moved (collectives/watch.py), not a
model of them; the time is the call's, as for every synchroniser. If
one of your calls waits longer than HANG_S (30 s, or half of
`dist.timeout_s`), the rank says which call, to which peer, at which
line of your file; at `dist.timeout_s` the call raises with the same
words and the run ends failed (a blocking send or recv is run as
isend/irecv waited that long: gloo's own blocking wait ignores the
group's timeout).

Before any rank starts, `python -m ddp_lab.check` runs your function
at the run's world size against torch's all_reduce, and a function
that does not pass is refused with its verdict.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Optional

import torch
from torch import nn

from ..collectives.student import as_all_reduce, one
from ..collectives.watch import Watch
from .allreduce import AllReduceSync

log = logging.getLogger("ddp_lab")

#: a call of the student's that waits this long is named on the console
HANG_S = 30.0


class CustomSync(AllReduceSync):
    name = "custom"
    bytes_exact = True

    def wrap(self, module: nn.Module) -> nn.Module:
        module = super().wrap(module)
        fn, self.info, namespaces = one(self.cfg.all_reduce, "all_reduce", "sync.all_reduce")
        self.student = as_all_reduce(fn, self.info)
        # the group's timeout bounds every call of the student's
        bound = group_timeout_s(self.device) if self.world_size > 1 else None
        self.watch = Watch(modules=namespaces, bound_s=bound)
        self._hang = _HangWatch(self.watch, self.rank, min(HANG_S, bound / 2) if bound else HANG_S)
        return module

    def all_reduce(self, flat: torch.Tensor) -> None:
        before = (self.watch.sent, self.watch.recv)
        with self.watch:
            self.student(flat)
        # the bytes the student's calls moved (timed() counted none)
        self.comm.add_counts((0, 0, self.watch.sent - before[0], self.watch.recv - before[1], 0))

    def traffic(self, op: str, numel: int, elem_size: int):
        # counted from the calls themselves, in all_reduce above
        return 0, 0, None

    def close(self) -> None:
        super().close()
        self._hang.stop()


def group_timeout_s(device: torch.device) -> Optional[float]:
    """The default group's timeout (dist.timeout_s), where torch says
    it; None elsewhere."""
    import torch.distributed.distributed_c10d as c10d

    try:
        backend = c10d._get_default_group()._get_backend(device)
        return float(backend.options._timeout.total_seconds())
    except (AttributeError, RuntimeError, ValueError):
        return None


class _HangWatch(threading.Thread):
    """Says, once per call, which of the student's calls has waited
    longer than `after_s` (rank, op, peer, elements, file:line)."""

    def __init__(self, watch: Watch, rank: int, after_s: float):
        super().__init__(daemon=True, name="ddp_lab-custom-hang")
        self.watch, self.rank, self.after_s = watch, rank, after_s
        self._stop = threading.Event()
        if after_s > 0:
            self.start()

    def run(self) -> None:
        seen: dict[int, float] = {}
        told: set[int] = set()
        while not self._stop.wait(min(1.0, self.after_s / 4)):
            now = time.monotonic()
            pending = list(self.watch.pending)
            ids = {id(c) for c in pending}
            for k in list(seen):
                if k not in ids:
                    seen.pop(k)
                    told.discard(k)
            for c in pending:
                t0 = seen.setdefault(id(c), now)
                if now - t0 >= self.after_s and id(c) not in told:
                    told.add(id(c))
                    to = "to" if c.op in ("send", "isend") else "from"
                    peer = f" {to} rank {c.peer}" if c.peer is not None else ""
                    log.error(
                        "rank %d has waited %.0f s in %s%s (%d elements) at %s: the "
                        "peer never answers (python -m ddp_lab.check %s explains hangs "
                        "rank by rank)",
                        self.rank,
                        now - t0,
                        c.op,
                        peer,
                        c.numel,
                        c.where,
                        c.where.rpartition(":")[0],
                    )

    def stop(self) -> None:
        self._stop.set()
