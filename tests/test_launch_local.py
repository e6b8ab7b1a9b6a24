"""launcher=local for real: torchrun restarts a failed worker group and the run resumes
from the last checkpoint (launcher.max_restarts); a rendezvous port another program holds
ends the run in one line naming it."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Iterator, Optional

import pytest
from helpers import PY, QUICK, child_env, describe, free_port, run_cli, run_dir_of, summary

from ddp_lab.world import ports

pytestmark = [pytest.mark.dist, pytest.mark.slow]


def test_restart_resumes_from_checkpoint(tmp_path):
    # rank 1 dies after epoch 1 on the first attempt only; torchrun restarts the group once
    env = {"DDP_LAB_FAIL_ONCE": "rank=1,epoch=1"}
    proc = run_cli("launcher.nproc_per_node=2", "launcher.max_restarts=1", "train.epochs=2",
                   "train.max_steps_per_epoch=10", "log.progress=lines",
                   f"run.root={tmp_path / 'runs'}", f"data.root={tmp_path / 'data'}",
                   cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, describe(proc)
    run_dir = run_dir_of(proc)
    s = summary(run_dir)
    assert s["status"] == "completed" and s["world_size"] == 2
    assert s["start_epoch"] == 1 and s["epochs_run"] == 1  # epoch 2 only: epoch 1 was resumed
    assert "resumed from epoch_0001.pt" in proc.stdout
    epochs = [json.loads(ln)["epoch"] for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert epochs == [1, 2]
    assert "DDP_LAB_FAIL_ONCE: rank 1 exits after epoch 1" in (run_dir / "logs" / "rank1.log").read_text()


def test_failure_without_restarts_fails_the_run_and_the_console_ends_with_why(tmp_path, shared_data_root):
    """The console (stdout and stderr as a terminal shows them) ends with ddp_lab's
    diagnosis and the run folder; torchrun's ChildFailedError traceback is in
    logs/torchrun.log only, and the console says where."""
    env = {"DDP_LAB_FAIL_ONCE": "rank=1,epoch=1"}
    args = ["launcher.nproc_per_node=2", "train.epochs=2", "train.max_steps_per_epoch=5",
            "log.progress=lines", f"run.root={tmp_path / 'runs'}",
            f"data.root={shared_data_root}", "dist.timeout_s=30"]
    proc = subprocess.run([PY, "-m", "ddp_lab", *args], cwd=tmp_path, env=child_env(env),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    console = proc.stdout
    assert proc.returncode == 1, console
    last = console.rstrip().splitlines()[-3:]
    run_dir = Path(last[-1].removeprefix("run dir: "))
    assert summary(run_dir)["status"].startswith("failed: rank 1 ")
    assert last[1].startswith("job failed with exit status 1: rank 1 "), console
    assert "dead (no process)" in last[1] and f"(logs in {run_dir / 'logs'})" in last[1], console
    log = run_dir / "logs" / "torchrun.log"
    # the ranks are forks of torchrun (CPU): it names the first exit it saw, which may be
    # rank 0's own end a moment after rank 1's; the root cause is the job's line above
    assert re.fullmatch(r"\[torchrun\] ddp_lab\.worker failed: rank [01] ended with exit code "
                        r"(17|1) \(the first exit torchrun saw\); torchrun's traceback: "
                        + re.escape(str(log)), last[0]), console
    assert "Traceback" not in console and "ChildFailedError" not in console, console
    assert "[rank 0] epoch 1/2" in console  # the ranks' own lines still reach the console
    text = log.read_text()
    assert "Traceback (most recent call last)" in text and "ChildFailedError" in text, text
    assert "Root Cause" in text and re.search(r"exitcode  : (17|1)\b", text), text  # (as above)


# ------------------------------------------------------------ the rendezvous port
def machine_address() -> Optional[str]:
    """This machine's own IPv4 address, not loopback (as `hostname -I` lists); None if none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # UDP: sends nothing, only picks the route's source address
            addr = s.getsockname()[0]
        except OSError:
            return None
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


@contextlib.contextmanager
def listening(addr: str) -> Iterator[int]:
    """Another program's listener on `addr` only, at a port free on every address."""
    with socket.socket() as s:
        s.bind((addr, free_port()))
        s.listen()
        yield s.getsockname()[1]


