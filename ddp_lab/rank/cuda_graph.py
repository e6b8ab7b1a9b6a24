"""train.cuda_graph=true: the training step captured once as a CUDA
graph, then replayed (PyTorch's CUDA Graphs notes; docs/performance.md,
"Launch-overhead ladder").

The first steps (11 with DDP, else 3) run eagerly on a side stream; then
the batch is copied into static buffers and, every `.grad` None,
forward, loss, backward, `sync()`, the optimiser's step and the
loss/correct sums are recorded into a `torch.cuda.CUDAGraph`; every
later step copies its batch in and replays it. The optimiser must be
capturable (Adam: `capturable=True`); what a graph cannot hold is
refused before any process starts (`cuda_graph_problem`); a batch of
another size runs eagerly. The step is timed whole, its collectives
counted once per replay from what the capture recorded.
"""

from __future__ import annotations

import logging
import time
from contextlib import nullcontext
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from ..config import TrainConfig, batch_plan
from ..timing import StepTimer

log = logging.getLogger("ddp_lab")

# PyTorch's notes: DDP needs 11 eager iterations before capture
WARMUP_DDP = 11
WARMUP = 3


def enabled(train_cfg: TrainConfig) -> bool:
    return bool(getattr(train_cfg, "cuda_graph", False))


def build_stream(train_cfg: TrainConfig, device: torch.device):
    """Where the synchroniser is built: with train.cuda_graph on CUDA, a
    side stream (the notes: DDP constructed in a side-stream context for
    full-backward capture)."""
    if enabled(train_cfg) and device.type == "cuda":
        return torch.cuda.stream(torch.cuda.Stream(device))
    return nullcontext()


def step_runner(train_cfg: TrainConfig, syncer, optimizer: torch.optim.Optimizer,
                run_steps: Callable) -> Callable:
    """What runs an epoch's steps: the loop's `run_steps`, or with
    train.cuda_graph a `GraphedSteps` of it, with the same call and
    results."""
    if not enabled(train_cfg):
        return run_steps
    # dist.device=auto resolved to cpu on this rank
    if syncer.device.type != "cuda":
        raise ValueError(f"train.cuda_graph=true: this rank's device is {syncer.device}; "
                         "CUDA graphs need dist.device=cuda and dist.backend=nccl")
    return GraphedSteps(syncer, optimizer, run_steps,
                        batch_plan(train_cfg, syncer.world_size).per_rank)


class GraphedSteps:
    """`run_steps` as one CUDA graph a step (module docstring); the
    graph lives across epochs. Call it as `run_steps(syncer, optimizer,
    batches, timer)`."""

    def __init__(self, syncer, optimizer: torch.optim.Optimizer, run_steps: Callable,
                 batch: int, warmup: int = 0):
        """`run_steps`: the loop's eager steps; `batch`: the per-rank
        batch of a full step, the one the graph is captured for."""
        self.syncer, self.optimizer, self.batch = syncer, optimizer, batch
        self.run_steps = run_steps
        wrapped = getattr(syncer.wrapped, "_orig_mod", syncer.wrapped)
        self.warmup = warmup or (WARMUP_DDP if isinstance(wrapped, DistributedDataParallel)
                                 else WARMUP)
        self.eager_steps = 0  # warm-up steps run so far
        self.side = torch.cuda.Stream(syncer.device)
        self.graph: Any = None
        self.replays = 0  # this epoch's
        # the calls and bytes of one replay (its capture's count)
        self.per_step: tuple = ()
        # the epoch's sums, added to inside the graph: static, zeroed at
        # each epoch's start
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=syncer.device)
        self.correct = torch.zeros((), dtype=torch.int64, device=syncer.device)
        make_capturable(optimizer)

    def __call__(self, syncer, optimizer: torch.optim.Optimizer, batches: Iterable,
                 timer: StepTimer, micro_batch: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
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
        """One eager step (`run_steps` on this one batch), on `stream`
        (None: the current)."""
        current = torch.cuda.current_stream(self.syncer.device)
        if stream is not None:
            # the batch was made on the current stream
            stream.wait_stream(current)
        with torch.cuda.stream(stream) if stream is not None else nullcontext():
            loss, right = self.run_steps(self.syncer, self.optimizer, [(x, y)], timer)
            self.loss_sum += loss
            self.correct += right
        if stream is not None:
            current.wait_stream(stream)

    def capture(self, x: torch.Tensor, y: torch.Tensor, timer: StepTimer) -> None:
        """Record the step into the graph (nothing runs); the caller
        replays it for (x, y)."""
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
        """The step the graph holds: `run_steps`'s, on the static
        buffers, the sums kept on the device (no zero_grad: every .grad
        was None at capture, so backward writes it)."""
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
    """Adam (and the optimisers with the flag): `capturable=True`, its
    step count a device tensor, so the step reads no host value; state a
    checkpoint loaded is moved along."""
    for group in optimizer.param_groups:
        if "capturable" in group:
            group["capturable"] = True
            for p in group["params"]:
                state = optimizer.state.get(p, {})
                if torch.is_tensor(state.get("step")):
                    state["step"] = state["step"].to(p.device, torch.float32)
