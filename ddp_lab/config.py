"""The config schema: dataclasses give the types, YAML in conf/ gives the values.

Registered in Hydra's ConfigStore so that a misspelt key or a value of the wrong type
fails at composition, with Hydra's own message, before any process starts. Each config
group option (conf/<group>/<name>.yaml) starts from its schema node `/schema/<group>/<name>`.

Workers do not compose: they read the resolved `config.yaml` of their run folder back
into the same schema with `load_run_config`, so every rank runs exactly one config.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from hydra import compose as hydra_compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from .config_help import doc, help_keys
from .resources import conf_dir
from .registry import Registry


# ---------------------------------------------------------------- launcher
@dataclass
class LauncherConfig:
    """How the ranks are started."""

    name: str = doc(MISSING, "launcher kind: local | mpirun | slurm | runai")
    nodes: int = doc(1, "number of machines (nodes, pods)")
    nproc_per_node: Optional[int] = doc(None, "processes per node; null = one "
                                              "per GPU, else 2 on CPU")
    dry_run: bool = doc(False, "render and print what would be run, write it "
                               "into the run folder, start nothing")
    max_restarts: int = doc(0, "torchrun restarts of the whole worker group "
                               "after a failure (resumes from checkpoint)")
    setup: List[str] = doc([], "shell lines run on every node before the ranks start "
                               "(module load ..., source venv/bin/activate)")
    python: Optional[str] = doc(None, "the python that runs the ranks; null = this "
                                      "interpreter (runai: `python` of the image)")
    venv: Optional[str] = doc(None, "a virtual environment whose python runs the ranks "
                                    "(launcher.python then unused): made over a container's "
                                    "torch with --system-site-packages, on storage every "
                                    "node sees (docs/launchers.md, Containers)")
    required: List[str] = doc([], "launcher keys a real submission needs set (a "
                                  "site preset names them, e.g. [account, "
                                  "environment]); a dry run renders without them")


@dataclass
class LocalLauncherConfig(LauncherConfig):
    """torchrun on this machine."""

    master_port: Optional[int] = doc(None, "rendezvous port; null = a free one")
    oversubscribe: bool = doc(False, "allow more than 4 ranks a core: refused without it, "
                                     "as Open MPI refuses without --oversubscribe")


@dataclass
class MpirunLauncherConfig(LauncherConfig):
    """Open MPI's mpirun starts one process per slot (the lab-machines recipe)."""

    hosts: Optional[List[str]] = doc(None, "`name:slots` entries (`name` alone = nproc_per_node "
                                           "slots); null = hostfile, else [localhost]")
    hostfile: Optional[str] = doc(None, "an existing Open MPI hostfile (`name slots=N` or "
                                        "`name max_slots=N` lines) instead of hosts")
    np: Optional[int] = doc(None, "ranks in all (mpirun's -np), placed slot by "
                                  "slot, host by host; null = every slot")
    master_addr: Optional[str] = doc(None, "rendezvous address every rank reaches: the "
                                           "first host (rank 0's); null = that host")
    master_port: Optional[int] = doc(None, "rendezvous port; null = a free one "
                                           "(checked on this machine)")
    allow_run_as_root: Optional[bool] = doc(None, "pass --allow-run-as-root; null = "
                                                  "when running as root")
    oversubscribe: Optional[bool] = doc(None, "pass --oversubscribe; null = when a local "
                                              "host gets more slots than it has cores")
    mpirun: str = doc("mpirun", "the mpirun executable")
    extra_args: List[str] = doc([], "more mpirun arguments, e.g. [--mca, btl_tcp_if_include, "
                                    "eth0]; ssh's options: [--mca, plm_rsh_args, \"-F "
                                    "SSH_CONFIG\"] (docs/launchers.md, mpirun)")


