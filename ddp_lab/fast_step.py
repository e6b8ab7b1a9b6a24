"""The same steps, sooner: what train() (ddp_lab/train.py) runs before
the first step and how the steps may run.

Before the first step (`prepare_steps`): the synchroniser's preflight (a misconfiguration fails
here, not mid-step), the CPU thread count (`tune_threads`) and train.compile (`compile_model`),
outside every epoch. Then each epoch's steps run eagerly (step.py's `run_steps`), or, with
train.cuda_graph, as `GraphedSteps`: the training step captured once as a CUDA graph, then replayed
(PyTorch's CUDA Graphs notes; docs/performance.md, "Launch-overhead ladder").

The graph: the first steps (11 with DDP, else 3) run eagerly on a side stream; then the batch is
copied into static buffers and, every `.grad` None, forward, loss, backward, `sync()`, the
optimiser's step and the loss/correct sums are recorded into a `torch.cuda.CUDAGraph`; every later
step copies its batch in and replays it. The optimiser must be capturable (Adam:
`capturable=True`); what a graph cannot hold is refused before any process starts
(`cuda_graph_problem`); a batch of another size runs eagerly. The step is timed whole, its
collectives counted once per replay from what the capture recorded.
"""

from __future__ import annotations

import copy
import logging
import time
from contextlib import nullcontext
from typing import Any, Iterable, Optional

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from .config import TrainConfig
from .step import run_steps
from .timing import Clock, StepTimer
from .world.cpu import RankThreads
from .world.distributed import DistContext

log = logging.getLogger("ddp_lab")

# PyTorch's notes: DDP needs 11 eager iterations before capture
WARMUP_DDP = 11
WARMUP = 3


def prepare_steps(train: TrainConfig, ctx: DistContext, syncer, optimizer: torch.optim.Optimizer,
                  splits: Any, batch_size: int) -> Optional[float]:
    """Collective. Preflight, thread count, then train.compile: its seconds, or None."""
    # its calls from here on: where this rank is, for status (its heartbeat record)
    if ctx.heartbeat is not None:
        ctx.heartbeat.follow(comm=syncer.comm)
    x0, y0 = splits.test_x[:2], splits.test_y[:2]
    syncer.preflight(lambda m=syncer.module: F.cross_entropy(m(x0), y0))
    if ctx.threads is not None and ctx.device.type == "cpu":
        tune_threads(ctx, ctx.threads, syncer, optimizer, splits, batch_size)
    return compile_model(syncer, splits, batch_size) if train.compile else None


def tune_threads(ctx, share: RankThreads, syncer, optimizer: torch.optim.Optimizer, splits: Any,
                 batch_size: int, blocks: int = 3, n_steps: int = 8) -> None:
    """Collective. On CPU, where the count was not asked for: time steps on 1 thread against the
    ceiling in alternating blocks, summed over the ranks, and keep the ceiling only if 5% faster
    (`share` says which, and why). State, RNG and comm records are left as before."""
    if not share.tunable or share.threads == 1:
        return
    n = min(batch_size, len(splits.test_x))
    batch = (splits.test_x[:n], splits.test_y[:n])
    saved = copy.deepcopy((syncer.module.state_dict(), optimizer.state_dict()))
    timer = StepTimer(Clock(ctx.device), enabled=False)
    best = {share.threads: float("inf"), 1: float("inf")}
    with torch.random.fork_rng(devices=[]):
        for _ in range(blocks):
            for threads in best:
                torch.set_num_threads(threads)
                seconds = step_seconds(lambda k: run_steps(syncer, optimizer, [batch] * k, timer),
                                       n_steps)
                best[threads] = min(best[threads], seconds)
    syncer.module.load_state_dict(saved[0])
    optimizer.load_state_dict(saved[1])
    syncer.module.zero_grad(set_to_none=True)
    # the trial steps' collectives are no epoch's
    syncer.collect_comm()
    # every rank's, summed
    many, one = ctx.reduce_floats([best[share.threads], best[1]])
    keep = share.threads if many < 0.95 * one else 1
    torch.set_num_threads(keep)
    share.why = (f"{share.why}; a training step took {best[1] * 1e3:.2f} ms on 1 thread, "
                 f"{best[share.threads] * 1e3:.2f} ms on {share.threads}")
    share.threads, share.tunable = keep, False


