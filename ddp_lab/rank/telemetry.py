"""From the loop's raw measurements to the run's records: one object,
`Telemetry` (docs/architecture.md, "The path of one epoch's numbers").

Once per epoch the loop hands it a `MeasuredEpoch`; it builds the
`EpochRecord` and writes it to metrics.jsonl, TensorBoard, the console
and the Chrome trace, and at the end the `RunSummary`: the loop never
assembles a record nor asks its rank. Every rank calls every method in
the same order (some are collectives); only the logging rank's sink
writes.
"""

from __future__ import annotations

import logging
import statistics
from pathlib import Path
from typing import Any, Iterable, Optional

import torch
from omegaconf import OmegaConf


from ..world import fingerprint as fingerprints
from ..folder import doctor as doctor_records
from ..config import BatchPlan, Config, batch_plan
from ..world.distributed import DistContext
from ..world.env import allocation, hostname, startup_s
from .epoch import EpochControl, MeasuredEpoch
from ..folder.files import read_json_or_empty
from ..folder.metrics import make_sink
from .console_progress import StepProgress
from ..folder.description import describe_run
from ..folder.tensorboard import (length_extras, run_metrics, run_name, step_stride, workload,
                                  writer_name)
from .witnesses import ddp_timing
from .announce import announce, cpu_share, study_point
from .presentation import comm_line, timing_fields, epoch_scalars, step_scalars
from ..folder.records import EpochRecord, RunSummary, now_iso, run_figures
from .delay import injected
from ..timing import (CommCall, CommStats, StepTimes, StepWatch,
                      StragglerTally, epoch_timing)
from .trace import TraceWriter, write_trace

log = logging.getLogger("ddp_lab")