def test_port_taken_on_this_machines_address_stops_before_any_process(tmp_path):
    # the pre-check used to bind 127.0.0.1 only: it passed, and torchrun then tried for
    # 124 s to reach its own store on a port it could not bind
    addr = machine_address() or pytest.skip("this machine has no address but loopback")
    with listening(addr) as port:
        t0 = time.monotonic()
        proc = run_cli("launcher.nproc_per_node=2", f"launcher.master_port={port}", *QUICK,
                       f"run.root={tmp_path / 'runs'}", f"data.root={tmp_path / 'data'}",
                       cwd=tmp_path, timeout=120, env={"MASTER_PORT": ""})
        took = time.monotonic() - t0
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.splitlines() == [
        f"error: launcher.master_port={port}: port {port} is in use on this machine (another "
        f"program listens on it): {ports.FIX}"], describe(proc)
    assert not (tmp_path / "runs").exists()  # no run folder: nothing was started
    assert took < 20, took  # 0.8 s on an idle 2-core machine


def test_port_taken_after_the_check_ends_at_once_naming_the_rendezvous(tmp_path):
    # another program takes the port between ddp_lab's check and torchrun's bind: here a
    # setup line of launch.sh, which runs just before torchrun
    addr = machine_address() or pytest.skip("this machine has no address but loopback")
    port, pid_file = free_port(), tmp_path / "holder.pid"
    (tmp_path / "hold.py").write_text(
        "import os, socket, sys, time\n"
        "s = socket.socket(); s.bind((sys.argv[1], int(sys.argv[2]))); s.listen()\n"
        "open(sys.argv[3] + '.tmp', 'w').write(str(os.getpid()))\n"
        "os.replace(sys.argv[3] + '.tmp', sys.argv[3]); time.sleep(120)\n")
    # in the background, off our pipes (run_cli would wait for them to close)
    hold = f"{PY} {tmp_path / 'hold.py'} {addr} {port} {pid_file} >/dev/null 2>&1 &"
    bound = f"for i in $(seq 300); do [ -s {pid_file} ] && break; sleep 0.1; done"
    t0 = time.monotonic()
    try:
        proc = run_cli("launcher.nproc_per_node=2", f"launcher.master_port={port}",
                       f"launcher.setup=['{hold}','{bound}']",
                       "dist.init_timeout_s=30", *QUICK, f"run.root={tmp_path / 'runs'}",
                       f"data.root={tmp_path / 'data'}", cwd=tmp_path, timeout=240,
                       env={"MASTER_PORT": ""})
    finally:
        with contextlib.suppress(OSError, ValueError):
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
    took = time.monotonic() - t0
    assert proc.returncode == 1, describe(proc)
    run_dir = run_dir_of(proc)
    line = ports.taken("127.0.0.1", port)
    assert proc.stdout.splitlines()[-2] == (
        f"job failed with exit status 1: {line} (logs in {run_dir / 'logs'})"), describe(proc)
    assert summary(run_dir)["status"] == f"failed: {line}"
    assert not list((run_dir / "logs").glob("rank*.log"))  # torchrun started no rank
    assert took < 30, took  # within dist.init_timeout_s; 3.8 s here (torchrun's start)


def test_forked_ranks_end_when_torchrun_polls_seldom(tmp_path, shared_data_root):
    """torchrun's agent looking at its ranks every 3 s (torch 2.2 and 2.3 look every 5 s):
    the forked CPU ranks wait on torchrun's shared Event until it has read every rank's
    result, and the run ends. A rank ended in that wait (once, on a 1 s timer) left
    torchrun's `Event.set` waiting for it forever: the run trained, then hung until killed."""
    cmd = [PY, "-m", "ddp_lab", "launcher.nproc_per_node=2", *QUICK,
           f"run.root={tmp_path / 'runs'}", f"data.root={shared_data_root}"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=child_env({"PET_MONITOR_INTERVAL": "3"}),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    t0 = time.monotonic()
    try:
        out, err = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the run did not end within 120 s\n{out}\n{err}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # anything of the job's still alive
    done = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    assert proc.returncode == 0, describe(done)
    assert summary(run_dir_of(done))["status"] == "completed"
    assert time.monotonic() - t0 < 90, describe(done)
