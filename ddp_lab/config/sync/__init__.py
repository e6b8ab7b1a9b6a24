"""The `sync` section's schemas: each synchroniser's keys (with their
`--help` text) and the rules for a world size (`check`), one file beside
each: sync/ring.py runs what config/sync/ring.py accepts. Torch-free:
the submitting command checks with them.
"""

from .allreduce import BucketSyncConfig
from .base import COMPRESS_MODES, SyncConfig
from .custom import STUDENT_EXAMPLES, CustomSyncConfig
from .ddp import DDP_HOOKS, TORCH_COMPRESS_HOOKS, DDPSyncConfig
from .hierarchical import HIERARCHICAL_INTER, HIERARCHICAL_INTRA, HierarchicalSyncConfig
from .naive import NaiveSyncConfig
from .reduce_broadcast import ReduceBroadcastSyncConfig
from .ring import RingSyncConfig
from .fsdp2 import FSDP2SyncConfig
from .torch_zero import TorchZeroSyncConfig
from .zero1 import Zero1SyncConfig

#: sync option -> its schema (tree and butterfly: allreduce's keys,
#: another algorithm)
SYNC_SCHEMAS: dict[str, type[SyncConfig]] = {
    "ddp": DDPSyncConfig, "naive": NaiveSyncConfig, "allreduce": BucketSyncConfig,
    "reduce_broadcast": ReduceBroadcastSyncConfig, "ring": RingSyncConfig,
    "tree": BucketSyncConfig, "butterfly": BucketSyncConfig,
    "hierarchical": HierarchicalSyncConfig, "zero1": Zero1SyncConfig,
    # the student's own all-reduce (docs/exercises.md)
    "custom": CustomSyncConfig,
    # torch's library twins (docs/twins.md)
    "torch_zero": TorchZeroSyncConfig, "fsdp2": FSDP2SyncConfig}

__all__ = ["BucketSyncConfig", "COMPRESS_MODES", "CustomSyncConfig", "STUDENT_EXAMPLES", "DDP_HOOKS", "DDPSyncConfig", "FSDP2SyncConfig",
           "TORCH_COMPRESS_HOOKS", "TorchZeroSyncConfig", "HIERARCHICAL_INTER",
           "HIERARCHICAL_INTRA", "HierarchicalSyncConfig", "NaiveSyncConfig",
           "ReduceBroadcastSyncConfig", "RingSyncConfig", "SYNC_SCHEMAS", "SyncConfig",
           "Zero1SyncConfig"]