@dataclass
class SlurmLauncherConfig(LauncherConfig):
    """sbatch + srun: one torchrun per node, or one task per process (per_task=true)."""

    job_name: str = doc("ddp_lab", "#SBATCH --job-name (also %x in the log names)")
    output: str = doc("%x_%j", "#SBATCH --output/--error: the logs' name in RUN_DIR/logs, "
                               ".out/.err added; SLURM's %x (job name), %j (job id), %u (user)")
    account: Optional[str] = doc(None, "#SBATCH --account")
    partition: Optional[str] = doc(None, "#SBATCH --partition")
    qos: Optional[str] = doc(None, "#SBATCH --qos")
    time: str = doc("00:30:00", "#SBATCH --time (wall-clock limit)")
    gpus_per_node: Optional[int] = doc(None, "#SBATCH --gpus-per-node; null = no GPU request")
    cpus_per_task: Optional[int] = doc(None, "#SBATCH --cpus-per-task (passed on to srun too)")
    ntasks_per_node: Optional[int] = doc(None, "#SBATCH --ntasks-per-node; null = 1 "
                                               "(torchrun) or nproc_per_node (per_task)")
    environment: Optional[str] = doc(None, "#SBATCH --environment=<toml>: a CSCS "
                                           "container environment (EDF)")
    nccl_env: bool = doc(False, "export the NCCL network settings `python -m ddp_lab.nccl_env` "
                                "reads from the first node's sysfs (Slingshot: CSCS's "
                                "aws-ofi-nccl settings; RoCE/IB: device and GID index)")
    contiguous: bool = doc(False, "#SBATCH --contiguous: nodes next to each other")
    sbatch_extra: List[str] = doc([], "more #SBATCH options, e.g. [--mem=0, --exclusive]")
    srun_extra: List[str] = doc([], "more srun options")
    per_task: bool = doc(False, "true: srun starts one task per process, no "
                                "torchrun (ranks from SLURM_PROCID)")
    rdzv: str = doc("c10d", "torchrun rendezvous: c10d (survives restarts) | "
                            "static (master_addr/port, no restarts)")
    master_port: Optional[int] = doc(None, "rendezvous port; null = 20000 + job id % "
                                           "20000 (the same on every node)")
    wait: Optional[bool] = doc(None, "follow the job to its end and return its exit "
                                     "status; null = when stdin is a terminal")
    wait_timeout_s: Optional[float] = doc(None, "stop following after this long (the job "
                                                "keeps running); null = no limit")
    poll_s: float = doc(2.0, "seconds between squeue/scontrol polls while following")
    signal_s: Optional[int] = doc(None, "#SBATCH --signal=B:USR2@<signal_s>: SLURM signals the "
                                        "batch shell this many seconds before the time limit; "
                                        "its trap writes RUN_DIR/STOP so every rank checkpoints "
                                        "and exits 0, then the shell requeues the job (see "
                                        "requeue, max_requeues). SLURM may signal up to 60 s "
                                        "earlier than asked, never later. null = a quarter of "
                                        "launcher.time, at most 120 s (00:02:00 -> 30 s); 0 = "
                                        "no signal line (the job just ends at its limit). A "
                                        "benchmark has no checkpoint: it gets neither the "
                                        "signal nor a requeue")
    requeue: bool = doc(True, "#SBATCH --requeue: the job may be requeued (by itself after "
                              "the time-limit signal, by an admin's `scontrol requeue`, by "
                              "preemption) and continues from its checkpoint "
                              "(train.resume=auto); false = --no-requeue, and no self-requeue")
    max_requeues: int = doc(3, "self-requeues after the time-limit signal, counted by "
                               "SLURM_RESTART_COUNT (requeues by the scheduler count too); once "
                               "reached the job ends with exit status 75 and says how to "
                               "continue (`sbatch RUN_DIR/job.sbatch`). 0 = never requeue itself")


