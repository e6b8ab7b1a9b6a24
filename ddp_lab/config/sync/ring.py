"""sync=ring's keys (sync/ring.py): the buckets', and which transport
carries the steps."""

from __future__ import annotations

from dataclasses import dataclass

from ..help import doc
from .allreduce import BucketSyncConfig


@dataclass
class RingSyncConfig(BucketSyncConfig):
    """Ring all-reduce from send/recv on flat buckets."""

    prepost: bool = doc(False, "false: the textbook ring (collectives/ring.py), each "
                               "step's receive posted when the step starts; true on gloo: "
                               "each bucket's receives posted a call ahead, so sends never "
                               "wait for the receiver's \"ready\" notice "
                               "(collectives.PrepostedRingAllReduce). nccl: all_reduce_ring")
