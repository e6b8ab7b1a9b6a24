"""Process group set-up: backend, device, bounded timeouts, clean teardown."""

from __future__ import annotations

import contextlib
import datetime
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Optional, Protocol, Sequence

import torch
import torch.distributed as dist

from . import cpu, fingerprint, torch_support
from .hang import Watchdog, enable_flight_recorder
from ..config import device_type
from .cpu import RankThreads
from .env import DistEnv

class Heartbeat(Protocol):
    """Where this rank is, for the other ranks, the launcher and status
    (its record: ddp_lab/folder/heartbeat.py)."""

    def collective(self, op: str = "") -> None: ...
    def follow(self, timer: Any = None, comm: Any = None) -> None: ...
    def at(self, epoch: int, step: int) -> None: ...


@dataclass(frozen=True)
class DistContext:
    """This rank in its initialised process group. `run_rank` (ddp_lab/rank/main.py) adds what the
    rank's machinery shares: its heartbeat record, which counts each collective below, its hang
    watchdog and its torch threads (`tune_threads` may lower them)."""

    env: DistEnv
    backend: str
    device: torch.device
    heartbeat: Optional[Heartbeat] = None
    watchdog: Watchdog = Watchdog(0)
    threads: Optional[RankThreads] = None
    # defaults the installed torch could not honour, in words (the run's first lines say them)
    notes: tuple[str, ...] = ()

    def _entering(self, op: str) -> None:
        if self.heartbeat is not None:
            self.heartbeat.collective(op)

    def barrier(self) -> None:
        if dist.is_initialized() and self.env.world_size > 1:
            self._entering("barrier")
            if self.backend == "nccl":
                dist.barrier(device_ids=[self.device.index])
            else:
                dist.barrier()

    def synchronize(self) -> None:
        """Wait for queued GPU work, so a host clock read after it means something."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    # ------------------------------------------------------------ scalar collectives
    # every small agreement of a run (a loss, a flag, a host, a step time) goes through these
    @property
    def collective(self) -> bool:
        """True when there are other ranks to talk to (no process group, or 1 rank: none)."""
        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

    def _tensor(self, values: Sequence[float]) -> torch.Tensor:
        # nccl moves only CUDA tensors; on CPU float64 keeps sums of many samples exact
        dtype = torch.float64 if self.device.type == "cpu" else torch.float32
        return torch.tensor([float(v) for v in values], dtype=dtype, device=self.device)

    def reduce_floats(self, values: Sequence[float], op: str = "sum") -> list[float]:
        """`values` reduced element-wise over all ranks; op: sum | mean | max | min."""
        if op not in _REDUCE_OPS:
            raise ValueError(f"reduce op {op!r}: choose {', '.join(_REDUCE_OPS)}")
        t = self._tensor(values)
        if self.collective:
            self._entering("all_reduce")
            dist.all_reduce(t, op=_REDUCE_OPS[op])
            if op == "mean":
                t /= dist.get_world_size()  # ReduceOp.AVG exists on nccl only
        return t.tolist()

    def reduce_float(self, value: float, op: str = "sum") -> float:
        return self.reduce_floats([value], op)[0]

    def any_rank(self, flag: bool) -> bool:
        """True on every rank when `flag` is true on at least one."""
        return self.reduce_float(1.0 if flag else 0.0, "max") > 0

    def gather_objects(self, obj: Any) -> list[Any]:
        """Every rank's picklable `obj`, in rank order, on every rank."""
        if not self.collective:
            return [obj]
        out: list[Any] = [None] * dist.get_world_size()
        self._entering("all_gather")
        dist.all_gather_object(out, obj)
        return out

    def gather_objects_to(self, obj: Any, dst: int = 0) -> Optional[list[Any]]:
        """Every rank's picklable `obj` in rank order on rank `dst`; None on the others."""
        if not self.collective:
            return [obj]
        mine = dist.get_rank() == dst
        out: Optional[list[Any]] = [None] * dist.get_world_size() if mine else None
        self._entering("gather")
        dist.gather_object(obj, out, dst=dst)
        return out


_REDUCE_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM,
               "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def choose_device(env: DistEnv, device: str = "auto") -> torch.device:
    device = device_type(device, torch.cuda.is_available())
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("dist.device=cuda but CUDA is not available: use dist.device=cpu")
        n = torch.cuda.device_count()
        if env.local_rank >= n:
            raise RuntimeError(
                f"local rank {env.local_rank} has no GPU ({n} visible): lower "
                "launcher.nproc_per_node to the GPU count, or use dist.device=cpu")
        torch.cuda.set_device(env.local_rank)
        return torch.device("cuda", env.local_rank)
    if device != "cpu":
        raise ValueError(f"dist.device={device!r}: choose auto, cpu or cuda")
    return torch.device("cpu")


