"""The schemas of what a run trains and how: model, data, optimiser, the
training loop (with the batch plan every rank applies), process group,
run folder, logging, timing, injected faults and a scaling study."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from .help import doc


def _size(value: Any) -> bool:
    """Whether `value` is a layer size: an int >= 1 (True is not
    one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def widths(hidden: Any) -> list[int]:
    """`model.hidden` as a list of layer widths: one int or a list of
    them, each >= 1."""
    ws = [hidden] if isinstance(hidden, int) else list(hidden)
    if not ws or not all(map(_size, ws)):
        raise ValueError(f"model.hidden={hidden}: give a width >= 1 or a list of them, "
                         "e.g. model.hidden=[2048,2048]")
    return ws


@dataclass
class ModelConfig:
    name: str = doc(MISSING, "mlp | mlp_wide | cnn | resnet18")

    @classmethod
    def check(cls, cfg: ModelConfig) -> None:
        """Raise ValueError, with the fix, for sizes the model cannot be
        built with."""


@dataclass
class MLPConfig(ModelConfig):
    """The course notebook's 784-50-10 ReLU network."""

    hidden: Any = doc(50, "hidden layer widths: one int (784-h-10) or a "
                          "list, e.g. [2048,2048] (784-2048-2048-10)")

    @classmethod
    def check(cls, cfg: MLPConfig) -> None:
        hidden = cfg.hidden
        widths(OmegaConf.to_object(hidden) if OmegaConf.is_config(hidden) else hidden)


@dataclass
class ResNet18Config(ModelConfig):
    """torchvision's ResNet-18 adapted to 1x28x28 digits (3x3 stem, no
    max-pool)."""


@dataclass
class CNNConfig(ModelConfig):
    """A small convolutional network."""

    channels1: int = doc(16, "channels of the first conv layer")
    channels2: int = doc(32, "channels of the second conv layer")
    hidden: int = doc(64, "units of the fully connected layer")

    @classmethod
    def check(cls, cfg: CNNConfig) -> None:
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
    fused: Optional[bool] = doc(None, "one fused kernel for the whole update; null = where "
                                      "the installed torch has it for the device (CPU: torch "
                                      ">= 2.4); false = torch's per-tensor loop")


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
    threads: int = doc(0, "torch CPU threads per rank; 0 = decided at start: at most the "
                          "free cores' share, 1 where that is as fast (ddp_lab/world/cpu.py)")
    compile: bool = doc(False, "torch.compile the model the step calls (inductor), "
                               "compiled before the first epoch (summary.json compile_s); "
                               "numerics may differ from eager in the last bits")
    cuda_graph: bool = doc(False, "capture the training step (forward, backward, the sync's "
                                  "collectives, the optimiser step) once as a CUDA graph "
                                  "after eager warm-up steps, then replay it: no kernel "
                                  "launches from the host. Needs dist.device=cuda and "
                                  "dist.backend=nccl; the step is timed whole")


@dataclass(frozen=True)
class BatchPlan:
    """How the samples of one optimiser step are split over ranks and
    micro-steps."""

    global_batch: int
    """samples of one optimiser step over all ranks"""
    per_rank: int
    """samples each rank takes per step"""
    micro: int
    """samples per forward/backward (= per_rank without accumulation)"""
    accumulation: int
    """forward/backward micro-steps per optimiser step (1 = none)"""
    scaling: str
    """strong (train.global_batch fixed) | weak (train.batch_size per
    rank fixed)"""

    @property
    def micro_batch(self) -> int:
        """The micro-batch a step accumulates over, 0 if it takes its
        batch whole."""
        return self.micro if self.accumulation > 1 else 0


def batch_plan(train: TrainConfig, world_size: int) -> BatchPlan:
    """The batch plan of the train section on `world_size` ranks;
    ValueError, one line naming the key and the fix, for a combination
    that cannot run."""
    # (a hand-made section without the keys, as scripts and tests build,
    # means both off)
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


#: the synchronisers whose step a CUDA graph can hold on nccl: the
#: library's own collectives, launched from this thread (not send/recv,
#: not rooted calls with waits)
CUDA_GRAPH_SYNCS = ("ddp", "naive", "allreduce", "zero1")


def cuda_graph_problem(cfg: DictConfig, device: str, accumulation: int) -> Optional[str]:
    """Why train.cuda_graph=true cannot run `cfg`, or None: one line
    naming the key and the fix. `device`: dist.device as the ranks will
    see it; `accumulation`: micro-steps per optimiser step. A graph
    replays fixed kernels on fixed memory: nothing decided per step."""
    if not cfg.train.get("cuda_graph", False):
        return None
    sync, key = cfg.sync, "train.cuda_graph=true"
    if device == "cpu" or cfg.dist.backend == "gloo":
        return (f"{key} with dist.device={cfg.dist.device} dist.backend={cfg.dist.backend}: "
                "CUDA graphs capture CUDA kernels: needs dist.device=cuda and "
                "dist.backend=nccl (or train.cuda_graph=false)")
    if sync.get("compress", "none") == "powersgd":
        return (f"{key} with sync.compress=powersgd: PowerSGD decides on the host every step "
                "(its warm-up iterations, which matrices to compress), which a graph cannot "
                "replay: use sync.compress=none, fp16 or bf16, or train.cuda_graph=false")
    hook = sync.get("hook", "none") if sync.name == "ddp" else "none"
    if hook not in ("none", "allreduce", "fp16", "bf16"):
        return (f"{key} with sync.hook={hook}: "
                + ("PowerSGD decides on the host every step" if hook == "powersgd" else
                   "ddp_lab's send/recv steps and waits are not captured in a graph")
                + ": use sync.hook=none, allreduce, fp16 or bf16, or train.cuda_graph=false")
    if sync.name not in CUDA_GRAPH_SYNCS:
        return (f"{key} with sync={sync.name}: its send/recv steps and waits are not captured "
                f"in a graph: use sync={', '.join(CUDA_GRAPH_SYNCS[:-1])} or "
                f"{CUDA_GRAPH_SYNCS[-1]} (the library's collectives), or train.cuda_graph=false")
    if sync.name != "ddp" and sync.get("overlap", False):
        return (f"{key} with sync={sync.name} sync.overlap=true: the overlap runs the "
                "collectives on a background thread, which a graph cannot capture: drop "
                "sync.overlap (or use sync=ddp, whose overlap is captured), or "
                "train.cuda_graph=false")
    if cfg.train.get("compile", False):
        return (f"{key} with train.compile=true: pick one (torch.compile's "
                "mode='reduce-overhead' makes CUDA graphs of its own): set train.compile=false")
    if accumulation > 1:
        return (f"{key} with train.micro_batch={cfg.train.micro_batch}: a step of "
                f"{accumulation} micro-steps is not captured: set train.micro_batch=0 (or a "
                "value >= the per-rank batch), or train.cuda_graph=false")
    return None


@dataclass
class DistConfig:
    backend: str = doc("auto", "auto (nccl with CUDA, else gloo) | gloo | nccl")
    device: str = doc("auto", "auto (cuda if available) | cpu | cuda")
    timeout_s: float = doc(120.0, "collective timeout: a dead or hung peer ends the "
                                  "job after this (plus a few s), never hangs")
    init_timeout_s: float = doc(300.0, "rendezvous and init_process_group: every "
                                       "rank must have joined within this")


def device_type(device: str, cuda_available: bool) -> str:
    """dist.device as the ranks will use it: auto = cuda where CUDA is
    available, else cpu."""
    return ("cuda" if cuda_available else "cpu") if device == "auto" else device


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
    tb_every: int = doc(50, "TensorBoard per-step scalars (step time, sync, "
                            "compute, comm in flight and exposed) every N "
                            "steps, written as the steps go (a run of fewer than "
                            "20 x N steps: 20 points); 0 = none")
    profile: bool = doc(False, "run torch.profiler over profile_steps steps of the first "
                               "epoch on every rank: profile/rank<N>.pt.trace.json "
                               "(Perfetto, HTA), the phases as ranges, the "
                               "witness table in the report (docs/timing.md)")
    profile_skip: int = doc(5, "with profile: steps of the first epoch run before the "
                               "profiler records (warm-up)")
    profile_steps: int = doc(40, "with profile: the steps it records (a first epoch "
                                 "shorter than profile_skip + this records what it has); "
                                 "fewer read one rank's ratio out of its band more often "
                                 "(docs/timing.md, \"How far they agree\")")


@dataclass
class DebugConfig:
    """Fault and delay injection, to see what the measurements make of
    them."""

    slow_rank: int = doc(-1, "the rank whose compute is delayed every "
                             "step (-1 = none): a straggler")
    slow_ms: float = doc(0.0, "milliseconds added to slow_rank's compute every step")
    jitter_ms: float = doc(0.0, "every rank's compute is delayed by a random "
                                "0..jitter_ms every step (0 = none)")


def debug_problem(debug: DebugConfig, world_size: int) -> Optional[str]:
    """Why the debug section cannot run on `world_size` ranks (one line
    with the fix); the delays themselves: ddp_lab/rank/delay.py."""
    last = world_size - 1
    if not -1 <= debug.slow_rank <= last:
        return (f"debug.slow_rank={debug.slow_rank}: must be -1 (none) "
                f"or a rank, 0..{last} for this world of {world_size}")
    for key in ("slow_ms", "jitter_ms"):
        ms = debug[key]
        if ms < 0:
            return (f"debug.{key}={ms}: must be >= 0 milliseconds "
                    "(0 = none)")
    return None


@dataclass
class StudyConfig:
    """A scaling study: every world size of `worlds`, `repeats` times,
    one run folder per point under one study folder, then the report
    (ddp_lab/command/study.py, docs/scaling.md)."""

    name: str = doc("scaling", "the study kind (conf/study/<name>.yaml)")
    worlds: List[int] = doc([1, 2, 4], "world sizes (ranks) of the ladder, e.g. [1,2,4,8]")
    repeats: int = doc(3, "runs of every world size (repeats give the "
                          "report its spread and intervals)")
    order: str = doc("interleaved", "interleaved (1,2,4,1,2,4,...: drift hits every "
                                    "world alike) | grouped (1,1,2,2,4,4)")
    report: bool = doc(True, "build the report (`python -m ddp_lab.report` on the study folder) "
                             "at the end")
