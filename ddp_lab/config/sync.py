"""The `sync` section's schemas: each synchroniser's keys (with their `--help` text) and its rules
for a world size (`check`: ValueError with the fix). Torch-free: the submitting command checks with
them before any process starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import MISSING

from .errors import UserError
from .help import doc
from .student import one_function


COMPRESS_MODES = ("none", "fp16", "bf16", "powersgd")


@dataclass
class SyncConfig:
    """How gradients are synchronised across ranks: the keys every synchroniser has
    (sync/synchroniser.py's interface)."""

    name: str = doc(MISSING, "ddp | naive | allreduce | reduce_broadcast | ring | tree | "
                             "butterfly | hierarchical | zero1 | torch_zero | fsdp2 "
                             "(ddp_lab/sync/<name>.py)")
    overlap: bool = doc(False, "start each gradient bucket's collective during backward, "
                               "as soon as the bucket is ready (DDP's overlap; ddp "
                               "always overlaps), instead of after backward")
    compress: str = doc("none", "gradients on the wire: none | fp16 | bf16 | powersgd (ddp only)")

    @classmethod
    def check(cls, cfg: SyncConfig, world_size: int) -> None:
        """Raise ValueError, with the fix, for a section the synchroniser cannot run on
        `world_size` ranks (before any process starts, and where the synchroniser is built)."""


@dataclass
class NaiveSyncConfig(SyncConfig):
    """One all_reduce per parameter's .grad after backward (ddp_lab/sync/naive.py)."""

    @classmethod
    def check(cls, cfg: NaiveSyncConfig, world_size: int) -> None:
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
    """Flattened gradient buckets, one collective call per bucket (sync/allreduce.py; tree and
    butterfly take these keys as they are)."""

    bucket_mb: float = doc(25.0, "bucket size in MB (1e6 bytes); 0 = one call per parameter")

    @classmethod
    def check(cls, cfg: BucketSyncConfig, world_size: int) -> None:
        if cfg.bucket_mb < 0:
            raise ValueError(f"sync.bucket_mb={cfg.bucket_mb}: must be >= 0 "
                             "(0 = one call per parameter)")
        if cfg.compress == "powersgd":
            raise ValueError(f"sync.compress=powersgd: only sync=ddp runs it (torch's PowerSGD is "
                             f"a DDP comm hook): use sync=ddp, or sync.compress=fp16 or bf16 "
                             f"with sync={cfg.name}")


@dataclass
class ReduceBroadcastSyncConfig(BucketSyncConfig):
    """Reduce gradients to a root, step there, broadcast the parameters."""

    root: int = doc(0, "the rank that averages, steps the optimiser and holds its state")

    @classmethod
    def check(cls, cfg: ReduceBroadcastSyncConfig, world_size: int) -> None:
        super().check(cfg, world_size)
        if not 0 <= cfg.root < world_size:
            raise ValueError(f"sync.root={cfg.root}: must be a rank, 0..{world_size - 1}")


@dataclass
class RingSyncConfig(BucketSyncConfig):
    """Ring all-reduce from send/recv on flat buckets (sync/ring.py)."""

    prepost: bool = doc(False, "false: the textbook ring (collectives/ring.py), each "
                               "step's receive posted when the step starts; true on gloo: "
                               "each bucket's receives posted a call ahead, so sends never "
                               "wait for the receiver's \"ready\" notice "
                               "(collectives.PrepostedRingAllReduce). nccl: all_reduce_ring")


#: sync.inter / sync.intra of sync=hierarchical -> the algorithm that runs it
HIERARCHICAL_INTER = {"ring": "ring", "library": "torch"}
HIERARCHICAL_INTRA = {"library": "torch", "tree": "tree"}


@dataclass
class HierarchicalSyncConfig(RingSyncConfig):
    """Reduce inside each node, all-reduce among the leaders, broadcast inside each node."""

    inter: str = doc("ring", "the leaders' all-reduce (the only traffic between nodes): ring "
                             "(ddp_lab.collectives, exact bytes; sync.prepost applies) | "
                             "library (torch.distributed.all_reduce on their group)")
    intra: str = doc("library", "the reduce onto the node's leader and the broadcast from "
                                "it: library (torch.distributed.reduce/broadcast on the "
                                "node's group) | tree (ddp_lab.collectives)")
    node_size: int = doc(0, "0 = the launcher's nodes; k = pretend every k consecutive ranks "
                            "are a node (one machine; must divide the world size)")

    @classmethod
    def check(cls, cfg: HierarchicalSyncConfig, world_size: int) -> None:
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


@dataclass
class Zero1SyncConfig(BucketSyncConfig):
    """ZeRO stage 1: each rank steps the optimiser on its shard (ddp_lab/sync/zero1.py)."""

    @classmethod
    def check(cls, cfg: Zero1SyncConfig, world_size: int) -> None:
        super().check(cfg, world_size)
        if cfg.get("overlap", False):
            raise ValueError("sync=zero1 sync.overlap=true: zero1 reduce-scatters after backward; "
                             "drop sync.overlap (or use sync=ddp for overlapped all-reduces)")
        if cfg.get("compress", "none") != "none":
            raise ValueError(f"sync=zero1 sync.compress={cfg.compress}: zero1 sends fp32 "
                             f"gradients; drop sync.compress, or use sync=ring "
                             f"sync.compress={cfg.compress}")


#: worked all-reduces to train with as they are, or to read before writing yours (the first is
#: sync.all_reduce's default)
STUDENT_EXAMPLES = ("ddp_lab.collectives.ring:all_reduce_ring_textbook",
                    "ddp_lab.collectives.all_reduce:all_reduce_butterfly")


@dataclass
class CustomSyncConfig(BucketSyncConfig):
    """Your own all-reduce on flat gradient buckets (sync/custom.py): `sync.all_reduce`."""

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


#: sync.hook of sync=ddp -> what DDP's reducer runs on each gradient bucket: ddp_lab's collectives
#: (the student's ring inside the production engine: the textbook ring, the pre-posted ring, a
#: tree reduce then broadcast) or torch's own hooks (ddp_comm_hooks' default_hooks and
#: powerSGD_hook). "none": the one sync.compress picks (none: torch's allreduce_hook).
DDP_HOOKS = ("none", "ring", "ring_prepost", "reduce_broadcast", "allreduce", "fp16", "bf16",
             "powersgd")


@dataclass
class DDPSyncConfig(SyncConfig):
    """torch.nn.parallel.DistributedDataParallel (sync/ddp.py): its own options, PowerSGD's rank
    and the comm hook it runs on each bucket."""

    overlap: bool = doc(True, "DDP overlaps its bucket all-reduces "
                              "with backward: always true here")
    powersgd_rank: int = doc(1, "sync.compress=powersgd: the rank of "
                                "PowerSGD's low-rank approximation")
    bucket_cap_mb: float = doc(25.0, "DDP gradient bucket size in MB")
    gradient_as_bucket_view: bool = doc(False, "let .grad alias the bucket memory (saves a copy)")
    static_graph: bool = doc(False, "promise DDP the graph never changes "
                                    "(needs every parameter used)")
    find_unused_parameters: bool = doc(False, "let DDP look for parameters that got no gradient")
    hook: str = doc("none", "the comm hook DDP runs on each bucket: none (the one sync.compress "
                            "picks) | ring | ring_prepost | reduce_broadcast (ddp_lab's "
                            "collectives) | allreduce | fp16 | bf16 | powersgd (torch's); "
                            "docs/twins.md")

    @classmethod
    def check(cls, cfg: DDPSyncConfig, world_size: int) -> None:
        if not cfg.get("overlap", True):
            raise ValueError("sync=ddp sync.overlap=false: DDP always overlaps its bucket "
                             "all-reduces with backward; drop sync.overlap=false (or use "
                             "sync=allreduce sync.overlap=false for the same buckets after "
                             "backward)")
        if cfg.static_graph and cfg.find_unused_parameters:
            raise ValueError("sync.static_graph=true and sync.find_unused_parameters=true "
                             "contradict each other: set one of them to false")
        # DDP itself would take it silently
        if cfg.bucket_cap_mb < 0:
            raise ValueError(f"sync.bucket_cap_mb={cfg.bucket_cap_mb}: must be >= 0 "
                             "(0 = one bucket per parameter)")
        hook, compress = cfg.get("hook", "none"), cfg.get("compress", "none")
        if hook not in DDP_HOOKS:
            raise ValueError(f"sync.hook={hook}: choose one of {', '.join(DDP_HOOKS)}")
        if hook != "none" and compress != "none" and hook != compress:
            raise ValueError(f"sync=ddp sync.hook={hook} sync.compress={compress}: both choose the "
                             f"comm hook DDP runs on each bucket (sync.compress={compress} on ddp "
                             f"is torch's {compress} hook, as sync.hook={compress}): set one of them")
        if cfg.powersgd_rank < 1:
            raise ValueError(f"sync.powersgd_rank={cfg.powersgd_rank}: must be >= 1 (the rank "
                             "of PowerSGD's low-rank approximation; 1 is the default)")


@dataclass
class TorchZeroSyncConfig(DDPSyncConfig):
    """torch.distributed.optim.ZeroRedundancyOptimizer over DistributedDataParallel
    (docs/twins.md)."""

    @classmethod
    def check(cls, cfg: TorchZeroSyncConfig, world_size: int) -> None:
        super().check(cfg, world_size)
        for key in ("compress", "hook"):
            if cfg.get(key, "none") != "none":
                raise ValueError(f"sync=torch_zero sync.{key}={cfg[key]}: torch_zero is the "
                                 f"library twin of sync=zero1 and sends fp32 through DDP's plain "
                                 f"all-reduce; drop sync.{key} (or use sync=ddp sync.{key}="
                                 f"{cfg[key]})")
        if cfg.get("powersgd_rank", 1) != 1:
            raise ValueError(f"sync=torch_zero sync.powersgd_rank={cfg.powersgd_rank}: torch_zero "
                             f"runs no PowerSGD (compression refused); drop sync.powersgd_rank")


@dataclass
class FSDP2SyncConfig(SyncConfig):
    """torch.distributed.fsdp.fully_shard (FSDP2) on each child module with parameters, then the
    root (docs/twins.md)."""

    overlap: bool = doc(True, "FSDP2 overlaps its reduce-scatters with backward: "
                              "always true here")
    reshard_after_forward: bool = doc(True, "free each module's gathered weights after its "
                                            "forward and all-gather them again in backward "
                                            "(false: keep them until after backward)")

    @classmethod
    def check(cls, cfg: FSDP2SyncConfig, world_size: int) -> None:
        if not cfg.get("overlap", True):
            raise ValueError("sync=fsdp2 sync.overlap=false: FSDP2 always reduce-scatters "
                             "during backward; drop sync.overlap=false")
        if cfg.get("compress", "none") != "none":
            raise ValueError(f"sync=fsdp2 sync.compress={cfg.compress}: fsdp2 runs fp32 here "
                             f"(FSDP2's MixedPrecisionPolicy is not wired); drop sync.compress, "
                             f"or use sync=ddp sync.compress={cfg.compress}")


#: sync option -> its schema (tree and butterfly: allreduce's keys, another algorithm)
SYNC_SCHEMAS: dict[str, type[SyncConfig]] = {
    "ddp": DDPSyncConfig, "naive": NaiveSyncConfig, "allreduce": BucketSyncConfig,
    "reduce_broadcast": ReduceBroadcastSyncConfig, "ring": RingSyncConfig,
    "tree": BucketSyncConfig, "butterfly": BucketSyncConfig,
    "hierarchical": HierarchicalSyncConfig, "zero1": Zero1SyncConfig,
    # the student's own all-reduce (docs/exercises.md)
    "custom": CustomSyncConfig,
    # torch's library twins (docs/twins.md)
    "torch_zero": TorchZeroSyncConfig, "fsdp2": FSDP2SyncConfig}
