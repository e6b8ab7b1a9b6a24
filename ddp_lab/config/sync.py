"""The sync section's schemas, one per synchroniser, with the rules (`check`) each one's
config must meet for a world size: torch-free, so the submitting command refuses a bad
config before any rank starts."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from ..config_help import doc


COMPRESS_MODES = ("none", "fp16", "bf16", "powersgd")


@dataclass
class SyncConfig:
    """How gradients are synchronised across ranks."""

    name: str = doc(MISSING, "ddp | naive | allreduce | reduce_broadcast | ring | tree | "
                             "butterfly | hierarchical | zero1 (ddp_lab/sync/<name>.py)")
    overlap: bool = doc(False, "start each gradient bucket's collective during backward, "
                               "as soon as the bucket is ready (DDP's overlap; ddp "
                               "always overlaps), instead of after backward")
    compress: str = doc("none", "gradients on the wire: none | fp16 | bf16 | powersgd (ddp only)")

    @classmethod
    def check(cls, cfg: Any, world_size: int) -> None:
        """Raise ValueError, with the fix, for a section (`cfg`: this schema's keys, as
        composed or completed by `with_defaults`) the synchroniser cannot run on
        `world_size` ranks. Config only: it runs before any process starts (validate.py)
        and again where a synchroniser is built (sync/base.py)."""


@dataclass
class DDPSyncConfig(SyncConfig):
    """torch.nn.parallel.DistributedDataParallel."""

    overlap: bool = doc(True, "DDP overlaps its bucket all-reduces "
                              "with backward: always true here")
    powersgd_rank: int = doc(1, "sync.compress=powersgd: the rank of "
                                "PowerSGD's low-rank approximation")
    bucket_cap_mb: float = doc(25.0, "DDP gradient bucket size in MB")
    gradient_as_bucket_view: bool = doc(False, "let .grad alias the bucket memory (saves a copy)")
    static_graph: bool = doc(False, "promise DDP the graph never changes "
                                    "(needs every parameter used)")
    find_unused_parameters: bool = doc(False, "let DDP look for parameters that got no gradient")

    @classmethod
    def check(cls, cfg: Any, world_size: int) -> None:
        if not cfg.get("overlap", True):
            raise ValueError("sync=ddp sync.overlap=false: DDP always overlaps its bucket "
                             "all-reduces with backward; drop sync.overlap=false (or use "
                             "sync=allreduce sync.overlap=false for the same buckets after "
                             "backward)")
        if cfg.static_graph and cfg.find_unused_parameters:
            raise ValueError("sync.static_graph=true and sync.find_unused_parameters=true "
                             "contradict each other: set one of them to false")
        if cfg.bucket_cap_mb < 0:  # DDP itself would take it silently
            raise ValueError(f"sync.bucket_cap_mb={cfg.bucket_cap_mb}: must be >= 0 "
                             "(0 = one bucket per parameter)")
        if cfg.powersgd_rank < 1:
            raise ValueError(f"sync.powersgd_rank={cfg.powersgd_rank}: must be >= 1 (the rank "
                             "of PowerSGD's low-rank approximation; 1 is the default)")


@dataclass
class NaiveSyncConfig(SyncConfig):
    """One torch.distributed.all_reduce per parameter's .grad after backward, then divided
    by the world size (ddp_lab/sync/naive.py); no keys of its own, overlap and compress
    refused."""

    @classmethod
    def check(cls, cfg: Any, world_size: int) -> None:
        if cfg.get("overlap", False):
            raise ValueError("sync=naive sync.overlap=true: naive starts its calls after backward; "
                             "drop sync.overlap, or use sync=allreduce sync.bucket_mb=0 "
                             "sync.overlap=true (the same calls, each as soon as its .grad is ready)")
        if cfg.get("compress", "none") != "none":
            raise ValueError(f"sync=naive sync.compress={cfg.compress}: naive sends each .grad as "
                             f"it is; drop sync.compress, or use sync=allreduce sync.bucket_mb=0 "
                             f"sync.compress={cfg.compress}")


@dataclass
class BucketSyncConfig(SyncConfig):
    """Flattened gradient buckets, one collective call per bucket (allreduce, ring, tree,
    butterfly)."""

    bucket_mb: float = doc(25.0, "bucket size in MB (1e6 bytes); 0 = one call per parameter")

    @classmethod
    def check(cls, cfg: Any, world_size: int) -> None:
        if cfg.bucket_mb < 0:
            raise ValueError(f"sync.bucket_mb={cfg.bucket_mb}: must be >= 0 "
                             "(0 = one call per parameter)")
        if cfg.compress == "powersgd":
            raise ValueError(f"sync.compress=powersgd: only sync=ddp runs it (torch's PowerSGD is "
                             f"a DDP comm hook): use sync=ddp, or sync.compress=fp16 or bf16 "
                             f"with sync={cfg.name}")


@dataclass
class RingSyncConfig(BucketSyncConfig):
    """Ring all-reduce from send/recv on flat buckets."""

    prepost: bool = doc(False, "false: the textbook ring (collectives/ring.py), each "
                               "step's receive posted when the step starts; true on gloo: "
                               "each bucket's receives posted a call ahead, so sends never "
                               "wait for the receiver's \"ready\" notice "
                               "(collectives.PersistentRingAllReduce). nccl: all_reduce_ring")


@dataclass
class ReduceBroadcastSyncConfig(BucketSyncConfig):
    """Reduce gradients to a root, step there, broadcast the parameters."""

    root: int = doc(0, "the rank that averages, steps the optimiser and holds its state")

    @classmethod
    def check(cls, cfg: Any, world_size: int) -> None:
        super().check(cfg, world_size)
        if not 0 <= cfg.root < world_size:
            raise ValueError(f"sync.root={cfg.root}: must be a rank, 0..{world_size - 1}")


@dataclass
class Zero1SyncConfig(BucketSyncConfig):
    """ZeRO stage 1: gradients reduce-scattered, each rank steps the optimiser on its shard
    of the flat weights, which are then all-gathered (ddp_lab/sync/zero1.py)."""

    @classmethod
    def check(cls, cfg: Any, world_size: int) -> None:
        super().check(cfg, world_size)
        if cfg.get("overlap", False):
            raise ValueError("sync=zero1 sync.overlap=true: zero1 reduce-scatters after backward; "
                             "drop sync.overlap (or use sync=ddp for overlapped all-reduces)")
        if cfg.get("compress", "none") != "none":
            raise ValueError(f"sync=zero1 sync.compress={cfg.compress}: zero1 sends fp32 "
                             f"gradients; drop sync.compress, or use sync=ring "
                             f"sync.compress={cfg.compress}")


#: sync.inter / sync.intra of sync=hierarchical -> the algorithm that runs it
HIERARCHICAL_INTER = {"ring": "ring", "library": "torch"}
HIERARCHICAL_INTRA = {"library": "torch", "tree": "tree"}


@dataclass
class HierarchicalSyncConfig(RingSyncConfig):
    """Reduce inside each node, all-reduce among one leader per node, broadcast inside
    each node, per bucket (ddp_lab/sync/hierarchical.py)."""

    inter: str = doc("ring", "the leaders' all-reduce (the only traffic between nodes): ring "
                             "(ddp_lab.collectives, exact bytes; sync.prepost applies) | "
                             "library (torch.distributed.all_reduce on their group)")
    intra: str = doc("library", "the reduce onto the node's leader and the broadcast from "
                                "it: library (torch.distributed.reduce/broadcast on the "
                                "node's group) | tree (ddp_lab.collectives)")
    node_size: int = doc(0, "0 = the launcher's nodes; k = pretend every k consecutive ranks "
                            "are a node (one machine; must divide the world size)")

    @classmethod
    def check(cls, cfg: Any, world_size: int) -> None:
        super().check(cfg, world_size)
        for key, allowed in (("inter", HIERARCHICAL_INTER), ("intra", HIERARCHICAL_INTRA)):
            if cfg[key] not in allowed:
                raise ValueError(f"sync.{key}={cfg[key]}: choose {' or '.join(allowed)}")
        k = cfg.node_size
        if k < 0 or (k > 0 and world_size % k):
            divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
            raise ValueError(
                f"sync.node_size={k}: must divide the world of {world_size} ranks into equal "
                f"nodes: use one of {', '.join(map(str, divisors))}, or 0 for the launcher's nodes")


# ------------------------------------------------------------------- model
