"""The training loop, evaluation and checkpoints: one run, on every rank."""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from . import checkpoint
from .data import Splits, build_splits, prepare_mnist
from .distributed import DistContext
from .metrics import MetricsWriter, write_json
from .models import build_model, build_optimizer
from .sync import build_sync
from .timing import PHASES, Clock, RunTotals, StepTimer, epoch_timing, stragglers
from .trace import TraceWriter, write_trace

log = logging.getLogger("ddp_lab")


@torch.no_grad()
def evaluate(model: torch.nn.Module, splits: Splits, batch_size: int,
             ctx: DistContext) -> tuple[float, float]:
    """Global test loss and accuracy: every rank scores its disjoint share, then a sum."""
    device = ctx.device
    was_training = model.training
    model.eval()
    loss = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.int64, device=device)
    for i in range(0, len(splits.test_x), batch_size):
        x, y = splits.test_x[i:i + batch_size], splits.test_y[i:i + batch_size]
        out = model(x)
        loss += F.cross_entropy(out, y, reduction="sum").double()
        correct += (out.argmax(1) == y).sum()
    model.train(was_training)
    total_loss, total_correct, total = ctx.reduce_floats(
        [loss.item(), float(correct.item()), float(len(splits.test_x))])
    return total_loss / total, total_correct / total


def _progress(cfg: Any, is_main: bool):
    import sys

    mode = cfg.log.progress
    if not is_main or mode == "lines":
        return None
    if mode == "bar" or (mode == "auto" and sys.stderr.isatty()):
        from tqdm import tqdm

        return tqdm
    return None


def run_steps(syncer, optimizer: torch.optim.Optimizer, batches: Iterator, steps: Iterable,
              timer: StepTimer) -> tuple[torch.Tensor, int]:
    """The training steps of one epoch, each phase timed: (summed loss on the device, samples)."""
    loss_sum = torch.zeros((), dtype=torch.float64, device=syncer.device)
    samples = 0
    for _ in steps:
        with timer.phase("data"):
            x, y = next(batches)
        with timer.phase("forward"):
            loss = F.cross_entropy(syncer.model(x), y)
        with timer.phase("backward"):
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
        with timer.phase("sync"):
            syncer.sync()
        with timer.phase("optim"):
            syncer.step(optimizer)
        timer.end_step()
        loss_sum += loss.detach().double() * len(y)  # stays on the device: no sync point
        samples += len(y)
    return loss_sum, samples