@dataclass
class RunaiLauncherConfig(LauncherConfig):
    """`runai submit-dist pytorch`: RunAI pods, one torchrun per pod (the RCP recipe)."""

    job_name: Optional[str] = doc(None, "--name; null = derived from the run folder")
    project: Optional[str] = doc(None, "--project; null = the CLI's default project")
    image: Optional[str] = doc(None, "--image: the container image (must hold torch; "
                                     "ddp_lab too, or install it in setup)")
    gpus_per_node: int = doc(1, "--gpu: GPUs per pod")
    pvc: List[str] = doc([], "--pvc entries `claim:/mount`; the run folder "
                             "must be on one, at the same path")
    env: Dict[str, str] = doc({}, "-e NAME=VALUE environment variables of the pods")
    large_shm: bool = doc(True, "--large-shm: a large /dev/shm (NCCL "
                                "and DataLoader workers use it)")
    rdma: bool = doc(False, "RoCE: the network annotation + rdma extended "
                            "resource, and NCCL RDMA settings in the pod")
    rdma_annotation: str = doc("k8s.v1.cni.cncf.io/networks=kube-system/roce",
            "--annotation used when rdma=true")
    rdma_resource: str = doc("rdma/rdma=1", "--extended-resource used when rdma=true")
    extra_args: List[str] = doc([], "more `runai submit-dist pytorch` flags")
    rdzv: str = doc("static", "torchrun rendezvous in the pods: static "
                              "(RunAI's MASTER_ADDR/PORT, RANK as node rank) "
                              "| c10d (needed for max_restarts)")
    wait: Optional[bool] = doc(None, "follow the pods' exit files in the run "
                                     "folder; null = when stdin is a terminal")
    wait_timeout_s: Optional[float] = doc(None, "stop following after this long (the job "
                                                "keeps running); null = no limit")
    poll_s: float = doc(5.0, "seconds between looks at the run folder while following")


# -------------------------------------------------------------------- sync
#: sync.compress: what gradients travel as (ddp_lab/sync/_wire.py for ours, sync/ddp.py for DDP)
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
def _size(value: Any) -> bool:
    """Whether `value` is a layer size: an int >= 1 (True is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def widths(hidden: Any) -> list[int]:
    """`model.hidden` as a list of layer widths: one int or a list of them, each >= 1."""
    ws = [hidden] if isinstance(hidden, int) else list(hidden)
    if not ws or not all(map(_size, ws)):
        raise ValueError(f"model.hidden={hidden}: give a width >= 1 or a list of them, "
                         "e.g. model.hidden=[2048,2048]")
    return ws


@dataclass
class ModelConfig:
    name: str = doc(MISSING, "mlp | mlp_wide | cnn | resnet18")

    @classmethod
    def check(cls, cfg: Any) -> None:
        """Raise ValueError, with the fix, for sizes the model cannot be built with."""


@dataclass
class MLPConfig(ModelConfig):
    """The course notebook's 784-50-10 ReLU network."""

    hidden: Any = doc(50, "hidden layer widths: one int (784-h-10) or a "
                          "list, e.g. [2048,2048] (784-2048-2048-10)")

    @classmethod
    def check(cls, cfg: Any) -> None:
        hidden = cfg.hidden
        widths(OmegaConf.to_object(hidden) if OmegaConf.is_config(hidden) else hidden)


@dataclass
class ResNet18Config(ModelConfig):
    """torchvision's ResNet-18 adapted to 1x28x28 digits (3x3 stem, no max-pool)."""


@dataclass
class CNNConfig(ModelConfig):
    """A small convolutional network."""

    channels1: int = doc(16, "channels of the first conv layer")
    channels2: int = doc(32, "channels of the second conv layer")
    hidden: int = doc(64, "units of the fully connected layer")

    @classmethod
    def check(cls, cfg: Any) -> None:
        for key in ("channels1", "channels2", "hidden"):
            if not _size(cfg[key]):
                raise ValueError(f"model.{key}={cfg[key]}: must be an integer >= 1 "
                                 f"(default {getattr(cls, key)})")


