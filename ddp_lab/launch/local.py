"""launcher=local: torchrun on this machine, every rank running the worker entry; and every job run
from this process (torchrun, mpirun: `Foreground`), with the processes of a job found by its run
folder (`job_processes`, `sweep`: what is left after it ended)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from ..folder.heartbeat import mark_killed, process_state, read_all
from ..folder.rundir import clear_stop_file, read_summary, request_stop
from ..world.env import set_parent_death_signal
from ..world.ports import FIX, taken
from .base import (check_port_free, code_dir, LaunchError, python_exe, Rendered, setup_block,
    template)

ERROR_FILE = "logs/torchrun_error.json"  # torchrun's own error (TORCHELASTIC_ERROR_FILE)


def rendezvous_port(lc):
    """The port launch.sh's rendezvous binds, and the key that sets it: MASTER_PORT, else
    launcher.master_port (None: port 0, which the OS gives torchrun's store as it binds, so no
    other program can take it in between)."""
    if os.environ.get("MASTER_PORT"):
        return os.environ["MASTER_PORT"], "MASTER_PORT"
    return lc.master_port, "launcher.master_port"


def resolve(cfg) -> None:
    lc = cfg.launcher
    if lc.nodes != 1:
        raise LaunchError(f"launcher=local runs on this machine only (launcher.nodes={lc.nodes}): "
                          "use launcher=slurm, mpirun or runai for several nodes")
    if lc.max_restarts < 0:
        raise LaunchError(f"launcher.max_restarts={lc.max_restarts}: must be >= 0")
    port, key = rendezvous_port(lc)
    if key == "MASTER_PORT":
        check_port_free(port, key, "unset MASTER_PORT in this shell (launch.sh prefers it to "
                                   "launcher.master_port) for a free one, or export another")
    elif port is not None:
        check_port_free(port)


def render(cfg, run_dir: Path) -> Rendered:
    lc = cfg.launcher
    # None: port 0, and the store binds whatever port the OS gives it: a port picked free here
    # could be taken by another program before torchrun binds it; port 0 cannot.
    port = lc.master_port if lc.master_port is not None else 0
    script = template("local.sh").format(
        python=shlex.quote(python_exe(lc)), nproc=lc.nproc_per_node, port=port,
        max_restarts=lc.max_restarts, run_dir=shlex.quote(str(run_dir)),
        code_dir=shlex.quote(str(code_dir())), setup=setup_block(lc.setup),
        error_file=shlex.quote(str(run_dir / ERROR_FILE)),
        join_timeout=max(1, int(cfg.dist.init_timeout_s)), entry=shlex.quote(cfg.run.entry))
    used = rendezvous_port(lc)[0] or 0  # what the script will bind
    return Rendered(command=["bash", str(run_dir / "launch.sh")], files={"launch.sh": script},
                    executable=("launch.sh",), show=script,
                    explain=lambda: rendezvous_failure(run_dir, "127.0.0.1", int(used)))


def rendezvous_failure(run_dir: Path, host: str, port: int) -> Optional[str]:
    """One line naming the rendezvous when torchrun could not start it, else None."""
    try:
        error = json.loads((run_dir / ERROR_FILE).read_text())["message"]
        message, trace = error["message"], error["extraInfo"]["py_callstack"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not message.startswith("Rendezvous"):
        return None
    if "EADDRINUSE" in trace:  # another program took the port after ddp_lab checked it
        return taken(host, port)
    where = f"{host}:{port}" if port else f"{host} (a port the OS gave it)"
    return f"torchrun's rendezvous at {where} could not start ({message.split(':')[0]}): {FIX}"


# ------------------------------------------------------------ a job run from this process
class Foreground:
    """A job run from this process (torchrun, mpirun), in its own session (Ctrl-C reaches only us
    and we stop it gracefully through the stop file) and tied to us by PR_SET_PDEATHSIG. A second
    signal, or a job still running `grace_s` after the request or `limit_s` after its start, is
    ended at once (`kill`); `limit_s` bounds a job whose ranks never started, and so never reach
    their own timeouts. Ranks that outlive the command get `grace_s` to stop (a SIGSTOPped one is
    killed at once); the rest: `sweep`.
    """

    def __init__(self, command: list[str], run_dir: Path, grace_s: float,
                 stderr_lines: Optional[Callable[[str], None]] = None,
                 limit_s: Optional[float] = None):
        self.command, self.run_dir, self.grace_s = command, run_dir, grace_s
        self.limit_s = limit_s
        self.over_limit = False  # ended by limit_s
        self.stderr_lines = stderr_lines  # None: the job writes to our stderr itself
        self.signal: Optional[int] = None  # the first signal we got
        self.forced = False  # a second signal: no more waiting
        self.deadline: Optional[float] = None
        self.proc: Optional[subprocess.Popen] = None

    def _on_signal(self, signum, frame) -> None:
        name = signal.Signals(signum).name
        if self.signal is None:
            self.signal = signum
            self.deadline = time.monotonic() + self.grace_s
            what = "Ctrl-C" if signum == signal.SIGINT else name
            if self.grace_s <= 0:
                print(f"\n[ddp_lab] {what}: ending the job", file=sys.stderr, flush=True)
                return
            request_stop(self.run_dir, "stopped", f"{what} to python -m ddp_lab")
            print(f"\n[ddp_lab] {what}: every rank stops at its next check and saves a checkpoint "
                  "(Ctrl-C again to kill it now)", file=sys.stderr, flush=True)
        else:
            self.force(f"{name} again: killing the job")

    def force(self, why: str) -> None:
        """End the job now, saying why: no more waiting."""
        print(f"[ddp_lab] {why}", file=sys.stderr, flush=True)
        self.forced = True
        self.kill()

    def kill(self) -> None:
        """SIGTERM to the job's process group, SIGKILL 30 s later."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def settle(self) -> list[int]:
        """Wait up to `grace_s` for the job's processes that outlive the command; the rest."""
        deadline, told = time.monotonic() + self.grace_s, False
        while True:
            pids = job_processes(self.run_dir, marked=True)
            for pid in pids:
                if process_state(pid) == "frozen":
                    # its record says why it ended
                    for rec in read_all(self.run_dir):
                        if rec["pid"] == pid and rec["local"] and rec["state"] in ("starting", "running"):
                            mark_killed(self.run_dir, rec["rank"],
                                        "frozen (SIGSTOP), killed by python -m ddp_lab")
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.kill(pid, signal.SIGKILL)
                    print(f"[ddp_lab] killed process {pid} of the job: frozen (SIGSTOP)",
                          file=sys.stderr, flush=True)
            pids = [p for p in pids if process_state(p) != "dead"]
            if not pids or self.forced or time.monotonic() > deadline:
                return pids
            if not told:
                told = True
                print(f"[ddp_lab] the launcher has ended; waiting up to {self.grace_s:.0f} s for "
                      f"{len(pids)} process(es) of the job to stop", file=sys.stderr, flush=True)
            time.sleep(0.5)

    def _pump_stderr(self) -> None:
        """Hand the job's stderr to `stderr_lines`, line by line as it comes (a thread's)."""
        for raw in iter(self.proc.stderr.readline, b""):
            self.stderr_lines(raw.decode(errors="replace"))
        self.proc.stderr.close()

    def run(self) -> int:
        handlers = {}
        if threading.current_thread() is threading.main_thread():
            handlers = {sig: signal.signal(sig, self._on_signal)
                        for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            env = {**os.environ, JOB_ENV: job_mark(self.run_dir)}  # what `sweep` recognises
            piped = self.stderr_lines is not None
            # preexec_fn runs in the child between fork and exec
            self.proc = subprocess.Popen(self.command, cwd=os.getcwd(), start_new_session=True,
                                         preexec_fn=lambda: set_parent_death_signal(signal.SIGTERM),
                                         env=env, stderr=subprocess.PIPE if piped else None)
            reader = None
            if piped:
                reader = threading.Thread(target=self._pump_stderr, name="job-stderr", daemon=True)
                reader.start()
            end = None if self.limit_s is None else time.monotonic() + self.limit_s
            while True:
                try:
                    rc = self.proc.wait(timeout=1.0)
                    break
                except subprocess.TimeoutExpired:
                    if end is not None and time.monotonic() > end and not self.forced:
                        self.over_limit = True
                        self.force(f"the job has not ended within its {self.limit_s:.0f} s: "
                                   "ending it")
                    if self.deadline is not None and time.monotonic() > self.deadline:
                        self.force(f"the job did not stop within {self.grace_s:.0f} s: killing it")
            self.settle()
            if reader is not None:  # whatever the job wrote last (a child may hold the pipe)
                reader.join(timeout=5)
        finally:
            for sig, previous in handlers.items():
                signal.signal(sig, previous)
            if self.proc is not None and self.proc.poll() is None:
                self.kill()
            sweep(self.run_dir)
        return rc


OVER_LIMIT = 124  # the exit status of a job ended at its limit_s, as timeout(1) gives


def run_foreground(command: list[str], run_dir: Optional[Path] = None, grace_s: float = 120.0,
                   stderr_lines: Optional[Callable[[str], None]] = None,
                   limit_s: Optional[float] = None) -> int:
    """Run a job's command in the foreground (`Foreground`); its exit status, or 128 + the signal
    that stopped it (0 when the job had completed anyway), or OVER_LIMIT when it was still
    running `limit_s` after its start. `stderr_lines` gets the job's stderr line by line
    (mpirun's filter), else it is ours."""
    fg = Foreground(command, run_dir or Path(os.getcwd()), grace_s, stderr_lines, limit_s)
    rc = fg.run()
    if fg.over_limit:
        return OVER_LIMIT
    if fg.signal is None:
        return rc
    if rc == 0 and read_summary(fg.run_dir).get("status") == "completed":
        clear_stop_file(fg.run_dir)  # our stop request came too late to be read: not a request
        print(f"[ddp_lab] {signal.Signals(fg.signal).name} came after the last epoch: the run "
              "had completed", file=sys.stderr, flush=True)
        return 0
    return 128 + fg.signal


# what a process of a job runs: the ranks' entries, torchrun, a script of the run folder
JOB_MARKERS = (b"ddp_lab.worker", b"ddp_lab.bench.worker", b"torch.distributed.run",
               b"ddp_lab.launch.torchrun")
JOB_ENV = "DDP_LAB_JOB"  # set in the environment of a job `Foreground` starts


def job_mark(run_dir: Path) -> str:
    """The mark of this process's job in `run_dir`: the folder and our pid."""
    return f"{run_dir}:{os.getpid()}"


def job_processes(run_dir: Path, marked: bool = False) -> list[int]:
    """Processes of this machine in the job of `run_dir` (their command line names it and one of
    JOB_MARKERS, or runs a script in it; not a watcher). With `marked`, only those carrying this
    process's JOB_ENV mark: what a sweep may kill."""
    key = str(run_dir).encode()
    mark = f"{JOB_ENV}={job_mark(run_dir)}".encode()
    found = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if not any(arg == key or arg.startswith(key + b"/") for arg in argv):
                continue
            if marked and mark not in (entry / "environ").read_bytes().split(b"\0"):
                continue
        except OSError:
            continue
        script = any(arg.startswith(key + b"/") and arg.endswith((b".sh", b".sbatch")) for arg in argv)
        if script or any(arg in JOB_MARKERS for arg in argv):
            found.append(int(entry.name))
    return found


def sweep(run_dir: Path) -> list[int]:
    """Kill what is left of a job that has ended (a SIGSTOPped rank); the pids killed."""
    pids = job_processes(run_dir, marked=True)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if pids:
        print(f"[ddp_lab] killed {len(pids)} leftover process(es) of the job: {pids}",
              file=sys.stderr, flush=True)
    return pids