def choose_backend(device: torch.device, backend: str = "auto") -> str:
    if backend == "auto":
        return "nccl" if device.type == "cuda" else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"dist.backend={backend!r}: choose auto, gloo or nccl")
    if backend == "nccl" and device.type != "cuda":
        raise ValueError("dist.backend=nccl needs CUDA tensors: use dist.backend=gloo on CPU")
    return backend


@contextlib.contextmanager
def distributed(env: DistEnv, backend: str = "auto", device: str = "auto",
                timeout_s: float = 120.0, init_timeout_s: Optional[float] = None,
                run_dir: Optional[Path] = None, **rank: Any) -> Iterator[DistContext]:
    """Initialise the default process group for `env`, destroyed on the way out: within
    `init_timeout_s` (default `timeout_s`), then `timeout_s` per collective (a dead peer is an
    error, not a hang); on nccl with a `run_dir`, the flight recorder on. `rank`: the DistContext's
    heartbeat, watchdog and threads."""
    dev = choose_device(env, device)
    be = choose_backend(dev, backend)
    kwargs, notes = {}, []
    if be == "nccl":
        if torch_support.accepts(dist.init_process_group, "device_id"):  # torch >= 2.3
            kwargs["device_id"] = dev  # binds the communicator to this GPU eagerly
        else:
            notes.append(f"dist.backend=nccl: the communicator binds to {dev} at the first "
                         f"collective (torch {torch_support.version()} has no "
                         "init_process_group(device_id=...); torch >= 2.3 has)")
        # read by ProcessGroupNCCL when it is made: set them first
        if run_dir is not None:
            enable_flight_recorder(run_dir)
            # NCCL's INFO lines into RUN_DIR/logs: the fingerprint reads its transport there
            fingerprint.enable_nccl_debug(run_dir)
    # env:// rather than tcp://: under torchrun the agent already serves the store on MASTER_PORT
    # (TORCHELASTIC_USE_AGENT_STORE) and env:// knows to join it as a client.
    os.environ["MASTER_ADDR"] = env.master_addr
    os.environ["MASTER_PORT"] = str(env.master_port)
    init_timeout = datetime.timedelta(seconds=init_timeout_s or timeout_s)
    dist.init_process_group(be, init_method="env://", rank=env.rank,
                            world_size=env.world_size, timeout=init_timeout, **kwargs)
    if init_timeout_s and init_timeout_s != timeout_s and not set_timeout(timeout_s):
        notes.append(f"dist.timeout_s={timeout_s:g}: every collective keeps "
                     f"dist.init_timeout_s={init_timeout_s:g} (torch {torch_support.version()} "
                     "cannot change a group's timeout; torch >= 2.3 can)")
    try:
        yield DistContext(env=env, backend=be, device=dev, notes=tuple(notes), **rank)
    finally:
        if dist.is_initialized():
            if be == "gloo" and torch.__version__ < (2, 8):
                # torch < 2.8 destroys a group holding the GIL (pytorch/pytorch#154976) and waits
                # for gloo's worker threads, one of which may still be dropping the last
                # collective's tensors, which needs the GIL: each waits for the other. A moment
                # with the GIL released lets the worker finish first (a torch 2.2 rank hung in
                # its teardown so, once, its peer done and waiting).
                time.sleep(0.05)
            dist.destroy_process_group()


def set_timeout(timeout_s: float) -> bool:
    """The default group's timeout for every later collective (torch >= 2.9: dist.set_timeout; 2.3
    to 2.8: _set_pg_timeout). False on torch 2.2: the init timeout stays."""
    import torch.distributed.distributed_c10d as c10d  # lazy: torch < 2.9's private module

    setter = getattr(dist, "set_timeout", None) or getattr(c10d, "_set_pg_timeout", None)
    if setter is None:
        return False
    setter(datetime.timedelta(seconds=timeout_s))
    return True


def local_gloo_world(rank: int, world: int, port: int, timeout_s: float = 300.0) -> DistContext:
    """This process as rank `rank` of a one-machine gloo group of `world` CPU ranks at
    127.0.0.1:`port`, without a launcher (the benchmark scripts); the caller destroys it."""
    env = DistEnv(rank=rank, local_rank=rank, world_size=world, local_world_size=world,
                  node_rank=0, num_nodes=1, master_addr="127.0.0.1", master_port=port,
                  source="single")
    torch.set_num_threads(cpu.equal_share(world))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
    return DistContext(env=env, backend="gloo", device=torch.device("cpu"))
