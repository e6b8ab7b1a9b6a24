"""The train section: its schema, batch plan and CUDA graph limits."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from omegaconf import DictConfig

from .help import doc


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
    """strong (train.global_batch fixed) | weak (train.batch_size per
    rank fixed)"""

    @property
    def micro_batch(self) -> int:
        """The micro-batch a step accumulates over, 0 if it takes its batch whole."""
        return self.micro if self.accumulation > 1 else 0


def batch_plan(train: TrainConfig, world_size: int) -> BatchPlan:
    """The batch plan of the train section on `world_size` ranks; ValueError, one line naming the
    key and the fix, for a combination that cannot run."""
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


#: the synchronisers whose step a CUDA graph can hold on nccl: the library's own collectives,
#: launched from this thread (not send/recv, not rooted calls with waits)
CUDA_GRAPH_SYNCS = ("ddp", "naive", "allreduce", "zero1")


def cuda_graph_problem(cfg: DictConfig, device: str, accumulation: int) -> Optional[str]:
    """Why train.cuda_graph=true cannot run `cfg`, or None: one line naming the key and the fix.
    `device`: dist.device as the ranks will see it; `accumulation`: micro-steps per optimiser step.
    A graph replays fixed kernels on fixed memory: nothing decided per step."""
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