def train(cfg: Any, ctx: DistContext, run_dir: Path) -> dict:
    """Train per `cfg` on the initialised process group; return the summary."""
    env, device = ctx.env, ctx.device
    torch.manual_seed(cfg.train.seed)  # same initial weights on every rank
    writer = MetricsWriter(run_dir, enabled=env.is_main)

    prepare_mnist(cfg.data.root, list(cfg.data.mirrors), ctx, cfg.data.node_local)
    splits = build_splits(cfg.data, cfg.train, env, device)

    timing = cfg.timing.enabled
    ctx.barrier()  # load-bearing: every rank's clock starts at the same instant (trace)
    clock = Clock(device)
    module = build_model(cfg.model).to(device)
    syncer = build_sync(cfg.sync, module, device, env.world_size, clock=clock, timing=timing)
    optimizer = build_optimizer(cfg.optim, module.parameters(), cfg.train.lr)
    x0, y0 = splits.test_x[:2], splits.test_y[:2]
    syncer.preflight(lambda: F.cross_entropy(module(x0), y0))  # fails here, not mid-step

    start_epoch = 0
    ckpt_dir = run_dir / "checkpoints"
    # TORCHELASTIC_RESTART_COUNT counts restarts of *this node's* worker group only
    # (pytorch/pytorch#108158): after a restart every rank must resume, so agree on it.
    restarted = ctx.any_rank(env.restart_count > 0)
    if cfg.train.resume or restarted:
        path = checkpoint.latest(ckpt_dir)
        if path is None and cfg.train.resume:
            raise FileNotFoundError(f"train.resume=true but {ckpt_dir} holds no checkpoint: "
                                    "point run.dir at a run that completed an epoch")
        if path is not None:
            state = checkpoint.load(path, device)
            module.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start_epoch = state["epoch"]
            if state.get("world_size") != env.world_size:
                log.warning("checkpoint was written by %s ranks, resuming on %d: the data "
                            "order differs from an uninterrupted run", state.get("world_size"),
                            env.world_size)
            log.info("resumed from %s (epoch %d done)", path.name, start_epoch)
    writer.truncate_after(start_epoch)
    writer.text("config", "```yaml\n" + OmegaConf.to_yaml(cfg) + "\n```")

    hosts, node_ranks = _gather_placement(ctx)
    timer = StepTimer(clock, enabled=timing)
    trace = TraceWriter(run_dir, env.rank, cfg.timing.trace_steps,
                        enabled=timing and cfg.timing.trace)
    bar = _progress(cfg, env.is_main)
    steps_per_epoch = len(splits.train)
    if cfg.train.max_steps_per_epoch > 0:
        steps_per_epoch = min(steps_per_epoch, cfg.train.max_steps_per_epoch)
    log.info("world %d (%d node(s) x %d), %s on %s, sync=%s, model=%s, %d steps/epoch of %d per rank",
             env.world_size, env.num_nodes, env.local_world_size, ctx.backend, device,
             cfg.sync.name, cfg.model.name, steps_per_epoch, cfg.train.batch_size)

    epoch_times: list[float] = []
    totals = RunTotals()
    record: dict = {}
    for epoch in range(start_epoch, cfg.train.epochs):
        splits.train.set_epoch(epoch)
        ctx.synchronize()
        ctx.barrier()  # load-bearing: every rank starts the clock together
        clock.anchor()  # the GPU is idle here: its timeline is pinned to the host clock
        t0 = time.perf_counter()
        steps = range(steps_per_epoch)
        if bar is not None:
            steps = bar(steps, desc=f"epoch {epoch + 1}/{cfg.train.epochs}", leave=False,
                        unit="step", dynamic_ncols=True)
        loss_sum, samples = run_steps(syncer, optimizer, iter(splits.train), steps, timer)
        ctx.synchronize()  # wait for the GPU to finish the epoch's work
        busy = time.perf_counter() - t0  # this rank's own time, before waiting for the others
        ctx.barrier()  # load-bearing: the epoch ends when the slowest rank ends
        epoch_time = time.perf_counter() - t0

        steps_t = timer.collect()
        comm = syncer.take_comm()
        trace.add_epoch(epoch + 1, steps_t, comm, first_step=epoch * steps_per_epoch)
        timed = _timing_record(steps_t, comm, busy, timing, syncer.bytes_exact, ctx)
        global_loss, global_samples = ctx.reduce_floats([loss_sum.item(), float(samples)])
        test_loss, test_acc = evaluate(module, splits, cfg.train.eval_batch_size, ctx)
        record = {
            "epoch": epoch + 1, "world_size": env.world_size,
            "train_loss": global_loss / global_samples, "test_loss": test_loss,
            "test_accuracy": test_acc, "epoch_time_s": epoch_time,
            "samples_per_s": global_samples / epoch_time, "steps": steps_per_epoch,
            "timing": timing, **timed,
        }
        epoch_times.append(epoch_time)
        totals.add(timed["phase_s"]["step"]["total"] if timing else busy, comm, steps_per_epoch)
        opt_state = syncer.optimizer_state(optimizer) if cfg.train.checkpoint else None
        if cfg.train.checkpoint and env.is_main:
            # checkpoint first, then the metrics line: a record never outlives its state
            checkpoint.save_epoch(ckpt_dir, epoch + 1, {
                "model": module.state_dict(), "optimizer": opt_state,
                "world_size": env.world_size, "sync": cfg.sync.name})
        writer.epoch(record, _epoch_scalars(record))
        if timing and cfg.timing.tb_every > 0:
            writer.steps(_step_scalars(steps_t, comm, cfg.timing.tb_every, epoch * steps_per_epoch))
        log.info("epoch %d/%d  train loss %.4f  test loss %.4f  test acc %.4f  %.2f s  "
                 "%.0f samples/s  comm %s", epoch + 1, cfg.train.epochs, record["train_loss"],
                 test_loss, test_acc, epoch_time, record["samples_per_s"],
                 _comm_line(record["comm"], steps_per_epoch))
        _maybe_fail_once(ctx, epoch + 1)

    syncer.close()  # collective: every rank has run the same steps
    if trace.enabled:
        _write_merged_trace(trace, run_dir, ctx)
    if not record:  # resumed a run that had already finished
        test_loss, test_acc = evaluate(module, splits, cfg.train.eval_batch_size, ctx)
        record = {"test_accuracy": test_acc, "test_loss": test_loss}
    summary = {
        "status": "completed", "launcher": cfg.launcher.name, "sync": cfg.sync.name,
        "model": cfg.model.name, "optim": cfg.optim.name, "backend": ctx.backend,
        "device": device.type if device.type == "cpu" else torch.cuda.get_device_name(device),
        "nodes": env.num_nodes, "nproc_per_node": env.local_world_size,
        "world_size": env.world_size, "epochs": cfg.train.epochs,
        "epochs_run": len(epoch_times), "start_epoch": start_epoch,
        "batch_size": cfg.train.batch_size, "pipeline": cfg.data.pipeline,
        "test_accuracy": record["test_accuracy"], "test_loss": record["test_loss"],
        "train_loss": record.get("train_loss"),
        "epoch_time_s_median": statistics.median(epoch_times) if epoch_times else None,
        "epoch_time_s_mean": statistics.fmean(epoch_times) if epoch_times else None,
        **totals.summary(timing, syncer.bytes_exact),
        "hosts": hosts, "node_ranks": node_ranks, "env_source": env.source, "torch": torch.__version__,
    }
    if env.is_main:
        write_json(run_dir / "summary.json", summary)
    writer.close(
        hparams={"sync": cfg.sync.name, "model": cfg.model.name, "optim": cfg.optim.name,
                 "world_size": env.world_size, "batch_size": cfg.train.batch_size,
                 "lr": cfg.train.lr, "backend": ctx.backend, "launcher": cfg.launcher.name},
        final={"hparam/test_accuracy": summary["test_accuracy"],
               "hparam/epoch_time_s": summary["epoch_time_s_median"] or 0.0,
               "hparam/comm_fraction": summary["comm_fraction"] or 0.0,
               "hparam/busbw_GBps": summary["comm_busbw_GBps"] or 0.0})
    return summary


