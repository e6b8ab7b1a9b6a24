"""The training run, on every rank: data, model, synchroniser, optimiser, then epoch after
epoch the steps (ddp_lab/step.py), evaluation, a checkpoint and the epoch's record.

`train` reads as the course notebook's loop plus the sync: data, then the seeded model,
its synchroniser and the optimiser (`build_parts`), then per epoch `run_steps` (data,
forward, backward, sync, optimiser step), evaluation, a checkpoint and the epoch's
record. What a real run needs besides sits behind one call each, and each part is handed
the config sections it reads (`cfg.train`, `cfg.timing`, ...: the typed schemas of
ddp_lab/config/train.py), so its call says what it depends on:

- `Checkpointer` (ddp_lab/rank/checkpointer.py): where the run starts (resume, restarts and
  requeues agreed on by every rank), the checkpoint after each epoch, a graceful stop's;
- `EpochControl` (ddp_lab/rank/epoch.py): the barriers and clocks around each epoch's steps,
  the step timer; it hands out the epoch's batches (`EpochBatches`: the data phase, the
  step count, injected delays, the stop agreement) and back one `MeasuredEpoch`. A stop
  every rank agreed on comes out of it as `Stopped`, which `train` hands to the
  checkpointer in one place; after each epoch it runs the failure hook (DDP_LAB_FAIL_ONCE);
- `Telemetry` (ddp_lab/rank/telemetry.py): the run's records (metrics.jsonl, summary.json,
  TensorBoard, the console line) from the measured epochs, and TensorBoard's per-step
  points as the steps end (it listens to the epoch control's step timer). Of the three it alone
  takes the whole config: the records describe the run (its config, hparams, summary.json's
  settings).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from .config import Config, DataConfig, TrainConfig, batch_plan
from .data import Splits, build_splits
from .data_fetch import prepare_mnist
from .world.distributed import DistContext
from .models import build_model, build_optimizer
from .rank.checkpointer import Checkpointer
from .rank.compile import preflight_and_compile
from .rank.cuda_graph import build_stream, step_runner
from .rank.epoch import EpochControl, Position, Stopped
from .folder.files import read_json_or_empty
from .folder.records import RunSummary
from .folder import progress
from .folder import weights as weights_file
from .rank.telemetry import Telemetry
from .step import evaluate, run_steps
from .sync import Synchroniser, build_sync
from .timing import Clock

log = logging.getLogger("ddp_lab")


def train(cfg: Config, ctx: DistContext, run_dir: Path) -> RunSummary:
    """Train per `cfg` on the initialised process group; return the run's summary. The
    course notebook's loop plus the sync; the rest is one call each (module docstring)."""
    batching = batch_plan(cfg.train, ctx.env.world_size)  # per-rank batch, micro-batches
    splits = load_data(cfg.data, cfg.train, ctx)  # this rank's shard of MNIST
    ctx.barrier()  # load-bearing: every rank's clock starts at the same instant (trace)
    clock = Clock(ctx.device)
    module, syncer, optimizer = build_parts(cfg, ctx, clock)  # seeded: the same on every rank
    compile_s = preflight_and_compile(cfg.train, syncer, optimizer, splits, batching.micro, ctx)
    ckpt = Checkpointer(cfg.train, ctx, run_dir / "checkpoints", module, optimizer, syncer,
                        batching)
    start = ckpt.load()  # epoch 0 step 0, or where the newest checkpoint stands
    if start.epoch >= cfg.train.epochs:  # a finished run, started again: leave it as it is
        return finished(run_dir, start.epoch)
    control = EpochControl(cfg.train, cfg.timing, cfg.debug, ctx, clock, syncer,
                           ckpt.resumed_part, run_dir)  # clocks, timer, stop, delay, profiler
    telemetry = Telemetry(cfg, ctx, run_dir, steps_per_epoch(cfg.train, splits),
                          syncer.bytes_exact, plan=batching, compile_s=compile_s, control=control)
    telemetry.start(start.epoch, start.step)
    steps_of = step_runner(cfg.train, syncer, optimizer) if cfg.train.cuda_graph else run_steps
    with control.stop_control(run_dir):  # a stop: every rank agrees, saves, then leaves
        try:
            for epoch in range(start.epoch, cfg.train.epochs):
                batches = control.begin(epoch, splits.train, telemetry.progress)
                loss_sum, correct = steps_of(syncer, optimizer, batches, control.timer,
                                          batching.micro_batch)
                measured = control.end(batches, loss_sum, correct)  # raises Stopped mid-epoch
                with syncer.evaluation():  # fsdp2: its weights gathered once, not per batch
                    measured.test = evaluate(module, splits, cfg.train.eval_batch_size, ctx)
                ckpt.save(Position(epoch + 1))  # then the record: it never outlives its state
                telemetry.epoch(measured)
                control.between_epochs(epoch + 1)  # the failure hook; raises Stopped
        except Stopped as stop:
            return telemetry.finish(**ckpt.on_stop(stop),
                                    memory=memory_per_rank(syncer, optimizer, ctx))
    syncer.close()  # collective: every rank has run the same steps
    weights = final_weights(syncer, ctx, run_dir)  # model.pt: the report compares runs by it
    return telemetry.finish(memory=memory_per_rank(syncer, optimizer, ctx),
                            weights_sha256=weights)


