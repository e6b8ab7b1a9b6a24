"""sync=custom's keys (sync/custom.py): the bucketed synchroniser's,
and `sync.all_reduce`, the student's function that sums each bucket
(`FILE.py:function`, found as `python -m ddp_lab.check` finds it)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError
from ..help import doc
from ..student import one_function
from .allreduce import BucketSyncConfig


@dataclass
class CustomSyncConfig(BucketSyncConfig):
    """Your own all-reduce on flat gradient buckets."""

    all_reduce: str = doc("", "your all-reduce as FILE.py:function (docs/exercises.md); it "
                              "sums each bucket in place, as dist.all_reduce does")
    hang_s: float = doc(30.0, "a call of yours that waits this long is named on the console "
                              "(rank, op, peer, file:line); 0 = never")

    @classmethod
    def check(cls, cfg: CustomSyncConfig, world_size: int) -> None:
        super().check(cfg, world_size)
        spec = cfg.get("all_reduce") or ""
        if not spec:
            raise ValueError("sync=custom needs your function: sync.all_reduce=FILE.py:function "
                             "(python -m ddp_lab.check --template notebook writes one to fill in)")
        try:
            one_function(spec, "all_reduce", "sync.all_reduce")
        except UserError as e:
            raise ValueError(str(e)) from None