def _timing_record(steps: list, comm, busy: float, timing: bool, bytes_exact: bool,
                   ctx: DistContext) -> dict:
    """The epoch record's timing part: phases, comm, comm_fraction, stragglers."""
    t = epoch_timing(steps, comm)
    step_total = t["phases"]["step"]["total"] if timing else busy
    # every rank's summed step time, and that minus its comm time (its own compute: a
    # straggler makes the others *wait*, so their step times grow too; compute does not)
    per_rank = ctx.gather_floats([step_total, step_total - comm.seconds])
    return {
        "phase_s": {p: t["phases"][p] for p in (*PHASES, "step")} if timing else {},
        "comm": {"calls": comm.calls, "payload_bytes": comm.payload_bytes,
                 "bytes_sent": comm.bytes_sent, "bytes_recv": comm.bytes_recv,
                 "bytes_exact": bytes_exact, "time_s": comm.seconds,
                 "per_step_s": {k: v for k, v in t["comm_step"].items() if k != "total"},
                 "algbw_GBps": comm.algbw, "busbw_GBps": comm.busbw,
                 "fraction": t["comm_fraction"]},
        "comm_fraction": t["comm_fraction"],
        "stragglers": {**stragglers([r[0] for r in per_rank]),
                       "measure": "step time" if timing else "wall time",
                       "per_rank_compute_s": [r[1] for r in per_rank]},
    }


