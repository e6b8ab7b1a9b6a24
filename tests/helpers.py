"""Shared helpers for tests: free ports, real multi-process gloo worlds, CLI runs."""

from __future__ import annotations

import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any, Callable

import torch.multiprocessing as mp
from ddp_lab.ports import free_port

REPO = Path(__file__).resolve().parent.parent




def _entry(rank: int, world: int, port: int, fn: Callable, args: tuple, queue) -> None:
    import datetime

    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=60))
        out = fn(rank, world, *args)
        queue.put((rank, "ok", out))
    except BaseException:  # noqa: BLE001
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_world(fn: Callable, world: int, *args: Any, timeout: float = 120) -> list[Any]:
    """Run fn(rank, world, *args) in `world` real processes over gloo; return per-rank
    results in rank order. A failure or a hang on any rank fails the test."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, fn, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors = []
    try:
        for _ in range(world):
            rank, status, out = queue.get(timeout=timeout)
            if status == "ok":
                results[rank] = out
            else:
                errors.append(f"rank {rank}:\n{out}")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    if errors:
        raise AssertionError("\n".join(errors))
    return [results[r] for r in range(world)]


def count_p2p_bytes(counter: dict) -> None:
    """Count, in `counter["sent"]` / `counter["recv"]`, the bytes this process hands to
    torch.distributed's isend/irecv (directly, as PersistentRingAllReduce does, or through
    batch_isend_irecv, which calls them: every send/recv of ddp_lab.collectives). A receive
    counts when it has been waited for: the ring posts receives a call ahead. Call it once
    per process (a rank of `run_world`); the real sends and receives still run."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    send, recv = c10d.isend, c10d.irecv

    class Counted:
        def __init__(self, work, nbytes):
            self.work, self.nbytes = work, nbytes

        def wait(self, *args):
            out = self.work.wait(*args)
            counter["recv"] += self.nbytes
            self.nbytes = 0
            return out

    def isend(tensor, *args, **kwargs):
        counter["sent"] += tensor.numel() * tensor.element_size()
        return send(tensor, *args, **kwargs)

    def irecv(tensor, *args, **kwargs):
        return Counted(recv(tensor, *args, **kwargs), tensor.numel() * tensor.element_size())

    # both names: P2POp checks its op against distributed_c10d's isend/irecv
    c10d.isend = dist.isend = isend
    c10d.irecv = dist.irecv = irecv


def run_cli(*overrides: str, cwd: Path, timeout: float = 600, env: dict | None = None,
            module: str = "ddp_lab") -> subprocess.CompletedProcess:
    """`python -m ddp_lab <overrides>` as a user runs it, in `cwd`."""
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = str(REPO) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-m", module, *overrides], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)


def run_dir_of(proc: subprocess.CompletedProcess) -> Path:
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("run dir: "), f"last line is not 'run dir: PATH':\n{proc.stdout}\n{proc.stderr}"
    return Path(last.removeprefix("run dir: "))
