"""The training loop, evaluation and checkpoints: one run, on every rank."""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
from omegaconf import OmegaConf

from . import checkpoint
from .data import Splits, build_splits, prepare_mnist
from .distributed import DistContext
from .metrics import MetricsWriter, write_json
from .models import build_model, build_optimizer
from .sync import build_sync
from .timing import PHASES, StepTimer, bandwidth, summarise_steps

log = logging.getLogger("ddp_lab")


def _all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    t = torch.tensor(values, dtype=torch.float64 if device.type == "cpu" else torch.float32,
                     device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t)
    return t.tolist()


def _any_rank(flag: bool, device: torch.device) -> bool:
    return _all_reduce_sum([1.0 if flag else 0.0], device)[0] > 0


@torch.no_grad()
def evaluate(model: torch.nn.Module, splits: Splits, batch_size: int,
             device: torch.device) -> tuple[float, float]:
    """Global test loss and accuracy: every rank scores its disjoint share, then a sum."""
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
    total_loss, total_correct, total = _all_reduce_sum(
        [loss.item(), float(correct.item()), float(len(splits.test_x))], device)
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


def train(cfg: Any, ctx: DistContext, run_dir: Path) -> dict:
    """Train per `cfg` on the initialised process group; return the summary."""
    env, device = ctx.env, ctx.device
    torch.manual_seed(cfg.train.seed)  # same initial weights on every rank
    writer = MetricsWriter(run_dir, enabled=env.is_main)

    prepare_mnist(cfg.data.root, list(cfg.data.mirrors), env, cfg.data.node_local, device)
    splits = build_splits(cfg.data, cfg.train, env, device)

    module = build_model(cfg.model).to(device)
    syncer = build_sync(cfg.sync, module, device, env.world_size)
    optimizer = build_optimizer(cfg.optim, module.parameters(), cfg.train.lr)

    start_epoch = 0
    ckpt_dir = run_dir / "checkpoints"
    # TORCHELASTIC_RESTART_COUNT counts restarts of *this node's* worker group only
    # (pytorch/pytorch#108158): after a restart every rank must resume, so agree on it.
    restarted = _any_rank(env.restart_count > 0, device)
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

    hosts, node_ranks = _gather_placement(env)
    timer = StepTimer(device)
    bar = _progress(cfg, env.is_main)
    steps_per_epoch = len(splits.train)
    if cfg.train.max_steps_per_epoch > 0:
        steps_per_epoch = min(steps_per_epoch, cfg.train.max_steps_per_epoch)
    log.info("world %d (%d node(s) x %d), %s on %s, sync=%s, model=%s, %d steps/epoch of %d per rank",
             env.world_size, env.num_nodes, env.local_world_size, ctx.backend, device,
             cfg.sync.name, cfg.model.name, steps_per_epoch, cfg.train.batch_size)

    epoch_times: list[float] = []
    comm_fractions: list[float] = []
    record: dict = {}
    for epoch in range(start_epoch, cfg.train.epochs):
        splits.train.set_epoch(epoch)
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        samples = 0
        ctx.synchronize()
        ctx.barrier()  # load-bearing: every rank starts the clock together
        t0 = time.perf_counter()
        batches = iter(splits.train)
        steps = range(steps_per_epoch)
        if bar is not None:
            steps = bar(steps, desc=f"epoch {epoch + 1}/{cfg.train.epochs}", leave=False,
                        unit="step", dynamic_ncols=True)
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
        ctx.synchronize()  # wait for the GPU to finish the epoch's work
        ctx.barrier()  # load-bearing: the epoch ends when the slowest rank ends
        epoch_time = time.perf_counter() - t0

        steps_t = timer.collect()
        comm = syncer.take_comm()
        phases = summarise_steps(steps_t)
        global_loss, global_samples = _all_reduce_sum([loss_sum.item(), float(samples)], device)
        test_loss, test_acc = evaluate(module, splits, cfg.train.eval_batch_size, device)
        step_total = phases["step"]["total"]
        comm_time = max(phases["sync"]["total"], comm.seconds) if cfg.sync.name != "ddp" else comm.seconds
        comm_fraction = min(1.0, comm_time / step_total) if step_total > 0 else 0.0
        algbw, busbw = bandwidth(comm.payload_bytes, comm.seconds, syncer.comm_op, env.world_size)
        record = {
            "epoch": epoch + 1, "world_size": env.world_size,
            "train_loss": global_loss / global_samples, "test_loss": test_loss,
            "test_accuracy": test_acc, "epoch_time_s": epoch_time,
            "samples_per_s": global_samples / epoch_time, "steps": len(steps_t),
            "phase_s": {p: phases[p] for p in (*PHASES, "step")},
            "comm": {"calls": comm.calls, "payload_bytes": comm.payload_bytes,
                     "bytes_sent": comm.bytes_sent, "bytes_recv": comm.bytes_recv,
                     "time_s": comm.seconds, "algbw_GBps": algbw, "busbw_GBps": busbw,
                     "fraction": comm_fraction},
        }
        epoch_times.append(epoch_time)
        comm_fractions.append(comm_fraction)
        if cfg.train.checkpoint and env.is_main:
            # checkpoint first, then the metrics line: a record never outlives its state
            checkpoint.save_epoch(ckpt_dir, epoch + 1, {
                "model": module.state_dict(), "optimizer": optimizer.state_dict(),
                "world_size": env.world_size, "sync": cfg.sync.name})
        writer.epoch(record, {
            "loss/train": record["train_loss"], "loss/test": test_loss,
            "accuracy/test(fraction)": test_acc, "time/epoch(s)": epoch_time,
            "throughput/train(samples/s)": record["samples_per_s"],
            **{f"time/{p}(ms/step)": phases[p]["mean"] * 1e3 for p in PHASES},
            "comm/time(s/epoch)": comm.seconds, "comm/bytes_sent(MB/epoch)": comm.bytes_sent / 1e6,
            "comm/busbw(GB/s)": busbw, "comm/fraction(of step)": comm_fraction,
        })
        log.info("epoch %d/%d  train loss %.4f  test loss %.4f  test acc %.4f  %.2f s  "
                 "%.0f samples/s  comm %.0f%%", epoch + 1, cfg.train.epochs, record["train_loss"],
                 test_loss, test_acc, epoch_time, record["samples_per_s"], 100 * comm_fraction)
        _maybe_fail_once(ctx, epoch + 1)

    if not record:  # resumed a run that had already finished
        test_loss, test_acc = evaluate(module, splits, cfg.train.eval_batch_size, device)
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
        "comm_fraction": statistics.fmean(comm_fractions) if comm_fractions else None,
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
               "hparam/comm_fraction": summary["comm_fraction"] or 0.0})
    return summary


def _gather_placement(env) -> tuple[list[str], list[int]]:
    """The distinct host names of the world in rank order, and the sorted node ranks (on a
    loopback cluster every node has the same host name: the node ranks tell them apart)."""
    from .env import hostname

    mine = (hostname(), env.node_rank)
    pairs: list[Optional[tuple[str, int]]] = [None] * env.world_size
    if dist.is_initialized() and env.world_size > 1:
        dist.all_gather_object(pairs, mine)
    else:
        pairs = [mine]
    hosts = list(dict.fromkeys(p[0] for p in pairs if p))
    return hosts, sorted({p[1] for p in pairs if p})


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
