"""sync=custom's keys (sync/custom.py): the bucketed synchroniser's,
and `sync.all_reduce`, the student's function that sums each bucket
(`FILE.py:function`, found as `python -m ddp_lab.check` finds it)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import UserError
from ..help import doc
from ..student import one_function
from .allreduce import BucketSyncConfig

#: worked all-reduces to train with as they are, or to read before
#: writing yours (the first is sync.all_reduce's default)
STUDENT_EXAMPLES = ("ddp_lab.collectives.ring:all_reduce_ring_textbook",
                    "ddp_lab.collectives.all_reduce:all_reduce_butterfly")


@dataclass
class CustomSyncConfig(BucketSyncConfig):
    """Your own all-reduce on flat gradient buckets."""

    all_reduce: str = doc(STUDENT_EXAMPLES[0], "your all-reduce as FILE.py:function (or "
                                              "package.module:function; docs/exercises.md): "
                                              "it sums each bucket in place, as "
                                              "dist.all_reduce does")

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
