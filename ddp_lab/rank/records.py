"""train()'s records part for a run folder (ddp_lab/train.py; docs/architecture.md, "The path of
one epoch's numbers"). `Records` is the part: it starts the run's `Telemetry` and profiler, and at
the end writes model.pt and the `RunSummary`. `Telemetry` builds each `EpochRecord` and writes it to
metrics.jsonl, TensorBoard, the console and the Chrome trace. Every rank calls every method in the
same order (some are collectives); only the logging rank's sink writes. The trace (`TraceWriter`):
`trace/rank<N>.json` per rank, pid = rank, tid = rank for the phases and 1000 + rank for the
collectives, `trace/all.json` at the end; of each epoch only the first and last `trace_steps`
steps (docs/timing.md, "What is written").
"""

from __future__ import annotations

import json
import logging
import os
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Optional, Sequence

import torch
from omegaconf import OmegaConf
from tqdm import tqdm

from ..config import BatchPlan, Config, DebugConfig, batch_plan
from ..folder import doctor as doctor_records
from ..folder import weights as weights_file
from ..folder.description import describe_run
from ..folder.files import atomic_write_text, read_json_or_empty
from ..folder.metrics import make_sink
from ..folder.records import EpochRecord, RunSummary, now_iso, run_figures
from ..folder.tensorboard import (RUN_METRICS, length_extras, run_name, step_stride, workload,
                                  writer_name)
from ..timing import (PHASES, CommCall, CommStats, StepTimer, StepTimes, StepWatch,
                      StragglerTally, epoch_timing, stragglers)
from ..world import cpu, torch_support
from ..world import fingerprint as fingerprints
from ..world.distributed import DistContext
from ..world.env import allocation, hostname, startup_s
from .profile import StepProfiler, ddp_timing, make_profiler

log = logging.getLogger("ddp_lab")


@dataclass
class Position:
    """Where a run stands: epochs done, steps done of the next epoch, and that partial epoch's sums
    so far (kept in a mid-epoch checkpoint)."""

    epoch: int = 0
    step: int = 0
    loss_sum: float = 0.0
    samples: int = 0
    busy_s: float = 0.0
    wall_s: float = 0.0
    correct: int = 0


@dataclass
class MeasuredEpoch:
    """One epoch as this rank measured it (`epoch`: 1-based). Resumed mid-way, the fields are this
    allocation's part, `resumed_part` the checkpoint's (its loss and sample sums on rank 0 only)."""

    epoch: int
    # this part's phase stamps (none when timing is off) and collectives
    steps: list[StepTimes]
    comm: CommStats
    # this rank's own time, before waiting for the others; barrier to barrier (the slowest rank's)
    busy_s: float
    wall_s: float
    # this rank's training loss summed over its samples, its correct predictions
    loss_sum: float
    samples: int
    correct: int = 0
    resumed_at_step: int = 0
    resumed_part: Position = field(default_factory=Position)
    test: tuple[float, float] = (float("nan"), float("nan"))  # (loss, accuracy)

    def totals(self) -> tuple[float, int, int, float, float]:
        """The whole epoch on this rank: (loss sum, correct, samples, busy s, wall s)."""
        c = self.resumed_part
        return (c.loss_sum + self.loss_sum, c.correct + self.correct, c.samples + self.samples,
                c.busy_s + self.busy_s, c.wall_s + self.wall_s)


