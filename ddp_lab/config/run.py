"""The schemas of how a run runs: dist, run, log, timing, debug, study."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from .help import doc


@dataclass
class DistConfig:
    backend: str = doc("auto", "auto (nccl with CUDA, else gloo) | gloo | nccl")
    device: str = doc("auto", "auto (cuda if available) | cpu | cuda")
    timeout_s: float = doc(120.0, "collective timeout: a dead or hung peer ends the "
                                  "job after this (plus a few s), never hangs")
    init_timeout_s: float = doc(300.0, "rendezvous and init_process_group: every "
                                       "rank must have joined within this")


def device_type(device: str, cuda_available: bool) -> str:
    """dist.device as the ranks will use it: auto = cuda where CUDA is available, else cpu."""
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
    """Fault and delay injection, to see what the measurements make of them."""

    slow_rank: int = doc(-1, "the rank whose compute is delayed every "
                             "step (-1 = none): a straggler")
    slow_ms: float = doc(0.0, "milliseconds added to slow_rank's compute every step")
    jitter_ms: float = doc(0.0, "every rank's compute is delayed by a random "
                                "0..jitter_ms every step (0 = none)")


def debug_problem(debug: DebugConfig, world_size: int) -> Optional[str]:
    """Why the debug section cannot run on `world_size` ranks (one line with the fix); the delays
    themselves: ddp_lab/rank/epochs.py."""
    last = world_size - 1
    if not -1 <= debug.slow_rank <= last:
        return (f"debug.slow_rank={debug.slow_rank}: must be -1 (none) "
                f"or a rank, 0..{last} for this world of {world_size}")
    for key in ("slow_ms", "jitter_ms"):
        if debug[key] < 0:
            return f"debug.{key}={debug[key]}: must be >= 0 milliseconds (0 = none)"
        if debug[key] > 600_000:
            return f"debug.{key}={debug[key]}: must be <= 600000 milliseconds (ten minutes a step)"
    return None


@dataclass
class StudyConfig:
    """A scaling study: every world size of `worlds`, `repeats` times, one run folder per point
    under one study folder, then the report (ddp_lab/command/study.py, docs/scaling.md)."""

    name: str = doc("scaling", "the study kind (conf/study/<name>.yaml)")
    worlds: List[int] = doc([1, 2, 4], "world sizes (ranks) of the ladder, e.g. [1,2,4,8]")
    repeats: int = doc(3, "runs of every world size (repeats give the "
                          "report its spread and intervals)")
    order: str = doc("interleaved", "interleaved (1,2,4,1,2,4,...: drift hits every "
                                    "world alike) | grouped (1,1,2,2,4,4)")
    report: bool = doc(True, "build the report (`python -m ddp_lab.report` on the study folder) "
                             "at the end")