def _epoch_scalars(record: dict) -> dict[str, float]:
    """TensorBoard scalars of an epoch; tags carry their units."""
    c, steps, phases = record["comm"], record["steps"], record["phase_s"]
    out = {
        "loss/train": record["train_loss"], "loss/test": record["test_loss"],
        "accuracy/test(fraction)": record["test_accuracy"], "time/epoch(s)": record["epoch_time_s"],
        "throughput/train(samples/s)": record["samples_per_s"],
        "comm/bytes_sent(MB/step)": c["bytes_sent"] / 1e6 / steps,
        "comm/bytes_recv(MB/step)": c["bytes_recv"] / 1e6 / steps,
        "comm/calls(per step)": c["calls"] / steps,
    }
    if record["timing"]:
        out.update({f"time/{p}(ms/step)": phases[p]["mean"] * 1e3 for p in (*PHASES, "step")})
        out.update({"time/step_p95(ms)": phases["step"]["p95"] * 1e3,
                    "time/step_median(ms)": phases["step"]["median"] * 1e3,
                    "comm/time(ms/step)": c["time_s"] * 1e3 / steps,
                    "comm/algbw(GB/s)": c["algbw_GBps"], "comm/busbw(GB/s)": c["busbw_GBps"],
                    "comm/fraction(of step)": c["fraction"] or 0.0})
        spread = record["stragglers"].get("spread")
        if spread:
            out["stragglers/spread(slowest/fastest)"] = spread
    return out


def _step_scalars(steps: list, comm, every: int, first_step: int) -> list[tuple[int, dict[str, float]]]:
    """Per-step TensorBoard scalars (every `every` steps), x axis = global step."""
    comm_s = comm.per_step_seconds(steps)
    out = []
    for i in range(0, len(steps), every):
        d = steps[i].durations()
        out.append((first_step + i, {"step/time(ms)": 1e3 * sum(d.values()),
                                     "step/sync(ms)": 1e3 * d.get("sync", 0.0),
                                     "step/comm(ms)": 1e3 * comm_s[i]}))
    return out


def _comm_line(c: dict, steps: int) -> str:
    sent = c["bytes_sent"] / steps / 1e6
    if c["fraction"] is None:
        return f"{sent:.2f} MB/step sent (timing off)"
    return (f"{100 * c['fraction']:.0f}% of step, {1e3 * c['time_s'] / steps:.2f} ms/step, "
            f"{sent:.2f} MB/step sent, busbw {c['busbw_GBps']:.2f} GB/s")


def _write_merged_trace(trace: TraceWriter, run_dir: Path, ctx: DistContext) -> None:
    """trace/all.json on rank 0: every rank's events in one file (one gather, at the end)."""
    gathered = ctx.gather_objects_to(trace.events, dst=0)
    if gathered is not None:
        write_trace(run_dir / "trace" / "all.json", [e for events in gathered for e in events])


def _gather_placement(ctx: DistContext) -> tuple[list[str], list[int]]:
    """The distinct host names of the world in rank order, and the sorted node ranks (on a
    loopback cluster every node has the same host name: the node ranks tell them apart)."""
    from .env import hostname

    pairs = ctx.gather_objects((hostname(), ctx.env.node_rank))
    return list(dict.fromkeys(p[0] for p in pairs)), sorted({p[1] for p in pairs})


def _maybe_fail_once(ctx: DistContext, epoch: int) -> None:
    """Fault injection for testing restarts: DDP_LAB_FAIL_ONCE="rank=R,epoch=E" kills rank R
    after epoch E, on the first attempt only (TORCHELASTIC_RESTART_COUNT == 0)."""
    import os

    spec = os.environ.get("DDP_LAB_FAIL_ONCE")
    if not spec or ctx.env.restart_count > 0:
        return
    try:
        want = {k.strip(): int(v) for k, v in (kv.split("=") for kv in spec.split(","))}
        rank, at = want["rank"], want["epoch"]
    except (ValueError, KeyError):
        raise ValueError(f"DDP_LAB_FAIL_ONCE={spec!r}: expected 'rank=R,epoch=E'") from None
    if epoch != at:
        return
    ctx.barrier()  # load-bearing: rank 0 has written this epoch's checkpoint before anyone dies
    if ctx.env.rank == rank:
        log.error("DDP_LAB_FAIL_ONCE: rank %d exits after epoch %d (first attempt only)", rank, epoch)
        logging.shutdown()
        os._exit(17)  # a crash, not an exception: no clean-up, as a killed process