class Records:
    """The records of one run on this rank; see the module docstring."""

    def __init__(self, cfg: Config, ctx: DistContext, run_dir: Path):
        self.cfg, self.ctx, self.run_dir = cfg, ctx, run_dir
        self.telemetry: Optional[Telemetry] = None
        self.profiler: Optional[StepProfiler] = None

    def start(self, start: Position, timer: StepTimer, parts: Any, splits: Any,
              compile_s: Optional[float]) -> None:
        """Collective. The run starts at `start`: drop records past it, record the config."""
        cfg, ctx = self.cfg, self.ctx
        # None when timing.profile is off: nothing wrapped
        self.profiler = make_profiler(cfg.timing, ctx.env.rank, ctx.device, self.run_dir,
                                      timer, parts.syncer)
        # the shard's batches, or train.max_steps_per_epoch of them
        n, most = len(splits.train), cfg.train.max_steps_per_epoch
        self.telemetry = Telemetry(cfg, ctx, self.run_dir, min(n, most) if most > 0 else n,
                                   parts.syncer.bytes_exact, compile_s=compile_s, timer=timer,
                                   syncer=parts.syncer, profiler=self.profiler)
        self.telemetry.start(start.epoch, start.step)

    def step_numbers(self, epoch: int, first_step: int = 0) -> Iterable:
        return self.telemetry.step_numbers(epoch, first_step)

    def steps_measured(self, times: list[StepTimes], comm: CommStats) -> None:
        """An epoch's steps and calls: the profiler's window ends here at the latest."""
        if self.profiler is not None:
            self.profiler.measured(times, comm)

    def epoch(self, measured: MeasuredEpoch, test: tuple[float, float]) -> None:
        """Collective. An epoch ended with this test loss and accuracy."""
        measured.test = test
        self.telemetry.epoch(measured)

    def finish(self, parts: Any) -> RunSummary:
        """Collective. The run's end: model.pt (the report compares runs by it; its digest is
        summary.json's `weights_sha256`), then summary.json."""
        # collective: fsdp2 gathers its shards
        state = parts.syncer.model_state()
        weights = weights_file.save(self.run_dir, state) if self.ctx.env.is_main else None
        return self.telemetry.finish(memory=memory_per_rank(parts, self.ctx),
                                     weights_sha256=weights)

    def stopped(self, parts: Any, saved: dict,
                measured: Optional[MeasuredEpoch] = None) -> RunSummary:
        """Collective. A stop ended the run where `saved` (`Checkpointer.save_stop`) says."""
        return self.telemetry.finish(**saved, memory=memory_per_rank(parts, self.ctx))

    def finished(self, epochs_done: int) -> RunSummary:
        """A run that has done all its epochs, started again: as it is."""
        log.info("the run in %s has completed its %d epochs: nothing to do",
                 self.run_dir, epochs_done)
        return RunSummary.from_dict(read_json_or_empty(self.run_dir / "summary.json"))


def memory_per_rank(parts: Any, ctx: DistContext) -> dict:
    """Collective: this rank's bytes and every rank's optimiser state (a sharded one's shards)."""
    mine = parts.syncer.memory(parts.optimizer)
    every = ctx.gather_objects(mine["optimizer_state_bytes"])
    return {**mine, "optimizer_state_bytes_per_rank": [int(b) for b in every]}


