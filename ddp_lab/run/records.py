"""The run folder's records as types: one `EpochRecord` per line of metrics.jsonl, one
`RunSummary` in summary.json. The trainer writes them (through `ddp_lab.run.telemetry`) and the
report reads them, so both sides agree on one shape.

Versioning: every record carries `schema_version`. A file written before versioning has
none and reads as version 0 (its keys are the same). Later versions only add fields, each
with a default, so an old file still reads; keys a reader does not know are kept in
`extra` and written back unchanged, so an older reader never drops a newer writer's data.
Stdlib only: the report reads runs without importing torch.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional, TypeVar

SCHEMA_VERSION = 1


def now_iso() -> str:
    """A record's timestamp (segments' start/end): local time with its offset, to the second."""
    return datetime.datetime.now(datetime.timezone.utc).astimezone().isoformat(timespec="seconds")


def read_metrics(path: Path) -> tuple[list[dict], list[tuple[int, str]]]:
    """metrics.jsonl's records (its JSON-object lines, in order) and the lines that are not
    one, with their numbers: a line torn by something outside the run (the trainer rewrites
    the file whole and atomically) costs its own record, never the reader. Every reader of
    the file (resume, status, report) comes through here. ([], []) when there is no file."""
    try:
        lines = Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return [], []
    records, bad = [], []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            rec = None
        if isinstance(rec, dict):
            records.append(rec)
        else:
            bad.append((number, line))
    return records, bad


R = TypeVar("R", bound="_Record")


@dataclass
class _Record:
    @classmethod
    def from_dict(cls: type[R], data: dict[str, Any]) -> R:
        """A record from its JSON object; unknown keys go to `extra`, a missing
        `schema_version` means a file written before versioning (0)."""
        if not isinstance(data, dict):
            raise ValueError(f"{cls.__name__}: expected a JSON object, got {type(data).__name__}")
        names = {f.name for f in fields(cls)} - {"extra"}
        known = {k: v for k, v in data.items() if k in names}
        known.setdefault("schema_version", 0)
        try:
            return cls(**known, extra={k: v for k, v in data.items() if k not in names})
        except TypeError as e:  # a required field is missing
            raise ValueError(f"{cls.__name__}: {e}") from None

    def to_dict(self) -> dict[str, Any]:
        """The JSON object: every field (None included, as readers expect every key), then
        the keys this version does not know."""
        out = dict(self.extra)
        out.update({f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"})
        return out


@dataclass
class EpochRecord(_Record):
    """One epoch, all ranks together (a line of metrics.jsonl)."""

    epoch: int  # 1-based: the epochs completed after this one
    world_size: Optional[int] = None
    train_loss: Optional[float] = None  # mean over every rank's samples
    train_accuracy: Optional[float] = None  # in [0, 1]: right predictions while training
    test_loss: Optional[float] = None
    test_accuracy: Optional[float] = None  # in [0, 1]
    epoch_time_s: Optional[float] = None  # barrier to barrier: the slowest rank's epoch
    samples_per_s: Optional[float] = None  # global training samples / epoch_time_s
    steps: int = 0  # steps per rank
    timing: bool = False  # phase timers on (phase_s filled, comm times measured)
    phase_s: dict = field(default_factory=dict)  # phase -> mean/median/p95/total seconds
    comm: dict = field(default_factory=dict)  # this rank's calls, bytes, in-flight time, bw
    comm_fraction: Optional[float] = None  # in-flight comm / step time
    # exposed vs in-flight comm (ddp_lab.timing): this rank's seconds summed over the epoch
    comm_exposed_s: Optional[float] = None  # in-flight comm after the step's compute end
    comm_exposed_fraction: Optional[float] = None  # exposed / step time
    comm_inflight_s: Optional[float] = None  # union of the collectives' intervals
    compute_s: Optional[float] = None  # forward + backward up to the last gradient ready
    overlap: Optional[bool] = None  # sync.overlap: collectives started during backward
    stragglers: dict = field(default_factory=dict)  # slowest/fastest rank, per-rank times,
    # each rank's share of steps arrived last at the collectives and its lateness then (ms)
    # the rank the others wait for, named from those (ddp_lab.timing.StragglerTally):
    # {rank, late_ms (median wait it costs the others), share (of steps it came last)} | None
    straggler: Optional[dict] = None
    # an epoch split by a graceful stop: steps before this one ran in an earlier allocation;
    # epoch_time_s and train_loss cover the whole epoch, phase_s and comm this part only
    resumed_at_step: Optional[int] = None
    compress: Optional[str] = None  # sync.compress: none | fp16 | bf16 | powersgd (bytes are the wire's)
    schema_version: int = SCHEMA_VERSION
    extra: dict = field(default_factory=dict)


@dataclass
class RunSummary(_Record):
    """The run in one object (summary.json). Every field has a default: a failed run's
    summary holds little more than its status."""

    status: Optional[str] = None  # running | completed | preempted | stopped | failed: <why>
    launcher: Optional[str] = None
    sync: Optional[str] = None
    compress: Optional[str] = None  # sync.compress; comm bytes (and algbw/busbw) are the wire's
    model: Optional[str] = None
    optim: Optional[str] = None
    backend: Optional[str] = None
    device: Optional[str] = None  # "cpu" or the GPU's name
    nodes: Optional[int] = None
    nproc_per_node: Optional[int] = None
    world_size: Optional[int] = None
    epochs: Optional[int] = None  # asked for
    epochs_run: Optional[int] = None  # trained by this invocation (fewer after a resume)
    start_epoch: Optional[int] = None
    batch_size: Optional[int] = None  # per rank, as used (global_batch / world in strong scaling)
    global_batch: Optional[int] = None  # samples of one optimiser step over all ranks
    scaling: Optional[str] = None  # strong (train.global_batch fixed) | weak (batch per rank fixed)
    micro_batch: Optional[int] = None  # samples per forward/backward (= batch_size without accumulation)
    accumulation: Optional[int] = None  # forward/backward micro-steps per optimiser step (1 = none)
    pipeline: Optional[str] = None
    test_accuracy: Optional[float] = None
    test_loss: Optional[float] = None
    train_loss: Optional[float] = None
    epoch_time_s_median: Optional[float] = None
    epoch_time_s_mean: Optional[float] = None
    comm_fraction: Optional[float] = None
    timing_enabled: Optional[bool] = None
    comm_time_s: Optional[float] = None
    comm_calls: Optional[int] = None
    comm_payload_bytes: Optional[int] = None
    comm_bytes_sent: Optional[int] = None  # bytes one rank sent over the run
    comm_bytes_recv: Optional[int] = None
    comm_bytes_exact: Optional[bool] = None
    # bytes one rank sent to another node over the run (sync=hierarchical; None: not known)
    comm_bytes_cross_node: Optional[int] = None
    comm_algbw_GBps: Optional[float] = None
    comm_busbw_GBps: Optional[float] = None
    # the run's exposed vs in-flight comm (sums over epochs, this rank; ddp_lab.timing)
    comm_exposed_s: Optional[float] = None
    comm_exposed_fraction: Optional[float] = None  # exposed / step time
    comm_inflight_s: Optional[float] = None
    compute_s: Optional[float] = None
    overlap: Optional[bool] = None  # sync.overlap
    step_time_ms_mean: Optional[float] = None
    steps_run: Optional[int] = None
    compiled: Optional[bool] = None  # train.compile: the step's model ran torch.compile'd
    compile_s: Optional[float] = None  # its compilation, before the first epoch (no epoch's)
    hosts: list = field(default_factory=list)
    node_ranks: list = field(default_factory=list)
    env_source: Optional[str] = None
    torch: Optional[str] = None
    # where the run stands (a stopped run continues from here) and why it stopped
    epochs_done: Optional[int] = None
    step_in_epoch: Optional[int] = None
    stop_reason: Optional[str] = None
    job_id: Optional[str] = None  # the scheduler's job id of the latest allocation
    # every allocation (SLURM job or requeue, pod set, local launch) the run used, in order:
    # job_id, restart, hosts, nodes, world_size, start/end (ISO), start_/end_ epoch and
    # step, epochs_done/steps_done in it, status when it ended
    segments: list = field(default_factory=list)
    # the allocation's fingerprint (ddp_lab.measure.fingerprint: hosts, CPU/GPU, versions, backend,
    # NCCL transport, env) and its short id, written by rank 0 at start
    fingerprint: dict = field(default_factory=dict)
    fingerprint_id: Optional[str] = None
    # the run is a point of a study (ddp_lab/measure/study.py): {id, world, repeat, index}
    study: Optional[dict] = None
    # the run's straggler, from all its epochs' steps ({rank, late_ms, share} | None) and
    # the delay injected (debug.slow_rank/slow_ms/jitter_ms; None when none)
    straggler: Optional[dict] = None
    injected_delay: Optional[dict] = None
    schema_version: int = SCHEMA_VERSION
    extra: dict = field(default_factory=dict)