def step_seconds(steps, n_steps: int = 8) -> float:
    """A step's seconds: `steps(1)` untimed (the first at a thread count), then `steps(n_steps)`
    timed. The thread probe's unit, in a rank (`tune_threads`) and before the ranks
    (ddp_lab/launch/wait_probe.py)."""
    steps(1)
    t0 = time.perf_counter()
    steps(n_steps)
    return (time.perf_counter() - t0) / n_steps


def compile_model(syncer, splits: Any, batch_size: int) -> float:
    """train.compile: torch.compile the model the step calls and compile it now, at the batch size
    and at another (the short last batch), so no epoch holds the compilation. Weights, optimiser
    and RNG are untouched. Returns the seconds."""
    t0 = time.perf_counter()
    syncer.wrapped = torch.compile(syncer.wrapped)
    n = min(batch_size, len(splits.test_x))
    sizes = [n, n - 1] if n > 2 else [n]
    devices = [syncer.device] if syncer.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        for size in sizes:
            F.cross_entropy(syncer.wrapped(splits.test_x[:size]), splits.test_y[:size]).backward()
            # sync.overlap: the buckets backward started are waited for
            syncer.sync()
    syncer.module.zero_grad(set_to_none=True)
    # DDP's warm-up all-reduces are no epoch's
    syncer.collect_comm()
    if syncer.device.type == "cuda":
        torch.cuda.synchronize(syncer.device)
    seconds = time.perf_counter() - t0
    log.info("train.compile: model compiled in %.1f s (outside every epoch)", seconds)
    return seconds


def graph_stream(train_cfg: TrainConfig, device: torch.device):
    """Where the synchroniser is built: with train.cuda_graph on CUDA, a side stream (the notes:
    DDP constructed in a side-stream context for full-backward capture)."""
    if train_cfg.cuda_graph and device.type == "cuda":
        return torch.cuda.stream(torch.cuda.Stream(device))
    return nullcontext()


def graphed_steps(train_cfg: TrainConfig, syncer, optimizer: torch.optim.Optimizer,
                  batch: int) -> Optional[GraphedSteps]:
    """With train.cuda_graph, the epochs' steps as a `GraphedSteps` of
    `batch` samples a rank; else None (they run eagerly)."""
    if not train_cfg.cuda_graph:
        return None
    # dist.device=auto resolved to cpu on this rank
    if syncer.device.type != "cuda":
        raise ValueError(f"train.cuda_graph=true: this rank's device is {syncer.device}; "
                         "CUDA graphs need dist.device=cuda and dist.backend=nccl")
    return GraphedSteps(syncer, optimizer, batch)