class Telemetry:
    """The records of one run on this rank; see the module docstring."""

    def __init__(self, cfg: Config, ctx: DistContext, run_dir: Path, steps_per_epoch: int,
                 bytes_exact: bool, compile_s: Optional[float] = None,
                 timer: Optional[StepTimer] = None, syncer: Any = None,
                 profiler: Optional[StepProfiler] = None):
        """`timer` and `syncer`'s recorder: where the live TensorBoard points are read from;
        `compile_s`: train.compile's compilation, outside every epoch."""
        self.cfg, self.ctx, self.run_dir = cfg, ctx, run_dir
        self.steps_per_epoch, self.bytes_exact = steps_per_epoch, bytes_exact
        self.timing = bool(cfg.timing.enabled)
        self.plan = batch_plan(cfg.train, ctx.env.world_size)
        self.sink = make_sink(run_dir, enabled=ctx.env.is_main)
        self.trace = TraceWriter(run_dir, ctx.env.rank, cfg.timing.trace_steps,
                                 enabled=self.timing and cfg.timing.trace)
        # every epoch's record on the logging rank, earlier allocations' too
        self.records: list[dict] = []
        self.done: list[EpochRecord] = []  # this allocation's epochs
        self.stragglers_run = StragglerTally(ctx.env.world_size)
        self.compile_s = compile_s
        self.start_epoch, self.start_step = 0, 0
        # this allocation's and the earlier ones' (summary.json `segments`), the summary before
        self.segments: list[dict] = []
        self.previous: dict = {}
        self.hosts: list[str] = []
        self.node_ranks: list[int] = []
        self.fingerprint: dict = {}
        self.fingerprint_id: Optional[str] = None
        self._progress = StepProgress(cfg.log.progress, cfg.log.progress_every_s, ctx.env.is_main)
        # per-step points: every N steps (a short run more often: tensorboard.step_stride)
        self.every = (step_stride(cfg.timing.tb_every, cfg.train.epochs * steps_per_epoch)
                      if self.timing else 0)
        self.written_step = 0  # the last per-step point written
        self.syncer, self.profiler, self.timer = syncer, profiler, timer
        self.watch = (StepWatch(timer, syncer.comm, self.every, self._live_point)
                      if timer is not None and self.every > 0 and ctx.env.is_main else None)

    def start(self, start_epoch: int, start_step: int = 0) -> None:
        """Collective. Drop metrics past the checkpoint; record the config and the ranks."""
        env, cfg = self.ctx.env, self.cfg
        self.start_epoch, self.start_step = start_epoch, start_step
        fresh = start_epoch == 0 and start_step == 0
        self.written_step = start_epoch * self.steps_per_epoch + start_step
        self.records = self.sink.truncate_after(start_epoch, self.written_step)
        hparams = self.hparams()
        repeat = cfg.study_point["repeat"] if cfg.study_point is not None else None
        # the run's compute-vs-comm charts that will draw a line
        bands = (("step",) if self.every > 0 else ()) \
            + (("epoch",) if self.timing and cfg.train.epochs > 1 else ())
        name = writer_name(run_name(hparams, repeat), self.run_dir.name,
                           length_extras(cfg.train.max_steps_per_epoch, injected(cfg.debug)))
        self.sink.tensorboard(name, "```yaml\n" + OmegaConf.to_yaml(cfg) + "\n```", hparams, bands,
                              load=workload(hparams),
                              steps_per_epoch=self.steps_per_epoch if self.every > 0 else 0)
        pairs = self.ctx.gather_objects((hostname(), env.node_rank))
        # on a loopback cluster every node has the same host name: node ranks tell them apart
        self.hosts = list(dict.fromkeys(p[0] for p in pairs))
        self.node_ranks = sorted({p[1] for p in pairs})
        self._fingerprint()
        # a doctor of this allocation failed a check: said first
        if env.is_main:
            for line in doctor_records.run_warnings(self.run_dir.parent, self.fingerprint_id):
                log.warning("%s", line)
            self.previous = read_json_or_empty(self.run_dir / "summary.json")
            if not fresh and isinstance(self.previous.get("segments"), list):
                self.segments = list(self.previous["segments"])
            self.segments.append({
                **allocation(), "launcher": cfg.launcher.name, "hosts": self.hosts,
                "nodes": env.num_nodes, "world_size": env.world_size, "start": now_iso(),
                "end": None, "start_epoch": start_epoch, "start_step": start_step,
                "status": "running", "fingerprint_id": self.fingerprint_id,
                "startup_s": startup_s(), "cpu": cpu_share(self.ctx)})
            self.sink.summary(RunSummary.from_dict({
                **(self.previous if not fresh else {}),
                **self._summary("running", start_epoch, start_step)}))
        announce(self.ctx, cfg, self.plan, self.steps_per_epoch)

    def _fingerprint(self) -> None:
        """Collective on nccl. This allocation's fingerprint (rank 0 keeps it), from every rank's
        NCCL INFO log after the hosts gather made NCCL connect; `finish` reads them again."""
        env, ctx = self.ctx.env, self.ctx
        detail = (ctx.gather_objects(fingerprints.read_nccl_transport(self.run_dir))
                  if ctx.backend == "nccl" else None)
        if not env.is_main:
            return
        self.fingerprint = fingerprints.collect(
            ctx.backend, ctx.device, self.hosts, self.cfg.launcher.name, env.num_nodes,
            env.local_world_size, nccl_transport=fingerprints.transport_label(detail or []),
            nccl_detail=detail)
        self.fingerprint_id = fingerprints.fingerprint_id(self.fingerprint)

    def step_numbers(self, epoch: int, first_step: int = 0) -> Iterable:
        """Epoch `epoch`'s step numbers from `first_step` on, shown as they go; the steps whose
        phases are stamped (every step under the profiler, whose witnesses compare each)."""
        if self.timer is not None:
            self.timer.sample(None if self.profiler is not None else sampled_steps(
                epoch * self.steps_per_epoch + first_step, self.steps_per_epoch - first_step,
                self.every, self.trace.keep if self.trace.enabled else 0))
        if self.watch is not None:
            self.watch.begin(epoch * self.steps_per_epoch + first_step)
        return self._progress.wrap(range(first_step, self.steps_per_epoch),
                                   f"epoch {epoch + 1}/{self.cfg.train.epochs}")

    def _live_point(self, step: int, times: StepTimes, calls: list[CommCall]) -> None:
        """One step from the watch, to TensorBoard (x: its global step number)."""
        stats = CommStats(timed=calls)
        self.sink.steps([(step, step_scalars(times, stats.per_step_seconds([times])[0],
                                             stats.per_step_exposed([times])[0],
                                             (step - 1) // self.steps_per_epoch + 1))])
        self.written_step = step

    def epoch(self, m: MeasuredEpoch) -> EpochRecord:
        """Collective. Epoch `m.epoch` (1-based) done: its record, written everywhere (a resumed
        epoch: the whole epoch's loss, samples and times, this part's timings)."""
        n, epoch, steps, comm, resumed_at_step = (self.steps_per_epoch, m.epoch, m.steps, m.comm,
                                                  m.resumed_at_step)
        train_loss_sum, correct, samples, busy_s, wall_s = m.totals()
        first_step = (epoch - 1) * n + resumed_at_step
        self.trace.add_epoch(epoch, steps, comm, first_step=first_step)
        timed = self._timing(steps, comm, busy_s)
        loss, global_correct, global_samples = self.ctx.reduce_floats(
            [train_loss_sum, float(correct), float(samples)])
        rec = EpochRecord(
            epoch=epoch, world_size=self.ctx.env.world_size, train_loss=loss / global_samples,
            train_accuracy=global_correct / global_samples,
            test_loss=m.test[0], test_accuracy=m.test[1], epoch_time_s=wall_s,
            samples_per_s=global_samples / wall_s, steps=n, timing=self.timing,
            resumed_at_step=resumed_at_step or None, compress=self.cfg.sync.compress,
            step_time_s=timed["phase_s"]["step"]["total"] if self.timing else busy_s, **timed)
        self.done.append(rec)
        self._tensorboard(rec, steps, comm, first_step)  # adds rec to self.records
        # the key, before this allocation's first epoch line
        if len(self.done) == 1:
            log.info("(loss, acc: train/test; comm in flight: %s of the step collectives run; "
                     "exposed: waited)", "%")
        log.info("epoch %d/%d  loss %.3f/%.3f  acc %.1f/%.1f%%  %.2f s  comm %s", epoch,
                 self.cfg.train.epochs, rec.train_loss, rec.test_loss, 100 * rec.train_accuracy,
                 100 * rec.test_accuracy, wall_s, comm_line(rec))
        # the epoch's detail, after its line
        if rec.straggler:
            s = rec.straggler
            log.info("epoch %d/%d  straggler: rank %d, the others wait %.2f ms for it "
                     "(last at %.0f%% of steps)", epoch, self.cfg.train.epochs, s["rank"],
                     s["late_ms"], 100 * s["share"])
        return rec

    def _tensorboard(self, rec: EpochRecord, steps: list[StepTimes], comm: CommStats,
                     first_step: int) -> None:
        """The epoch's record and scalars at its last step, after the unwritten step points."""
        every, end = self.every, rec.epoch * self.steps_per_epoch
        if every > 0:
            comm_s, exposed_s = comm.per_step_seconds(steps), comm.per_step_exposed(steps)
            points = []
            for i, st in enumerate(steps):
                n = first_step + i + 1  # the step's global number
                if n % every == 0 and n > self.written_step:
                    points.append((n, step_scalars(st, comm_s[i], exposed_s[i], rec.epoch)))
            self.sink.steps(points)
        self.written_step = end
        scalars = epoch_scalars(rec)
        if not (every > 0 and end % every == 0):  # else the step's point carries it
            scalars["epoch"] = rec.epoch
        self.records.append(rec.to_dict())
        # the run's, as summary.json will say them
        so_far = run_figures(self.records)
        figures = {"test_accuracy": rec.test_accuracy, "epoch_time_s": so_far["epoch_time_s_median"],
                   "comm_fraction": so_far["comm_fraction"] or 0.0,
                   "busbw_GBps": so_far["comm_busbw_GBps"] or 0.0}
        scalars.update({RUN_METRICS[k]: v for k, v in figures.items()})
        self.sink.epoch(rec, scalars, end)

    def hparams(self) -> dict:
        """The run's hparams for TensorBoard: its description's and the ranks'."""
        cfg, env = self.cfg, self.ctx.env
        desc = describe_run(OmegaConf.to_container(cfg, resolve=True),
                            {"world_size": env.world_size, "nodes": env.num_nodes,
                             "device": "cpu" if self.ctx.device.type == "cpu" else None})
        # the sync's options are the description's `sync.<key>` (no `overlap` beside `sync.overlap`)
        return {**desc.hparams(), "world_size": env.world_size, "batch_size": self.plan.per_rank,
                "global_batch": self.plan.global_batch, "backend": self.ctx.backend}

    def _timing(self, steps: list[StepTimes], comm: CommStats, busy_s: float) -> dict:
        """Collective. The record's timing part: phases, comm, stragglers, the straggler named."""
        t, timed = epoch_timing(steps, comm), self.timing
        step_total = t["phases"]["step"]["total"] if timed else busy_s
        # every rank's step time, its compute (the others' step times grow while they wait for a
        # straggler; compute does not) and its comm per step: who waited for whom
        per_rank = self.ctx.gather_objects(
            (step_total, step_total - comm.seconds, comm.per_step_seconds(steps)))
        tally = StragglerTally.from_waits([r[2] for r in per_rank])
        self.stragglers_run.merge(tally)
        return {
            "phase_s": {p: t["phases"][p] for p in (*PHASES, "step")} if timed else {},
            "comm": {"calls": comm.calls, "payload_bytes": comm.payload_bytes,
                     "bytes_sent": comm.bytes_sent, "bytes_recv": comm.bytes_recv,
                     "bytes_cross_node": comm.bytes_cross_node,
                     "bytes_exact": self.bytes_exact, "time_s": comm.seconds,
                     "bus_bytes": comm.bus_bytes,
                     "per_step_s": {k: v for k, v in t["comm_step"].items() if k != "total"},
                     "algbw_GBps": comm.algbw, "busbw_GBps": comm.busbw,
                     "fraction": t["comm_fraction"]},
            "comm_fraction": t["comm_fraction"],
            "comm_exposed_s": t["exposed_s"] if timed else None,
            "comm_exposed_fraction": t["exposed_fraction"] if timed else None,
            "comm_inflight_s": comm.seconds if timed else None,
            "compute_s": t["compute_s"] if timed else None,
            "steps_sampled": t["sampled"] if timed else None,
            "overlap": self.cfg.sync.overlap,
            "stragglers": {**stragglers([r[0] for r in per_rank], tally),
                           "measure": "step time" if timed else "wall time",
                           "per_rank_compute_s": [r[1] for r in per_rank]},
            "straggler": tally.named(),
        }

    def finish(self, status: str = "completed", position: Optional[tuple[int, int]] = None,
               stop_reason: Optional[str] = None, memory: Optional[dict[str, Any]] = None,
               weights_sha256: Optional[str] = None) -> RunSummary:
        """Collective. Merge the trace, write summary.json and close TensorBoard. A graceful stop
        passes `status`, `position` and `stop_reason`; `memory`: `memory_per_rank`'s."""
        # trace/all.json on rank 0: every rank's events in one file (one gather, at the end)
        gathered = (self.ctx.gather_objects_to(self.trace.events, dst=0) if self.trace.enabled
                    else None)
        if gathered is not None:
            write_trace(self.run_dir / "trace" / "all.json", [e for ev in gathered for e in ev])
        # collective with timing.profile: the profiler's witnesses and DDP's own timing
        witnesses = self.profiler.witnesses(self.ctx) if self.profiler is not None else None
        ddp = ddp_timing(self.syncer, self.profiler) if self.syncer is not None else None
        # every collective has run by now: NCCL's lines of every connection it made are in the
        # logs, flushed
        if self.ctx.backend == "nccl":
            self._fingerprint()
        cfg, ctx, env = self.cfg, self.ctx, self.ctx.env
        last = self.done[-1] if self.done else None
        test_loss, test_acc = ((last.test_loss, last.test_accuracy) if last else
                               (self.previous.get("test_loss"), self.previous.get("test_accuracy")))
        times = [r.epoch_time_s for r in self.done]
        epochs_done, step = position or (cfg.train.epochs, 0)
        if self.segments:
            self.segments[-1].update(
                end=now_iso(), end_epoch=epochs_done, end_step=step, status=status,
                epochs_done=len(times),
                steps_done=(epochs_done - self.start_epoch) * self.steps_per_epoch + step - self.start_step,
                epoch_time_s_median=statistics.median(times) if times else None)
        figures = run_figures(self.records)  # every epoch of the run, every allocation's
        summary = RunSummary(
            **self._summary(status, epochs_done, step), model=cfg.model.name,
            optim=cfg.optim.name, backend=ctx.backend,
            device=ctx.device.type if ctx.device.type == "cpu"
            else torch.cuda.get_device_name(ctx.device), nodes=env.num_nodes,
            nproc_per_node=env.local_world_size, epochs=cfg.train.epochs, epochs_run=len(times),
            start_epoch=self.start_epoch, micro_batch=self.plan.micro,
            accumulation=self.plan.accumulation, pipeline=cfg.data.pipeline,
            test_accuracy=test_acc, test_loss=test_loss,
            train_loss=last.train_loss if last else None,
            **figures, node_ranks=self.node_ranks, env_source=env.source,
            hosts=list(dict.fromkeys(h for seg in self.segments for h in seg.get("hosts") or []))
            # every allocation's, in the order they first came
            or self.hosts,
            torch=torch.__version__, stop_reason=stop_reason,
            straggler=self.stragglers_run.named() if self.timing else None,
            injected_delay=injected(cfg.debug),
            compiled=cfg.train.compile, compile_s=self.compile_s, overlap=cfg.sync.overlap,
            cuda_graph=cfg.train.cuda_graph,
            ddp_timing=ddp, witnesses=witnesses, weights_sha256=weights_sha256,
            **{f"memory_{k}": v for k, v in (memory or {}).items()})
        self.sink.summary(summary)
        self.sink.close()
        return summary

    def _summary(self, status: str, epochs_done: int, step: int) -> dict[str, Any]:
        """summary.json's fields both the running and the final summary write."""
        cfg, plan = self.cfg, self.plan
        return {"status": status, "launcher": cfg.launcher.name, "sync": cfg.sync.name,
                "compress": cfg.sync.compress, "world_size": self.ctx.env.world_size,
                "batch_size": plan.per_rank, "global_batch": plan.global_batch,
                "scaling": plan.scaling, "study": study_point(cfg), "segments": self.segments,
                "fingerprint": self.fingerprint, "fingerprint_id": self.fingerprint_id,
                "job_id": allocation()["job_id"], "epochs_done": epochs_done,
                "step_in_epoch": step}


# ------------------------------------------------------------------ how a record shows
def injected(debug: Optional[DebugConfig]) -> Optional[dict]:
    """What summary.json records of the injection (None: nothing injected, or no debug section)."""
    if debug is None:
        return None
    slow = debug.slow_rank >= 0 and debug.slow_ms > 0
    if not slow and debug.jitter_ms <= 0:
        return None
    return {"slow_rank": debug.slow_rank if slow else None,
            "slow_ms": float(debug.slow_ms) if slow else 0.0,
            "jitter_ms": float(debug.jitter_ms)}


def epoch_scalars(rec: EpochRecord) -> dict[str, float]:
    """TensorBoard scalars of an epoch; tags carry their units."""
    c, steps, phases = rec.comm, rec.steps, rec.phase_s
    out = {
        "loss/train": rec.train_loss, "loss/test": rec.test_loss,
        "accuracy/train[fraction]": rec.train_accuracy,
        "accuracy/test[fraction]": rec.test_accuracy, "time/epoch[s]": rec.epoch_time_s,
        "throughput/train[samples/s]": rec.samples_per_s,
        "comm/bytes_sent[MB/step]": c["bytes_sent"] / 1e6 / steps,
        "comm/bytes_recv[MB/step]": c["bytes_recv"] / 1e6 / steps,
        "comm/calls[per step]": c["calls"] / steps,
    }
    if c.get("bytes_cross_node") is not None:  # sync=hierarchical: what left the node
        out["comm/bytes_cross_node[MB/step]"] = c["bytes_cross_node"] / 1e6 / steps
    if rec.timing:
        out.update({f"time/{p}[ms/step]": phases[p]["mean"] * 1e3 for p in (*PHASES, "step")})
        out.update({"time/step_p95[ms]": phases["step"]["p95"] * 1e3,
                    "time/step_median[ms]": phases["step"]["median"] * 1e3,
                    "comm/time[ms/step]": c["time_s"] * 1e3 / steps,
                    "comm/algbw[GB/s]": c["algbw_GBps"], "comm/busbw[GB/s]": c["busbw_GBps"],
                    "comm/fraction[of step]": c["fraction"] or 0.0,
                    # in flight (the collectives' union) and exposed (after compute's end)
                    "comm/inflight[ms/step]": (rec.comm_inflight_s or 0.0) * 1e3 / steps,
                    "comm/exposed[ms/step]": (rec.comm_exposed_s or 0.0) * 1e3 / steps,
                    "comm/exposed_fraction[of step]": rec.comm_exposed_fraction or 0.0,
                    "time/compute[ms/step]": (rec.compute_s or 0.0) * 1e3 / steps})
        spread = rec.stragglers.get("spread")
        if spread:
            out["stragglers/spread[slowest/fastest]"] = spread
        # -1 and 0 ms: no rank named this epoch
        if rec.world_size and rec.world_size > 1:
            named = rec.straggler or {"rank": -1, "late_ms": 0.0}
            out["stragglers/rank"] = float(named["rank"])
            out["stragglers/late[ms]"] = named["late_ms"]
    return out


def step_scalars(step: StepTimes, comm_s: float, exposed_s: float, epoch: int) -> dict[str, float]:
    """One step's TensorBoard scalars: times, comm in flight and exposed, its epoch."""
    d = step.durations()
    return {"step/time[ms]": 1e3 * sum(d.values()), "step/sync[ms]": 1e3 * d.get("sync", 0.0),
            "step/compute[ms]": 1e3 * step.compute_seconds(), "step/comm[ms]": 1e3 * comm_s,
            "step/comm_exposed[ms]": 1e3 * exposed_s, "epoch": epoch}


def comm_line(rec: EpochRecord) -> str:
    """The console epoch line's comm part, short: the figures are in metrics.jsonl."""
    c, steps = rec.comm, rec.steps
    if c["fraction"] is None:
        return f"{c['bytes_sent'] / steps / 1e6:.2f} MB/step sent (timing off)"
    return (f"{100 * c['fraction']:.0f}% in flight, "
            f"{100 * (rec.comm_exposed_fraction or 0.0):.0f}% exposed")


def announce(ctx: Any, cfg: Config, plan: BatchPlan, steps_per_epoch: int) -> None:
    """The run's first lines on the console."""
    log.info("world %d (%d node%s x %d) %s/%s sync=%s model=%s %d steps of %d a rank "
             "(global %d, %s%s)", ctx.env.world_size, ctx.env.num_nodes,
             "s" if ctx.env.num_nodes > 1 else "",
             ctx.env.local_world_size, ctx.backend, ctx.device, cfg.sync.name,
             cfg.model.name, steps_per_epoch, plan.per_rank, plan.global_batch,
             plan.scaling, f"; {plan.accumulation} micro-batches of {plan.micro}"
             if plan.accumulation > 1 else "")
    # defaults the installed torch could not honour
    fused = torch_support.fused_note(cfg.optim.name, ctx.device.type, cfg.optim.fused,
                                     sharded=cfg.sync.name == "fsdp2")
    for line in (*ctx.notes, *([fused] if fused else [])):
        log.info("%s", line)
    if ctx.device.type == "cpu":
        share = cpu_share(ctx)
        n = share["threads"]
        log.info("%d CPU thread%s a rank: %s%s", n, "s" if n > 1 else "", share["why"],
                 f"; waiting threads {share['wait']}" if n > 1 else "")


def cpu_share(ctx: DistContext) -> dict:
    """This rank's torch threads, why, and how they wait (ddp_lab/world/cpu.py)."""
    return {"threads": torch.get_num_threads(), "why": ctx.threads.why if ctx.threads else "",
            "wait": cpu.wait_policy()}


def study_point(cfg: Config) -> Optional[dict]:
    """The study this run is a point of (its config's `study_point`, ddp_lab/command/study.py)."""
    point = cfg.study_point
    return OmegaConf.to_container(point) if point is not None else None


# ------------------------------------------------------------------ the Chrome trace
COMM_TID = 1000


def kept_steps(n_steps: int, keep: int) -> list[int]:
    """Indices of the first `keep` and last `keep` of `n_steps` steps (each once)."""
    if keep <= 0:
        return []
    return sorted(set(range(min(keep, n_steps))) | set(range(max(0, n_steps - keep), n_steps)))


# ------------------------------------------------------------------ the sampled steps
# an epoch of up to SAMPLE_ALL steps has every step's phases stamped; a longer one at least
# MIN_SAMPLED, evenly spread, with the live TensorBoard steps and the trace's (docs/timing.md)
SAMPLE_ALL = 200
MIN_SAMPLED = 64


def sampled_steps(done: int, n: int, every: int, keep: int) -> Optional[set[int]]:
    """Which of a part of `n` steps (indices 0..n-1, `done` global steps before it) have their
    phases stamped; None: all. Every `every`-th global step (a TensorBoard point), the first and
    last `keep` (the trace), and one in every n // MIN_SAMPLED."""
    if n <= SAMPLE_ALL:
        return None
    picked = set(range(0, n, n // MIN_SAMPLED)) | set(kept_steps(n, keep))
    if every > 0:
        # the global step done + i + 1 a multiple of `every`
        picked |= set(range(-(done + 1) % every, n, every))
    return picked


def _us(seconds: float) -> float:
    return round(seconds * 1e6, 3)


def epoch_events(rank: int, epoch: int, steps: Sequence[StepTimes], comm: CommStats,
                 keep: int, step_offset: int = 0) -> list[dict[str, Any]]:
    """Trace events of one epoch: kept steps' phases, and the collectives started in them."""
    events: list[dict[str, Any]] = []
    windows = []  # each kept step's (start, end, number)
    for i in kept_steps(len(steps), keep):
        st, step = steps[i], step_offset + i
        windows.append((st.start, st.end, step))
        for name, s, e in st.spans:
            events.append({"name": name, "ph": "X", "ts": _us(s), "dur": _us(e - s),
                           "pid": rank, "tid": rank, "cat": "phase",
                           "args": {"epoch": epoch, "step": step}})
    for c in comm.timed:
        for s, e, step in windows:
            if s <= c.start <= e:
                events.append({"name": c.op, "ph": "X", "ts": _us(c.start),
                               "dur": _us(c.end - c.start), "pid": rank, "tid": COMM_TID + rank,
                               "cat": "comm",
                               "args": {"epoch": epoch, "step": step, "payload_bytes": c.payload,
                                        "bytes_sent": c.sent, "bytes_recv": c.recv}})
                break
    return events


class TraceWriter:
    """Accumulates the bounded events of each epoch and rewrites the rank's file."""

    def __init__(self, run_dir: Path, rank: int, keep: int, enabled: bool = True):
        self.path = run_dir / "trace" / f"rank{rank}.json"
        self.rank, self.keep, self.enabled = rank, keep, enabled
        # the names of the rank's process and of its two rows, the phases and the collectives
        self.events: list[dict[str, Any]] = [
            {"ph": "M", "name": name, "pid": rank, "tid": tid, "args": args} for name, tid, args in (
                ("process_name", rank, {"name": f"rank {rank}"}),
                ("process_sort_index", rank, {"sort_index": rank}),
                ("thread_name", rank, {"name": "phases"}),
                ("thread_name", COMM_TID + rank, {"name": "collectives"}))]

    def add_epoch(self, epoch: int, steps: Sequence[StepTimes], comm: CommStats,
                  first_step: int = 0) -> None:
        """Add an epoch's kept steps (numbered from `first_step`) and rewrite the file."""
        if not self.enabled:
            return
        self.events += epoch_events(self.rank, epoch, steps, comm, self.keep, first_step)
        write_trace(self.path, self.events)


def write_trace(path: Path, events: list[dict[str, Any]]) -> None:
    """Atomically (re)write a trace file: readers see the old one or the new one."""
    atomic_write_text(path, json.dumps({"traceEvents": events, "displayTimeUnit": "ms"},
                                       separators=(",", ":")))


# ------------------------------------------------------------------ the console's progress
# log.progress, logging rank only: on a terminal a tqdm bar on stderr; anywhere else (a file, a
# pipe, a SLURM .out) a line every log.progress_every_s seconds, checked between steps:
#       [rank 0] step 230/938 of epoch 1/5 (25%), 23.1 steps/s, 31 s left
def on_terminal() -> bool:
    """Whether stdout (the log's lines) and stderr (the bar) are both a terminal."""
    try:
        return sys.stdout.isatty() and sys.stderr.isatty()
    except ValueError:  # a stream closed
        return False


def bar_size() -> dict:
    """tqdm's size: the terminal's, followed; 100 x 24 where it reports none (tqdm would take a
    sizeless pseudo-terminal as 0 rows and draw nothing)."""
    try:
        if os.get_terminal_size(sys.stderr.fileno()).columns > 0:
            return {"dynamic_ncols": True}
    except OSError:
        pass
    return {"ncols": 100, "nrows": 24}


def duration(seconds: float) -> str:
    """A time left in words: `31 s`, `12 min`, `2.5 h`."""
    if seconds < 100:
        return f"{seconds:.0f} s"
    if seconds < 6000:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


class StepLines(tqdm):
    """tqdm drawing its bar as a log line at most every `every_s` seconds."""

    # tqdm's monitor thread only shortens a bar's dynamic interval
    monitor_interval = 0

    def __init__(self, steps: range, desc: str, every_s: float):
        super().__init__(steps, desc=desc, total=steps.stop, initial=steps.start,
                         mininterval=every_s, delay=every_s, miniters=1, leave=False)

    def display(self, msg: Optional[str] = None, pos: Optional[int] = None) -> bool:
        """tqdm's redraw as a log line; none on closing, none after the last step."""
        if msg is None and self.n < self.total:
            rate = (self.n - self.initial) / max(self.format_dict["elapsed"], 1e-9)
            log.info("step %d/%d of %s (%.0f%%), %.1f steps/s, %s left", self.n, self.total,
                     self.desc, 100 * self.n / self.total, rate,
                     duration((self.total - self.n) / rate) if rate else "?")
        return False


class StepProgress:
    """What the logging rank wraps each epoch's steps in; the others get them as they are."""

    def __init__(self, mode: str, every_s: float, is_main: bool):
        self.mode, self.every_s, self.is_main = mode, every_s, is_main
        self.bar = is_main and (mode == "bar" or (mode == "auto" and on_terminal()))

    def wrap(self, steps: range, desc: str) -> Iterable[int]:
        """`steps`, the epoch's remaining steps (range(first_step, steps_per_epoch))."""
        if self.bar:
            return tqdm(steps, desc=desc, leave=False, unit="step", **bar_size())
        if self.is_main and self.every_s > 0:
            return StepLines(steps, desc, self.every_s)
        return steps