# -------------------------------------------------------------------- data
@dataclass
class DataConfig:
    name: str = doc("mnist", "dataset name (only mnist)")
    root: str = doc("data", "dataset folder; relative paths are "
                            "resolved on the submitting machine")
    mirrors: List[str] = doc(["embedded"], "where to fetch the raw files from, in order: "
                                           "'embedded' (the copy in the package), a local "
                                           "folder, or an http(s):// base URL")
    node_local: bool = doc(False, "true: root is node-local storage, local "
                                  "rank 0 of every node fetches it")
    pipeline: str = doc("tensor", "tensor: the split as one normalised tensor on the device "
                                  "| dataloader: DataLoader + DistributedSampler")
    num_workers: int = doc(0, "DataLoader worker processes (dataloader pipeline only)")
    normalize: bool = doc(True, "standardise pixels with the MNIST mean/std "
                                "(false: [0,1] as ToTensor gives)")


# ------------------------------------------------------------------- optim
@dataclass
class OptimConfig:
    name: str = doc(MISSING, "adam | sgd (the learning rate is train.lr)")
    weight_decay: float = doc(0.0, "L2 penalty")
    fused: bool = doc(True, "one fused kernel for the whole update (CPU and "
                            "CUDA); false = torch's per-tensor loop")


@dataclass
class AdamConfig(OptimConfig):
    betas: List[float] = doc([0.9, 0.999], "Adam's moment decay rates")
    eps: float = doc(1e-8, "Adam's denominator epsilon")


@dataclass
class SGDConfig(OptimConfig):
    momentum: float = doc(0.0, "momentum factor")
    nesterov: bool = doc(False, "Nesterov momentum")


# ------------------------------------------------------------ fixed sections
@dataclass
class TrainConfig:
    epochs: int = doc(5, "passes over the training set")
    batch_size: int = doc(64, "samples per step and per rank (weak "
                              "scaling; ignored when global_batch > 0)")
    global_batch: int = doc(0, "samples of one optimiser step over all ranks "
                               "(strong scaling: each rank takes global_batch / "
                               "world); 0 = off, train.batch_size is per rank")
    micro_batch: int = doc(0, "most samples per rank in one forward/backward; a larger per-rank "
                              "batch is split into per_rank / micro_batch micro-steps whose "
                              "gradients accumulate (one sync per step); 0 = no limit")
    lr: float = doc(1e-3, "learning rate")
    seed: int = doc(0, "seed of weights and shuffling (the same on every rank)")
    max_steps_per_epoch: int = doc(0, "0 = the whole shard; >0 stops each "
                                      "epoch early (quick checks)")
    eval_batch_size: int = doc(1000, "samples per evaluation batch")
    checkpoint: bool = doc(True, "write a checkpoint at the end of every epoch "
                                 "(a graceful stop always writes one)")
    allow_world_change: bool = doc(False, "continue a weak-scaling run (global_batch=0) on "
                                          "another number of ranks: its global batch, and "
                                          "so every later step, changes (strong scaling "
                                          "keeps it and needs no consent)")
    resume: str = doc("auto", "auto: continue from run.dir's newest checkpoint if it "
                              "has one, else start fresh | true: continue, and fail "
                              "if there is no checkpoint | false: start fresh "
                              "(refused on a folder that holds results)")
    stop_signal: str = doc("SIGUSR2", "the user signal that stops every rank gracefully, like "
                                      "SIGTERM (SLURM sends it ahead of the time limit: "
                                      "launcher.signal_s); NCCL uses SIGUSR1; '' = none")
    stop_check_s: float = doc(1.0, "seconds between the ranks' agreements on "
                                   "whether to stop (one tiny all-reduce)")
    threads: int = doc(0, "torch CPU threads per rank; 0 = cores / local ranks")
    compile: bool = doc(False, "torch.compile the model the step calls (inductor), "
                               "compiled before the first epoch (summary.json compile_s); "
                               "numerics may differ from eager in the last bits")


@dataclass(frozen=True)
class BatchPlan:
    """How the samples of one optimiser step are split over ranks and micro-steps."""

    global_batch: int
    """samples of one optimiser step over all ranks"""
    per_rank: int
    """samples each rank takes per step"""
    micro: int
    """samples per forward/backward (= per_rank without accumulation)"""
    accumulation: int
    """forward/backward micro-steps per optimiser step (1 = none)"""
    scaling: str
    """strong (train.global_batch fixed) | weak (train.batch_size per rank fixed)"""