class Telemetry:
    """The records of one run on this rank; see the module docstring."""

    def __init__(self, cfg: Config, ctx: DistContext, run_dir: Path, steps_per_epoch: int,
                 bytes_exact: bool, plan: Optional[BatchPlan] = None,
                 compile_s: Optional[float] = None, control: Optional[EpochControl] = None):
        """`cfg`: the whole config, which the records describe.
        `control`: the loop's EpochControl, whose timer and recorder the
        live TensorBoard points are read from."""
        self.cfg, self.ctx, self.run_dir = cfg, ctx, run_dir
        self.steps_per_epoch, self.bytes_exact = steps_per_epoch, bytes_exact
        self.timing = bool(cfg.timing.enabled)
        # the trainer's, else derived
        self.plan = plan or batch_plan(cfg.train, ctx.env.world_size)
        self.sink = make_sink(run_dir, enabled=ctx.env.is_main)
        self.trace = TraceWriter(run_dir, ctx.env.rank, cfg.timing.trace_steps,
                                 enabled=self.timing and cfg.timing.trace)
        # every epoch's record on the logging rank, earlier allocations'
        # too
        self.records: list[dict] = []
        # every epoch's steps
        self.stragglers_run = StragglerTally(ctx.env.world_size)
        # train.compile's compilation (train.py), outside every epoch
        self.compile_s = compile_s
        self.epoch_times: list[float] = []
        self.last: Optional[EpochRecord] = None
        self.start_epoch = 0
        self.start_step = 0
        self.segments: list[dict] = []
        self.previous: dict = {}
        self.hosts: list[str] = []
        self.node_ranks: list[int] = []
        self.fingerprint: dict = {}
        self.fingerprint_id: Optional[str] = None
        self._progress = StepProgress(cfg.log.progress, cfg.log.progress_every_s, ctx.env.is_main)
        # per-step points: every N steps (a short run more often:
        # tensorboard.step_stride)
        self.every = (step_stride(cfg.timing.tb_every, cfg.train.epochs * steps_per_epoch)
                      if self.timing else 0)
        # the last per-step point written
        self.written_step = 0
        self.control = control
        self.watch = (StepWatch(control.timer, control.syncer.comm, self.every, self._live_point)
                      if control is not None and self.every > 0 and ctx.env.is_main else None)

    # -------------------------------------------------------------- start
    def start(self, start_epoch: int, start_step: int = 0) -> None:
        """Collective. Drop metrics past the checkpoint; record the
        config and the ranks."""
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
        # on a loopback cluster every node has the same host name: node
        # ranks tell them apart
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
                "startup_s": startup_s(), "cpu": cpu_share()})
            running = {**(self.previous if not fresh else {}), "status": "running",
                       "fingerprint": self.fingerprint, "fingerprint_id": self.fingerprint_id,
                       "segments": self.segments, "job_id": self.segments[-1]["job_id"],
                       "epochs_done": start_epoch, "step_in_epoch": start_step,
                       "world_size": env.world_size, "launcher": cfg.launcher.name,
                       "sync": cfg.sync.name, "compress": cfg.sync.compress,
                       "global_batch": self.plan.global_batch,
                       "scaling": self.plan.scaling, "batch_size": self.plan.per_rank,
                       "study": study_point(cfg)}
            self.sink.summary(RunSummary.from_dict(running))
        announce(self.ctx, cfg, self.plan, self.steps_per_epoch)

    def _fingerprint(self) -> None:
        """Collective on nccl. This allocation's fingerprint (rank 0
        keeps it), from every rank's NCCL INFO log after the hosts
        gather made NCCL connect; `finish` reads them again."""
        env, ctx = self.ctx.env, self.ctx
        detail = None
        if ctx.backend == "nccl":
            detail = ctx.gather_objects(fingerprints.read_nccl_transport(self.run_dir))
        if not env.is_main:
            return
        self.fingerprint = fingerprints.collect(
            ctx.backend, ctx.device, self.hosts, self.cfg.launcher.name, env.num_nodes,
            env.local_world_size, nccl_transport=fingerprints.transport_label(detail or []),
            nccl_detail=detail)
        self.fingerprint_id = fingerprints.fingerprint_id(self.fingerprint)

    def step_numbers(self, epoch: int, first_step: int = 0) -> Iterable:
        """Epoch `epoch`'s steps from `first_step` on, shown as they go;
        starts the live watch."""
        if self.watch is not None:
            self.watch.begin(epoch * self.steps_per_epoch + first_step)
        return self._progress.wrap(range(first_step, self.steps_per_epoch),
                                   f"epoch {epoch + 1}/{self.cfg.train.epochs}")

    def _live_point(self, step: int, times: StepTimes, calls: list[CommCall]) -> None:
        """One step from the watch, to TensorBoard (x: its global step
        number)."""
        stats = CommStats(timed=calls)
        self.sink.steps([(step, step_scalars(times, stats.per_step_seconds([times])[0],
                                             stats.per_step_exposed([times])[0],
                                             (step - 1) // self.steps_per_epoch + 1))])
        self.written_step = step

    # -------------------------------------------------------------- each epoch
    def epoch(self, m: MeasuredEpoch) -> EpochRecord:
        """Collective. Epoch `m.epoch` (1-based) done: build its record,
        write it everywhere (a resumed epoch: the whole epoch's loss,
        samples and times, this part's timings)."""
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
        self.epoch_times.append(wall_s)
        self.last = rec
        # (adds rec to self.records)
        self._tensorboard(rec, steps, comm, first_step)
        # the key, before this allocation's first epoch line
        if len(self.epoch_times) == 1:
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
        """The epoch's record and scalars at its last step, after the
        unwritten step points."""
        every, end = self.every, rec.epoch * self.steps_per_epoch
        if every > 0:
            comm_s, exposed_s = comm.per_step_seconds(steps), comm.per_step_exposed(steps)
            points = []
            for i, st in enumerate(steps):
                # the step's global number
                n = first_step + i + 1
                if n % every == 0 and n > self.written_step:
                    points.append((n, step_scalars(st, comm_s[i], exposed_s[i], rec.epoch)))
            self.sink.steps(points)
        self.written_step = end
        scalars = epoch_scalars(rec)
        # else the step's point carries it
        if not (every > 0 and end % every == 0):
            scalars["epoch"] = rec.epoch
        self.records.append(rec.to_dict())
        # the run's, as summary.json will say them
        so_far = run_figures(self.records)
        scalars.update(run_metrics(test_accuracy=rec.test_accuracy,
                                   epoch_time_s=so_far["epoch_time_s_median"],
                                   comm_fraction=so_far["comm_fraction"] or 0.0,
                                   busbw_GBps=so_far["comm_busbw_GBps"] or 0.0))
        self.sink.epoch(rec, scalars, end)

    def hparams(self) -> dict:
        """The run's hparams for TensorBoard: its description's and the
        ranks'."""
        cfg, env = self.cfg, self.ctx.env
        desc = describe_run(OmegaConf.to_container(cfg, resolve=True),
                            {"world_size": env.world_size, "nodes": env.num_nodes,
                             "device": "cpu" if self.ctx.device.type == "cpu" else None})
        # the sync's options are the description's `sync.<key>` (no
        # `overlap` beside `sync.overlap`)
        return {**desc.hparams(), "world_size": env.world_size, "batch_size": self.plan.per_rank,
                "global_batch": self.plan.global_batch, "backend": self.ctx.backend}

    def _timing(self, steps: list[StepTimes], comm: CommStats, busy_s: float) -> dict:
        """Collective. The record's timing part: phases, comm,
        stragglers, the straggler named."""
        t = epoch_timing(steps, comm)
        step_total = t["phases"]["step"]["total"] if self.timing else busy_s
        # every rank's step time, its compute (the others' step times
        # grow while they wait for a straggler; compute does not) and
        # its comm per step: who waited for whom
        per_rank = self.ctx.gather_objects(
            (step_total, step_total - comm.seconds, comm.per_step_seconds(steps)))
        tally = StragglerTally.from_waits([r[2] for r in per_rank])
        self.stragglers_run.merge(tally)
        return timing_fields(t, comm, per_rank, tally, timed=self.timing,
                             bytes_exact=self.bytes_exact,
                             overlap=self.cfg.sync.overlap)

    # -------------------------------------------------------------- the end
    def finish(self, final_test: Optional[tuple[float, float]] = None, status: str = "completed",
               position: Optional[tuple[int, int]] = None,
               stop_reason: Optional[str] = None,
               memory: Optional[dict[str, Any]] = None,
               weights_sha256: Optional[str] = None) -> RunSummary:
        """Collective. Merge the trace, write summary.json and close
        TensorBoard. `final_test`: needed only when no epoch ran here; a
        graceful stop passes `status`, `position` and `stop_reason`;
        `memory`: this rank's bytes (Synchroniser.memory) and every
        rank's optimiser state; `weights_sha256`: the final weights'
        digest (model.pt)."""
        self._merge_trace()
        witnesses, ddp = self._witnesses()
        # every collective has run by now: NCCL's lines of
        if self.ctx.backend == "nccl":
            # every connection it made are in the logs, flushed
            self._fingerprint()
        cfg, ctx, env, last = self.cfg, self.ctx, self.ctx.env, self.last
        test_loss, test_acc = ((last.test_loss, last.test_accuracy) if last else
                               final_test or (self.previous.get("test_loss"),
                                              self.previous.get("test_accuracy")))
        times = self.epoch_times
        epochs_done, step = position or (cfg.train.epochs, 0)
        if self.segments:
            self.segments[-1].update(
                end=now_iso(), end_epoch=epochs_done, end_step=step, status=status,
                epochs_done=len(times),
                steps_done=(epochs_done - self.start_epoch) * self.steps_per_epoch + step - self.start_step,
                epoch_time_s_median=statistics.median(times) if times else None)
        # every epoch of the run, every allocation's
        figures = run_figures(self.records)
        summary = RunSummary(
            status=status, launcher=cfg.launcher.name, sync=cfg.sync.name,
            compress=cfg.sync.compress, model=cfg.model.name, optim=cfg.optim.name,
            backend=ctx.backend,
            device=ctx.device.type if ctx.device.type == "cpu"
            else torch.cuda.get_device_name(ctx.device), nodes=env.num_nodes,
            nproc_per_node=env.local_world_size, world_size=env.world_size,
            epochs=cfg.train.epochs, epochs_run=len(times), start_epoch=self.start_epoch,
            batch_size=self.plan.per_rank, global_batch=self.plan.global_batch,
            scaling=self.plan.scaling, micro_batch=self.plan.micro,
            accumulation=self.plan.accumulation, pipeline=cfg.data.pipeline,
            test_accuracy=test_acc, test_loss=test_loss,
            train_loss=last.train_loss if last else None,
            **figures, node_ranks=self.node_ranks, env_source=env.source,
            hosts=list(dict.fromkeys(h for seg in self.segments for h in seg.get("hosts") or []))
            # every allocation's, in the order they first came
            or self.hosts,
            torch=torch.__version__, epochs_done=epochs_done, step_in_epoch=step,
            stop_reason=stop_reason, job_id=allocation()["job_id"], segments=self.segments,
            fingerprint=self.fingerprint, fingerprint_id=self.fingerprint_id,
            study=study_point(cfg),
            straggler=self.stragglers_run.named() if self.timing else None,
            injected_delay=injected(cfg.debug),
            compiled=cfg.train.compile, compile_s=self.compile_s, overlap=cfg.sync.overlap,
            cuda_graph=bool(getattr(cfg.train, "cuda_graph", False)),
            ddp_timing=ddp, witnesses=witnesses, weights_sha256=weights_sha256,
            **{f"memory_{k}": v for k, v in (memory or {}).items()})
        self.sink.summary(summary)
        self.sink.close()
        return summary

    def _witnesses(self) -> tuple[Optional[dict], Optional[dict]]:
        """Collective with timing.profile: the profiler's witnesses and
        DDP's own timing."""
        if self.control is None:
            return None, None
        profiler = self.control.profiler
        witnesses = profiler.witnesses(self.ctx) if profiler is not None else None
        return witnesses, ddp_timing(self.control.syncer, profiler)

    def _merge_trace(self) -> None:
        """trace/all.json on rank 0: every rank's events in one file
        (one gather, at the end)."""
        if not self.trace.enabled:
            return
        gathered = self.ctx.gather_objects_to(self.trace.events, dst=0)
        if gathered is not None:
            write_trace(self.run_dir / "trace" / "all.json", [e for ev in gathered for e in ev])