class GraphedSteps:
    """`run_steps` as one CUDA graph a step (module docstring); the graph lives across epochs."""

    def __init__(self, syncer, optimizer: torch.optim.Optimizer, batch: int, warmup: int = 0):
        """`batch`: the per-rank batch of a full step, the one the graph is captured for."""
        self.syncer, self.optimizer, self.batch = syncer, optimizer, batch
        wrapped = getattr(syncer.wrapped, "_orig_mod", syncer.wrapped)
        self.warmup = warmup or (WARMUP_DDP if isinstance(wrapped, DistributedDataParallel)
                                 else WARMUP)
        self.eager_steps = 0  # warm-up steps run so far
        self.side = torch.cuda.Stream(syncer.device)
        self.graph: Any = None
        self.replays = 0  # this epoch's
        # the calls and bytes of one replay (its capture's count)
        self.per_step: tuple = ()
        # the epoch's sums, added to inside the graph: static, zeroed at each epoch's start
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=syncer.device)
        self.correct = torch.zeros((), dtype=torch.int64, device=syncer.device)
        make_capturable(optimizer)

    def run_steps(self, batches: Iterable, timer: StepTimer) -> tuple[torch.Tensor, torch.Tensor]:
        """An epoch's steps, as step.py's `run_steps`: its summed loss
        and correct predictions, on the device."""
        self.loss_sum.zero_()
        self.correct.zero_()
        self.replays = 0
        for x, y in batches:
            if len(y) != self.batch:
                # another shape: the epoch's last batch
                self.eager(x, y, timer, None)
                continue
            if self.graph is None and self.eager_steps < self.warmup:
                self.eager(x, y, timer, self.side)
                self.eager_steps += 1
                continue
            if self.graph is None:
                self.capture(x, y, timer)
            # timed whole: the graph's kernels are not seen
            with timer.phase("step"):
                self.static_x.copy_(x, non_blocking=True)
                self.static_y.copy_(y, non_blocking=True)
                self.graph.replay()
            timer.end_step()
            self.replays += 1
        self.syncer.comm.add_counts(self.per_step, self.replays)
        return self.loss_sum.clone(), self.correct.clone()

    def eager(self, x: torch.Tensor, y: torch.Tensor, timer: StepTimer, stream) -> None:
        """One eager step (`run_steps` on this one batch), on `stream` (None: the current)."""
        current = torch.cuda.current_stream(self.syncer.device)
        if stream is not None:
            # the batch was made on the current stream
            stream.wait_stream(current)
        with torch.cuda.stream(stream) if stream is not None else nullcontext():
            loss, correct = run_steps(self.syncer, self.optimizer, [(x, y)], timer)
            self.loss_sum += loss
            self.correct += correct
        if stream is not None:
            current.wait_stream(stream)

    def capture(self, x: torch.Tensor, y: torch.Tensor, timer: StepTimer) -> None:
        """Record the step into the graph (nothing runs); the caller replays it for (x, y)."""
        t0 = time.perf_counter()
        syncer = self.syncer
        # the data path copies into these
        self.static_x, self.static_y = x.clone(), y.clone()
        # its hooks record events: none may fire in a capture
        if timer.grads is not None:
            timer.grads.remove()
            timer.grads = None
        # the collectives in the graph are counted, never stamped
        syncer.comm.enabled = False
        torch.cuda.synchronize(syncer.device)
        # backward makes .grad in the graph's memory
        self.optimizer.zero_grad(set_to_none=True)
        before = syncer.comm.counts()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.step()
        self.per_step = tuple(a - b for a, b in zip(syncer.comm.counts(), before))
        # the capture ran nothing: every replay counts
        syncer.comm.add_counts(self.per_step, -1)
        self.graph = graph
        log.info("train.cuda_graph: the step captured as one CUDA graph after %d eager "
                 "warm-up steps (%.2f s); step timed whole (cuda_graph)",
                 self.eager_steps, time.perf_counter() - t0)

    def step(self) -> None:
        """The step the graph holds: `run_steps`'s, on the static buffers, the sums kept on the
        device (no zero_grad: every .grad was None at capture, so backward writes it)."""
        syncer, x, y = self.syncer, self.static_x, self.static_y
        out = syncer.wrapped(x)
        loss = F.cross_entropy(out, y)
        loss.backward()
        # every rank's .grad becomes the average
        syncer.sync()
        syncer.step(self.optimizer)
        self.loss_sum += loss.detach().double() * len(y)
        self.correct += (out.argmax(1) == y).sum()


def make_capturable(optimizer: torch.optim.Optimizer) -> None:
    """Adam (and the optimisers with the flag): `capturable=True`, its step count a device tensor,
    so the step reads no host value; state a checkpoint loaded is moved along."""
    for group in optimizer.param_groups:
        if "capturable" in group:
            group["capturable"] = True
            for p in group["params"]:
                state = optimizer.state.get(p, {})
                if torch.is_tensor(state.get("step")):
                    state["step"] = state["step"].to(p.device, torch.float32)
