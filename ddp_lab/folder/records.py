"""The run folder's records as types: one `EpochRecord` per line of metrics.jsonl, one `RunSummary`
in summary.json; the trainer writes them and the report reads them. Every record carries
`schema_version` (none: 0); later versions only add fields with defaults, and unknown keys are kept
in `extra` and written back unchanged. Stdlib only.
"""

from __future__ import annotations

import datetime
import json
import statistics
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Optional, TypeVar

SCHEMA_VERSION = 1


def now_iso() -> str:
    """A record's timestamp (segments' start/end): local time with its offset, to the second."""
    return datetime.datetime.now(datetime.timezone.utc).astimezone().isoformat(timespec="seconds")


def read_metrics(path: Path) -> tuple[list[dict], list[tuple[int, str]]]:
    """metrics.jsonl's JSON-object lines, in order, and the others with their numbers (a torn line
    costs its own record, never the reader); ([], []) without a file."""
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
        """A record from its JSON object; unknown keys into `extra`, no schema_version: 0."""
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
        """The JSON object: every field (None included, as readers expect every key), then the keys
        this version does not know."""
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
    # exposed vs in-flight comm (ddp_lab.timing), this rank's seconds summed over the epoch: the
    # in-flight comm after the step's compute end, its share of the step, the collectives' union
    comm_exposed_s: Optional[float] = None
    comm_exposed_fraction: Optional[float] = None
    comm_inflight_s: Optional[float] = None
    compute_s: Optional[float] = None  # forward + backward up to the last gradient ready
    overlap: Optional[bool] = None  # sync.overlap: collectives started during backward
    # slowest/fastest rank, per-rank times, each rank's share of steps arrived last at the
    # collectives and its lateness then (ms)
    stragglers: dict = field(default_factory=dict)
    # the rank the others wait for, named from those (ddp_lab.timing.StragglerTally): {rank,
    # late_ms (median wait it costs the others), share (of steps it came last)} | None
    straggler: Optional[dict] = None
    # an epoch split by a graceful stop: steps before this one ran in an earlier allocation;
    # epoch_time_s and train_loss cover the whole epoch, phase_s and comm this part only
    resumed_at_step: Optional[int] = None
    compress: Optional[str] = None  # sync.compress: none | fp16 | bf16 | powersgd (wire bytes)
    # this rank's seconds in the steps this record timed (phase `step`'s total; with timing off,
    # the loop's busy time): the denominator of the run's comm_fraction and step time
    step_time_s: Optional[float] = None
    # the steps whose phases were stamped (docs/timing.md, "Which steps are sampled"): phase_s's
    # phases, compute_s and comm_exposed_s rest on them, scaled to every step; None: timing off
    steps_sampled: Optional[int] = None
    schema_version: int = SCHEMA_VERSION
    extra: dict = field(default_factory=dict)


@dataclass
class RunSummary(_Record):
    """The run in one object (summary.json); every field has a default."""

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
    # per rank, as used (global_batch / world in strong scaling)
    batch_size: Optional[int] = None
    global_batch: Optional[int] = None  # samples of one optimiser step over all ranks
    # strong (train.global_batch fixed) | weak (batch per rank fixed)
    scaling: Optional[str] = None
    # samples per forward/backward (= batch_size without accumulation)
    micro_batch: Optional[int] = None
    # forward/backward micro-steps per optimiser step (1 = none)
    accumulation: Optional[int] = None
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
    # train.cuda_graph: the step replayed as one CUDA graph, timed whole
    cuda_graph: Optional[bool] = None
    # sync=ddp: DDP's own timing in seconds beside ours (docs/timing.md, Independent witnesses)
    ddp_timing: Optional[dict] = None
    # timing.profile: each rank's figures for the profiled steps, ours and the trace's
    witnesses: Optional[dict] = None
    hosts: list = field(default_factory=list)
    node_ranks: list = field(default_factory=list)
    env_source: Optional[str] = None
    torch: Optional[str] = None
    # where the run stands (a stopped run continues from here) and why it stopped
    epochs_done: Optional[int] = None
    step_in_epoch: Optional[int] = None
    stop_reason: Optional[str] = None
    job_id: Optional[str] = None  # the scheduler's job id of the latest allocation
    # every allocation the run used, in order: job id, hosts, start/end, epochs and steps done in
    # it, how it ended (docs/failures.md, "The pieces")
    segments: list = field(default_factory=list)
    # the allocation's fingerprint (ddp_lab.world.fingerprint) and its short id
    fingerprint: dict = field(default_factory=dict)
    fingerprint_id: Optional[str] = None
    # the run is a point of a study (ddp_lab/command/study.py): {id, world, repeat, index}
    study: Optional[dict] = None
    # the run's straggler over all its steps ({rank, late_ms, share}) and the injected delay
    straggler: Optional[dict] = None
    injected_delay: Optional[dict] = None
    # bytes one rank holds at the end (Synchroniser.memory; zero1: its shard's state only)
    memory_param_bytes: Optional[int] = None
    memory_grad_bytes: Optional[int] = None
    memory_optimizer_state_bytes: Optional[int] = None
    # every rank's optimiser state bytes, in rank order (torch_zero's shards are uneven)
    memory_optimizer_state_bytes_per_rank: Optional[list] = None
    # sha256 of the final weights (the run folder's model.pt; ddp_lab/folder/weights.py)
    weights_sha256: Optional[str] = None
    # the module the ranks ran (run.entry) when it is not the trainer, and whether it kept records:
    # a run.entry of the user's (ddp_lab.rank.one_file) writes none, so the command that launched
    # it writes this summary from its exit status (command/job.py: collect)
    entry: Optional[str] = None
    records_kept: Optional[bool] = None
    schema_version: int = SCHEMA_VERSION
    extra: dict = field(default_factory=dict)