def load_data(data: DataConfig, train: TrainConfig, ctx: DistContext) -> Splits:
    """MNIST on disk (one rank per shared root fetches it, the others wait), then this
    rank's shard of the training set (batched per `train`) and its share of the test set,
    on its device."""
    prepare_mnist(data.root, list(data.mirrors), ctx, data.node_local)
    return build_splits(data, train, ctx.env, ctx.device)


def build_parts(cfg: Config, ctx: DistContext, clock: Clock
                ) -> tuple[torch.nn.Module, Synchroniser, torch.optim.Optimizer]:
    """The model (seeded with train.seed first: the same initial weights on every rank), its
    synchroniser and the optimiser, on this rank's device. The benchmarks
    (`python -m ddp_lab.bench.suite`) build theirs here too (ddp_lab/bench/scaffold.py), so
    a benchmark times the trainer's own parts."""
    torch.manual_seed(cfg.train.seed)
    module = build_model(cfg.model).to(ctx.device)
    with build_stream(cfg.train, ctx.device):  # train.cuda_graph: DDP built on a side stream
        syncer = build_sync(cfg.sync, module, ctx.device, ctx.env.world_size, clock=clock,
                            timing=cfg.timing.enabled)
    progress.current().follow(comm=syncer.comm)  # its calls: where this rank is (status)
    # over what the sync says this rank steps: every parameter, or (zero1) its shard;
    # torch_zero wraps it in torch's ZeroRedundancyOptimizer
    optimizer = syncer.make_optimizer(lambda params: build_optimizer(cfg.optim, params,
                                                                     cfg.train.lr))
    return module, syncer, optimizer


def memory_per_rank(syncer: Synchroniser, optimizer: torch.optim.Optimizer,
                    ctx: DistContext) -> dict:
    """Collective: this rank's bytes (Synchroniser.memory) and every rank's optimiser state
    (`optimizer_state_bytes_per_rank`: a sharded optimiser's largest and smallest shard)."""
    mine = syncer.memory(optimizer)
    every = ctx.gather_objects(mine["optimizer_state_bytes"])
    return {**mine, "optimizer_state_bytes_per_rank": [int(b) for b in every]}


def final_weights(syncer: Synchroniser, ctx: DistContext, run_dir: Path):
    """Collective: the whole model's weights written to the run folder's model.pt by rank 0;
    their digest there (summary.json `weights_sha256`), None elsewhere."""
    state = syncer.model_state()  # fsdp2: its shards gathered
    return weights_file.save(run_dir, state) if ctx.env.is_main else None


def steps_per_epoch(train: TrainConfig, splits: Splits) -> int:
    """The shard's batches, or train.max_steps_per_epoch of them."""
    n, most = len(splits.train), train.max_steps_per_epoch
    return min(n, most) if most > 0 else n


def finished(run_dir: Path, epochs: int) -> RunSummary:
    """A run that has done all its epochs, started again: its summary, left as it is."""
    log.info("the run in %s has completed its %d epochs: nothing to do", run_dir, epochs)
    return RunSummary.from_dict(read_json_or_empty(run_dir / "summary.json"))