def batch_plan(train: Any, world_size: int) -> BatchPlan:
    """The batch plan of `train` (the train config section) on `world_size` ranks. Raises
    ValueError, one line naming the key and the fix, for a combination that cannot run:
    the submitting side checks it with the launcher's world size (validate.py), every rank
    again with the real one."""
    # (a hand-made section without the keys, as scripts and tests build, means both off)
    gb, micro = int(getattr(train, "global_batch", 0)), int(getattr(train, "micro_batch", 0))
    if gb < 0:
        raise ValueError(f"train.global_batch={gb}: must be >= 0 (0 = off: train.batch_size per rank)")
    if micro < 0:
        raise ValueError(f"train.micro_batch={micro}: must be >= 0 (0 = no per-rank limit)")
    if gb:
        if gb % world_size:
            lo = max(world_size, gb - gb % world_size)
            raise ValueError(
                f"train.global_batch={gb} is not divisible by the world size {world_size} "
                f"(the ranks of the launch: nodes x processes per node): use a multiple of "
                f"{world_size}, e.g. train.global_batch={lo} or {lo + world_size}")
        per_rank, scaling = gb // world_size, "strong"
    else:
        per_rank, scaling = int(train.batch_size), "weak"
    if micro and per_rank > micro and per_rank % micro:
        what = f"train.global_batch={gb} / {world_size} ranks" if gb else "train.batch_size"
        raise ValueError(
            f"train.micro_batch={micro} does not divide the per-rank batch {per_rank} "
            f"({what}): use a divisor of {per_rank}, e.g. train.micro_batch="
            f"{max(d for d in range(1, micro + 1) if per_rank % d == 0)}")
    steps = per_rank // micro if micro and per_rank > micro else 1
    return BatchPlan(global_batch=per_rank * world_size, per_rank=per_rank,
                     micro=per_rank // steps, accumulation=steps, scaling=scaling)


@dataclass
class DistConfig:
    backend: str = doc("auto", "auto (nccl with CUDA, else gloo) | gloo | nccl")
    device: str = doc("auto", "auto (cuda if available) | cpu | cuda")
    timeout_s: float = doc(120.0, "collective timeout: a dead or hung peer ends the "
                                  "job after this (plus a few s), never hangs")
    init_timeout_s: float = doc(300.0, "rendezvous and init_process_group: every "
                                       "rank must have joined within this")


def device_type(device: str, cuda_available: bool) -> str:
    """dist.device as the ranks will use it: auto = cuda where CUDA is available, else cpu
    (the ranks: distributed.choose_device; the submitting side, for a local launch:
    validate.py)."""
    if device == "auto":
        return "cuda" if cuda_available else "cpu"
    return device


@dataclass
class RunConfig:
    root: str = doc("outputs", "where run folders are created")
    dir: Optional[str] = doc(None, "the run folder; null = <root>/<name>_<date>_<time>; set it "
                                   "to resume a run")
    name: Optional[str] = doc(None, "what a new run folder is named by; null = what differs: in "
                                    "a -m sweep the swept values (ring_sgd), else sync, world, "
                                    "model and any non-default group (ring_w2_mlp_sgd)")
    entry: str = doc("ddp_lab.worker", "the module every rank runs as `python -m <entry> "
                                       "RUN_DIR` (ddp_lab.bench.worker for benchmarks)")


@dataclass
class LogConfig:
    progress: str = doc("auto", "how the steps of an epoch show as they go: auto (a bar where "
                                "stdout and stderr are a terminal, else lines) | bar | lines "
                                "(one every progress_every_s: files, pipes, SLURM .out)")
    progress_every_s: float = doc(10.0, "with lines: the most seconds of an epoch without a "
                                        "line (steps done, rate, time left); 0 = none")
    level: str = doc("INFO", "python logging level of the console")
    ranks: str = doc("0", "whose lines reach the console: 0 (rank 0's; the others' "
                          "errors only) | all (every rank's, each line prefixed "
                          "[rank N], as torchrun --tee 3 shows them)")


@dataclass
class TimingConfig:
    """Per-step phase and communication timing."""

    enabled: bool = doc(True, "time every phase of every step and every "
                              "collective (false: only epoch wall time and bytes, "
                              "to measure what the timers themselves cost)")
    trace: bool = doc(True, "write trace/rank<N>.json and trace/all.json "
                            "(Chrome trace events: ui.perfetto.dev)")
    trace_steps: int = doc(10, "steps of each epoch in the trace: the first N and the last N")
    tb_every: int = doc(10, "TensorBoard per-step scalars (step time, sync, "
                            "compute, comm in flight and exposed) every N "
                            "steps, written as the steps go; 0 = none")


@dataclass
class DebugConfig:
    """Fault and delay injection, to see what the measurements make of them."""

    slow_rank: int = doc(-1, "the rank whose compute is delayed every "
                             "step (-1 = none): a straggler")
    slow_ms: float = doc(0.0, "milliseconds added to slow_rank's compute every step")
    jitter_ms: float = doc(0.0, "every rank's compute is delayed by a random "
                                "0..jitter_ms every step (0 = none)")


@dataclass
class StudyConfig:
    """A scaling study: every world size of `worlds`, `repeats` times, one run folder per
    point under one study folder, then the report (ddp_lab/measure/study.py, docs/scaling.md)."""

    name: str = doc("scaling", "the study kind (conf/study/<name>.yaml)")
    worlds: List[int] = doc([1, 2, 4], "world sizes (ranks) of the ladder, e.g. [1,2,4,8]")
    repeats: int = doc(3, "runs of every world size (repeats give the "
                          "report its spread and intervals)")
    order: str = doc("interleaved", "interleaved (1,2,4,1,2,4,...: drift hits every "
                                    "world alike) | grouped (1,1,2,2,4,4)")
    report: bool = doc(True, "build the report (`python -m ddp_lab.report` on the study folder) "
                             "at the end")


@dataclass
class Config:
    launcher: LauncherConfig = MISSING
    sync: SyncConfig = MISSING
    model: ModelConfig = MISSING
    data: DataConfig = MISSING
    optim: OptimConfig = MISSING
    train: TrainConfig = field(default_factory=TrainConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    run: RunConfig = field(default_factory=RunConfig)
    log: LogConfig = field(default_factory=LogConfig)
    timing: TimingConfig = field(default_factory=TimingConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    study: Optional[StudyConfig] = doc(None, "`study=scaling`: run a ladder of world sizes "
                                             "(ddp_lab/measure/study.py); null = one run")
    study_point: Optional[Dict[str, Any]] = doc(None, "set by a study in each point's config "
                                                      "({id, world, repeat, index}); the "
                                                      "trainer copies it into summary.json "
                                                      "`study`. Not for users.")


# group -> option -> schema: the options the config accepts. Adding an option = one
# dataclass here + one YAML in conf/ + the implementation in its kind's registry
# (launch.LAUNCHERS, sync.SYNCS, models.MODELS / OPTIMIZERS); tests/test_registry.py
# checks that each kind's registry names exactly these options.
SCHEMAS: dict[str, Registry[type]] = {
    "launcher": Registry("launcher", {
        "local": LocalLauncherConfig, "mpirun": MpirunLauncherConfig,
        "slurm": SlurmLauncherConfig, "runai": RunaiLauncherConfig}),
    "sync": Registry("sync", {
        "ddp": DDPSyncConfig, "naive": NaiveSyncConfig, "allreduce": BucketSyncConfig,
        "reduce_broadcast": ReduceBroadcastSyncConfig, "ring": RingSyncConfig,
        "tree": BucketSyncConfig, "butterfly": BucketSyncConfig,
        "hierarchical": HierarchicalSyncConfig, "zero1": Zero1SyncConfig}),
    "model": Registry("model", {"mlp": MLPConfig, "mlp_wide": MLPConfig, "cnn": CNNConfig,
                                "resnet18": ResNet18Config}),
    "data": Registry("data", {"mnist": DataConfig}),
    "optim": Registry("optim", {"adam": AdamConfig, "sgd": SGDConfig}),
}

CONF_DIR = conf_dir()  # checkout or installed wheel (ddp_lab/resources.py)


# the groups each entry point accepts, as `--help` lists them (`${ddp_lab_groups:<app>}` in
# conf/<app>.yaml's help template); Hydra's own listing would also show `schema/*` and,
# for the trainer, the bench presets
HELP_GROUPS = {"config": ("launcher", "sync", "model", "data", "optim", "cluster", "study"),
               "bench": ("launcher", "bench", "cluster")}


def group_options(group: str) -> list[str]:
    """A group's options: its registry, or the YAML presets of conf/<group>/ (cluster, bench)."""
    if group in SCHEMAS:
        return list(SCHEMAS[group])
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


def help_groups(app: str) -> str:
    return "\n".join(f"{g}: {', '.join(group_options(g))}" for g in HELP_GROUPS[app])


def register_configs() -> None:
    """Register the schema nodes; conf/<group>/<name>.yaml starts from `/schema/<group>/<name>`."""
    OmegaConf.register_new_resolver("ddp_lab_groups", help_groups, replace=True)
    OmegaConf.register_new_resolver("ddp_lab_keys", help_keys, replace=True)
    cs = ConfigStore.instance()
    cs.store(group="schema", name="config", node=Config)
    for group, options in SCHEMAS.items():
        for option, schema in options.items():
            # kept in their own group so `sync=` error messages list only real options
            cs.store(group=f"schema/{group}", name=option, node=schema)
    # a study is optional (study: null): not in SCHEMAS, whose groups every run has
    cs.store(group="schema/study", name="scaling", node=StudyConfig)


def schema_for(group: str, name: str) -> type:
    return SCHEMAS[group].get(name)  # UnknownName lists the valid options


def with_defaults(cfg: Any) -> Any:
    """A sync section as plain as `OmegaConf.create({"name": "ring", "bucket_mb": 1})` (the
    tests', a script's) completed with its schema's defaults, so keys added since
    (overlap, compress, ...) read as their defaults; a composed config (typed by its
    schema already) comes back as it is."""
    if not isinstance(cfg, DictConfig) or OmegaConf.get_type(cfg) is not dict:
        return cfg
    base = OmegaConf.structured(schema_for("sync", cfg.name))
    OmegaConf.set_struct(base, False)  # keys the schema lacks stay as given
    return OmegaConf.merge(base, cfg)


def check_model(cfg: Any) -> None:
    """Raise ValueError (with the fix) if model section `cfg` cannot be built."""
    schema_for("model", cfg.name).check(cfg)


def check_sync(cfg: Any, world_size: int) -> None:
    """Raise ValueError (with the fix) if sync section `cfg` cannot run on `world_size`
    ranks: its schema's `check`. Needs no torch, so the submitting side runs it."""
    schema_for("sync", cfg.name).check(with_defaults(cfg), world_size)


def load_run_config(run_dir: str | Path) -> DictConfig:
    """Read a run folder's resolved config.yaml back, typed by the schema."""
    raw = OmegaConf.load(Path(run_dir) / "config.yaml")
    cfg = OmegaConf.structured(Config)
    for group in SCHEMAS:
        node: Any = raw.get(group)
        if node is None:
            raise ValueError(f"{run_dir}/config.yaml has no '{group}' section")
        cfg[group] = OmegaConf.structured(schema_for(group, node.get("name", "mnist")))
    merged = OmegaConf.merge(cfg, raw)
    OmegaConf.set_readonly(merged, True)
    return merged


def compose(overrides: list[str], config_name: str = "config") -> DictConfig:
    """The trainer's config as `python -m ddp_lab <overrides>` composes it, from Python
    (benchmark scripts that run the trainer's pieces in their own processes)."""
    register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hydra_compose(config_name=config_name, overrides=overrides)
