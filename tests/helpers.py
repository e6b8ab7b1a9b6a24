"""The one helper module of the tests: real multi-process gloo worlds, `python -m ddp_lab...`
as a user runs it (importing *this* checkout), run folders read back, composed configs.

conftest.py puts tests/ on sys.path, so every test module does `from helpers import ...`;
the fixtures (`slurm_cluster`, `shared_data_root`; `netlab`, `netlab_factory` from
netlab_fixture.py) live in conftest.py itself."""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path
from typing import Any, Callable, Mapping

import pytest
import torch.multiprocessing as mp
from ddp_lab.world.ports import free_port

REPO = Path(__file__).resolve().parent.parent
PY = sys.executable
# small and fast: the launchers are under test there, not the training
QUICK = ["train.epochs=1", "train.max_steps_per_epoch=20", "train.eval_batch_size=2000",
         "log.progress=lines"]

__all__ = ["REPO", "PY", "QUICK", "free_port", "run_world", "child_env", "run_cli", "run_dir_of",
           "summary", "describe", "compose", "world_context"]


def _entry(rank: int, world: int, port: int, fn: Callable, args: tuple, queue,
           environ: dict, cwd: str) -> None:
    import datetime

    import torch.distributed as dist

    # a forkserver child starts with the server's environment and folder: take the test's
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
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


# Modules every rank of a test world imports: the forkserver imports them once per test
# session, so a rank starts in milliseconds instead of importing torch again (~2-3 s a
# process on these 2-core machines, x ~400 worlds).
# torch._dynamo: the first optimiser a process builds imports it (~5 s on these machines)
PRELOAD = ["torch", "torch.distributed", "torch.nn.parallel", "torch._dynamo",
           "ddp_lab.collectives", "ddp_lab.sync", "ddp_lab.train"]


def world_context():
    """A multiprocessing context whose children are forked from one clean server process
    that has imported PRELOAD and run nothing (no thread pool, no process group): each
    child is as fresh as a spawned one, without the import. Use it wherever a test starts
    processes that run a Python function."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)  # read when the server starts (the first Process)
    return ctx


def run_world(fn: Callable, world: int, *args: Any, timeout: float = 120) -> list[Any]:
    """Run fn(rank, world, *args) in `world` real processes over gloo; return per-rank
    results in rank order. A failure or a hang on any rank fails the test."""
    ctx = world_context()
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, port, fn, args, queue, dict(os.environ),
                                              os.getcwd())) for r in range(world)]
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
    torch.distributed's isend/irecv (directly, as PrepostedRingAllReduce does, or through
    batch_isend_irecv, which calls them: every send/recv of ddp_lab.collectives). A receive
    counts when it has been waited for: the ring posts receives a call ahead. Sends are
    also counted by destination, in `counter["to"]` (global rank -> bytes), when the
    counter has that key. Call it once per process (a rank of `run_world`); the real sends
    and receives still run."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    send, recv = c10d.isend, c10d.irecv

    def destination(args, kwargs) -> int:
        # isend(tensor, dst=None, group=None, tag=0, group_dst=None); batch_isend_irecv
        # passes group_dst, our persistent ring a global dst
        dst = kwargs.get("dst", args[0] if args else None)
        if dst is None:
            group = kwargs.get("group", args[1] if len(args) > 1 else None)
            dst = dist.get_global_rank(group or dist.group.WORLD, kwargs["group_dst"])
        return dst

    class Counted:
        def __init__(self, work, nbytes):
            self.work, self.nbytes = work, nbytes

        def wait(self, *args):
            out = self.work.wait(*args)
            counter["recv"] += self.nbytes
            self.nbytes = 0
            return out

    def isend(tensor, *args, **kwargs):
        nbytes = tensor.numel() * tensor.element_size()
        counter["sent"] += nbytes
        if "to" in counter:
            dst = destination(args, kwargs)
            counter["to"][dst] = counter["to"].get(dst, 0) + nbytes
        return send(tensor, *args, **kwargs)

    def irecv(tensor, *args, **kwargs):
        return Counted(recv(tensor, *args, **kwargs), tensor.numel() * tensor.element_size())

    # both names: P2POp checks its op against distributed_c10d's isend/irecv
    c10d.isend = dist.isend = isend
    c10d.irecv = dist.irecv = irecv


def log_collectives(calls: list) -> None:
    """Append `(op, numel, element size)` to `calls` for every tensor this process hands to
    torch.distributed's all_reduce, reduce or broadcast (ours, and torch's DDP comm hooks,
    which look them up on the module at each call). The real collectives still run. Call it
    once per process (a rank of `run_world`)."""
    import torch.distributed as dist

    def logged(op, real):
        def call(tensor, *args, **kwargs):
            calls.append((op, tensor.numel(), tensor.element_size()))
            return real(tensor, *args, **kwargs)
        return call

    for op in ("all_reduce", "reduce", "broadcast"):
        setattr(dist, op, logged(op, getattr(dist, op)))



def child_env(extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None) -> dict:
    """The environment for a `python -m ddp_lab...` child: `base` (default os.environ) plus
    `extra`, with this checkout first on PYTHONPATH, so the submitting process and every rank
    it starts import the code under test (not the venv's editable install)."""
    env = dict(os.environ if base is None else base)
    env.pop("DDP_LAB_FAIL_ONCE", None)  # fault injection only where a test asks for it
    env.update(extra or {})
    path = env.get("PYTHONPATH", "")
    if path.split(os.pathsep)[0] != str(REPO):
        env["PYTHONPATH"] = str(REPO) + (os.pathsep + path if path else "")
    return env


def run_cli(*args: str, cwd: Path, env: Mapping[str, str] | None = None, timeout: float = 600,
            module: str = "ddp_lab", stdin=subprocess.DEVNULL) -> subprocess.CompletedProcess:
    """`python -m <module> <args>` as a user runs it, in `cwd`; `env` holds the variables to
    add to (or override in) `child_env()`: a whole environment such as a cluster's works too."""
    try:
        return subprocess.run([PY, "-m", module, *args], cwd=cwd, env=child_env(env),
                              capture_output=True, text=True, timeout=timeout, stdin=stdin)
    except subprocess.TimeoutExpired as e:
        # what the command had printed by then: where it was when the time ran out
        def text(b) -> str:
            return b.decode(errors="replace") if isinstance(b, bytes) else b or ""
        partial = subprocess.CompletedProcess(e.cmd, None, text(e.stdout), text(e.stderr))
        pytest.fail(f"python -m {module} {' '.join(args)}: no end after {timeout:.0f} s\n"
                    f"{describe(partial)}")


def printed_run_dir(proc: subprocess.CompletedProcess) -> Path | None:
    """The run folder a CLI run's last `run dir: PATH` line names, or None (no such line)."""
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("run dir: ")]
    return Path(lines[-1].removeprefix("run dir: ")) if lines else None