# ------------------------------------------------------------------ the run's figures
def run_figures(epochs: list[dict]) -> dict[str, Any]:
    """The run's figures from its epochs' records (every allocation's): the one place each is
    derived, for summary.json, the console, TensorBoard and the report. Epoch times over every
    epoch; comm sums over the timed steps (`steps_run`), its fraction and busbw too."""
    recs = sorted((r for r in epochs if r.get("epoch")), key=lambda r: r["epoch"])
    times = [float(r["epoch_time_s"]) for r in recs if r.get("epoch_time_s") is not None]
    timing = bool(recs) and all(r.get("timing") for r in recs)
    comms = [r.get("comm") or {} for r in recs]

    def total(key: str, of=comms) -> float:
        return sum(c.get(key) or 0 for c in of)

    steps = sum(int(r.get("steps") or 0) - int(r.get("resumed_at_step") or 0) for r in recs)
    # a record's seconds in its timed steps: `step_time_s`, else phase `step`'s total
    step_s = sum(float(r["step_time_s"]) if r.get("step_time_s") is not None
                 else float(((r.get("phase_s") or {}).get("step") or {}).get("total") or 0.0)
                 for r in recs)
    comm_s = total("time_s")
    # busbw mixes ops through their bus bytes; a record written before they were kept gives them
    # back from its busbw x time
    bus = sum(c["bus_bytes"] if c.get("bus_bytes") is not None
              else (c.get("busbw_GBps") or 0) * (c.get("time_s") or 0) * 1e9 for c in comms)
    cross = [c.get("bytes_cross_node") for c in comms]
    exposed = sum(r.get("comm_exposed_s") or 0 for r in recs)
    timed = timing and comm_s > 0

    def share(part: float) -> Optional[float]:
        return min(1.0, part / step_s) if timing and step_s > 0 else None

    return {
        "epoch_time_s_median": statistics.median(times) if times else None,
        "epoch_time_s_mean": statistics.fmean(times) if times else None,
        "comm_fraction": share(comm_s),
        "timing_enabled": timing,
        "comm_time_s": comm_s if timing else None,
        "comm_calls": int(total("calls")), "comm_payload_bytes": int(total("payload_bytes")),
        "comm_bytes_sent": int(total("bytes_sent")), "comm_bytes_recv": int(total("bytes_recv")),
        "comm_bytes_exact": bool(comms) and all(c.get("bytes_exact") for c in comms),
        "comm_bytes_cross_node": (int(sum(cross)) if cross and None not in cross else None),
        "comm_algbw_GBps": total("payload_bytes") / comm_s / 1e9 if timed else None,
        "comm_busbw_GBps": bus / comm_s / 1e9 if timed else None,
        "comm_exposed_s": exposed if timing else None,
        "comm_exposed_fraction": share(exposed),
        "comm_inflight_s": comm_s if timing else None,
        "compute_s": sum(r.get("compute_s") or 0 for r in recs) if timing else None,
        "step_time_ms_mean": 1e3 * step_s / steps if steps else None,
        "steps_run": steps,
    }