def run_dir_of(proc: subprocess.CompletedProcess) -> Path:
    """The run folder a CLI run printed: `run dir: PATH` must be its last line of stdout."""
    found = printed_run_dir(proc)
    assert found is not None, f"no 'run dir:' line\n{describe(proc)}"
    # the last `run dir:` line is the last line
    assert proc.stdout.rstrip().splitlines()[-1].startswith("run dir: "), \
        f"run dir must be the last line\n{describe(proc)}"
    return found


def summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def tensorboard(run_dir: Path):
    """The run's TensorBoard run, read as TensorBoard reads it (every point kept): the
    one folder under tb/ with event files, whatever its name."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    folders = {p.parent for p in (run_dir / "tb").rglob("events.out.tfevents.*")}
    assert len(folders) == 1, f"one TensorBoard run per training, not {sorted(folders)}"
    acc = EventAccumulator(str(folders.pop()), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc


def describe(proc: subprocess.CompletedProcess) -> str:
    return f"rc={proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}"


def compose(*overrides: str, config_name: str = "config"):
    """The config `python -m ddp_lab <overrides>` (config_name="config") or
    `python -m ddp_lab.bench <overrides>` (config_name="bench") would compose."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from ddp_lab.bench.config import register_bench_configs
    from ddp_lab.config import CONF_DIR, register_configs

    # the bench's schema nodes only for the bench's config, as its entry point registers them
    if config_name == "bench":
        register_bench_configs()
    else:
        register_configs()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
        return hydra_compose(config_name=config_name, overrides=list(overrides))


@functools.cache
def _registered() -> None:
    """The schema nodes in Hydra's ConfigStore, as the entry point puts them: once (the
    store outlives each run's Hydra; registering again took 0.4 s a run)."""
    from ddp_lab import config

    config.register_configs()


def run_in_process(args: list[str], env: Mapping[str, str] | None = None) -> tuple[int, str, str]:
    """`python -m ddp_lab ARGS` in this process, through the same `cli` call as
    ddp_lab/__main__.py: (exit status, stdout, stderr). A dry run or a refusal takes
    0.1-0.4 s here (Hydra's composition) against ~2 s as a process (the interpreter,
    hydra's import). `env` is set
    for the call; sys.argv, os.environ and Hydra's global state are put back after it."""
    from hydra.core.global_hydra import GlobalHydra

    from ddp_lab import config
    from ddp_lab.command.cli import cli
    from ddp_lab.command.submit import check, submit

    _registered()
    out, err = io.StringIO(), io.StringIO()
    argv, environ = sys.argv, dict(os.environ)
    sys.argv = ["ddp_lab", *args]
    os.environ.update(env or {})
    rc = None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            cli("config", submit, check, schemas=(config,))
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = argv
        os.environ.clear()
        os.environ.update(environ)
        GlobalHydra.instance().clear()
    return rc, out.getvalue(), err.getvalue()
