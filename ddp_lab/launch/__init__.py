"""Launchers: render what will run into the run folder, then start it and follow it.

One module per launcher (local, mpirun, slurm, runai), each with

- `resolve(cfg)`: fill the launcher's derived settings into `cfg.launcher` and reject bad
  input with a `LaunchError`, before the run folder exists (so config.yaml records them);
- `render(cfg, run_dir) -> Rendered`: pure: the files to write and the command to run;
  `Rendered.starter`, when set, starts + follows the job (sbatch, runai); otherwise the
  command runs in the foreground and its exit status is the job's.

Templates live in `launchers/` and are filled with `str.format` (bash braces doubled).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Callable, Optional, TextIO

from ..errors import UserError
from ..ports import free_port  # noqa: F401 -- launchers import it from here
from ..resources import launchers_dir
from ..registry import Registry

TEMPLATES = launchers_dir()  # checkout or installed wheel (ddp_lab/resources.py)


class LaunchError(UserError):
    """A launcher cannot start this configuration; the message says why and the fix.
    A user error like any other: the CLI wrapper prints it as one line, exit 2."""


@dataclass
class Rendered:
    command: list[str]  # run on this machine to start the job
    files: dict[str, str] = field(default_factory=dict)  # name -> content, into the run folder
    executable: tuple[str, ...] = ()  # which of `files` get the x bit
    show: str = ""  # what dry_run prints
    starter: Optional[Callable[[], int]] = None  # start + follow; None = run `command`

    def write(self, run_dir: Path) -> None:
        # logs/ must exist before the job starts: sbatch --output does not create folders
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        for name, content in self.files.items():
            path = run_dir / name
            path.write_text(content)
            if name in self.executable:
                path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


# ------------------------------------------------------------------ helpers
def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    if not 0 < port < 65536:
        raise LaunchError(f"launcher.master_port={port} is not a port (1..65535)")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            raise LaunchError(f"port {port} is in use on {host}: pick another "
                              "launcher.master_port, or leave it null for a free one") from None


def is_this_machine(host: str) -> bool:
    names = {"localhost", "127.0.0.1", "::1", socket.gethostname(), socket.getfqdn(),
             socket.gethostname().split(".")[0]}
    return host in names


def default_nproc() -> int:
    """One process per visible GPU, else 2 (CPU ranks)."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return gpus or 2


def code_dir() -> Path:
    """The folder holding the `ddp_lab` package that renders: the ranks run the same code."""
    return Path(__file__).resolve().parents[2]


def python_exe(lc) -> str:
    return lc.python or sys.executable


def setup_block(lines) -> str:
    lines = [str(x) for x in (lines or [])]
    if not lines:
        return "# (no setup lines; add some with launcher.setup=['module load ...', ...])"
    return "# launcher.setup\n" + "\n".join(lines)


def template(name: str) -> str:
    return (TEMPLATES / name).read_text()


def require_tool(tool: str, where: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise LaunchError(f"{tool} not found on PATH: {where} (launcher.dry_run=true renders "
                          "and prints what would run, without it)")
    return path


def should_wait(value: Optional[bool]) -> bool:
    """launcher.wait: null means follow the job when a person is watching (stdin is a tty)."""
    if value is None:
        try:
            return sys.stdin is not None and sys.stdin.isatty()
        except ValueError:  # stdin closed
            return False
    return bool(value)


class Tail:
    """Print what a growing log file gains, whole lines only (the job may be mid-line)."""

    def __init__(self, path: Path, out: TextIO):
        self.path, self.out, self.pos = path, out, 0

    def poll(self, final: bool = False) -> None:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.pos)
                chunk = f.read()
        except OSError:
            return
        if not final:
            chunk = chunk[: chunk.rfind(b"\n") + 1]
        if chunk:
            self.pos += len(chunk)
            self.out.write(chunk.decode(errors="replace"))
            self.out.flush()


def tail_text(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])


def diagnose(logs: list[Path], lines: int = 15) -> str:
    """What a failed job's logs say: every rank's one-line `failed: ...` reason (the worker
    writes one), then the last lines of the first log that has any (the launcher's view)."""
    reasons: list[str] = []
    for path in logs:
        try:
            text = path.read_text(errors="replace")
        except OSError:
            continue
        reasons += [ln.strip() for ln in text.splitlines()
                    if "] failed: " in ln and ln.strip() not in reasons]
    tail_of = next((p for p in logs if tail_text(p)), None)
    parts = []
    if reasons:
        parts.append("the ranks said:\n  " + "\n  ".join(reasons[:8]))
    if tail_of is not None:
        parts.append(f"last lines of {tail_of}:\n{tail_text(tail_of, lines)}")
    return "\n".join(parts) or "no log output (see the run folder's logs/)"


# ----------------------------------------------------------------- dispatch
_LAUNCHERS: Optional[Registry[ModuleType]] = None


def modules() -> Registry[ModuleType]:
    """launcher option -> its module; filled on first use (the modules import this one)."""
    global _LAUNCHERS
    if _LAUNCHERS is None:
        from . import local, mpirun, runai, slurm

        _LAUNCHERS = Registry("launcher", {"local": local, "mpirun": mpirun, "slurm": slurm,
                                           "runai": runai})
    return _LAUNCHERS


def _module(name: str) -> ModuleType:
    return modules().get(name)  # UnknownName lists the valid ones


def resolve(cfg) -> None:
    """Fill cfg.launcher's derived settings in place (cfg must be open for new keys)."""
    mod = _module(cfg.launcher.name)
    if hasattr(mod, "resolve"):
        mod.resolve(cfg)


def render(cfg, run_dir: Path) -> Rendered:
    return _module(cfg.launcher.name).render(cfg, run_dir)


def start(rendered: Rendered, run_dir: Path, grace_s: float = 120.0) -> int:
    """Start the job and follow it to its end; its exit status is ours."""
    if rendered.starter is not None:
        return rendered.starter()
    return run_foreground(rendered.command, run_dir, grace_s)


def _die_with_parent() -> None:  # runs in the child between fork and exec
    from ..stop import set_parent_death_signal

    set_parent_death_signal(signal.SIGTERM)


class Foreground:
    """A job run from this process (torchrun, mpirun): in its own session, so Ctrl-C reaches
    only us and we stop it gracefully (the stop file: every rank checkpoints at its next
    check), and tied to us by PR_SET_PDEATHSIG, so a SIGKILL of `python -m ddp_lab` still
    stops it. A second Ctrl-C (or SIGTERM), or a job still running `grace_s` after the
    request, ends it at once: SIGTERM to its process group, SIGKILL 30 s later.

    When the command ends, ranks may outlive it: a torchrun killed by SIGKILL leaves its
    ranks stopping gracefully (their parent's death reached them as SIGTERM), so we wait
    for them up to `grace_s`; a rank frozen by SIGSTOP cannot act, so it is killed at once.
    Whatever is left after that is killed last (`sweep`)."""

    def __init__(self, command: list[str], run_dir: Path, grace_s: float):
        self.command, self.run_dir, self.grace_s = command, run_dir, grace_s
        self.signal: Optional[int] = None  # the first signal we got
        self.forced = False  # a second signal: no more waiting
        self.deadline: Optional[float] = None
        self.proc: Optional[subprocess.Popen] = None

    def _on_signal(self, signum, frame) -> None:
        from ..stop import request_stop

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
            print(f"[ddp_lab] {name} again: killing the job", file=sys.stderr, flush=True)
            self.forced = True
            self.kill()

    def kill(self) -> None:
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
        """The command has ended: wait (up to `grace_s`) for the job's processes that
        outlive it, killing frozen ones at once; the pids still there at the end."""
        from ..progress import mark_killed, process_state, read_all

        deadline, told = time.monotonic() + self.grace_s, False
        while True:
            pids = job_processes(self.run_dir, marked=True)
            for pid in pids:
                if process_state(pid) == "frozen":
                    for rec in read_all(self.run_dir):  # its record says why it ended
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

    def run(self) -> int:
        handlers = {}
        if threading.current_thread() is threading.main_thread():
            handlers = {sig: signal.signal(sig, self._on_signal)
                        for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            env = {**os.environ, JOB_ENV: str(self.run_dir)}  # what `sweep` recognises
            self.proc = subprocess.Popen(self.command, cwd=os.getcwd(), start_new_session=True,
                                         preexec_fn=_die_with_parent, env=env)
            while True:
                try:
                    rc = self.proc.wait(timeout=1.0)
                    break
                except subprocess.TimeoutExpired:
                    if self.deadline is not None and time.monotonic() > self.deadline:
                        print(f"[ddp_lab] the job did not stop within {self.grace_s:.0f} s: "
                              "killing it", file=sys.stderr, flush=True)
                        self.forced = True
                        self.kill()
            self.settle()
        finally:
            for sig, previous in handlers.items():
                signal.signal(sig, previous)
            if self.proc is not None and self.proc.poll() is None:
                self.kill()
            sweep(self.run_dir)
        return rc


def run_foreground(command: list[str], run_dir: Optional[Path] = None, grace_s: float = 120.0) -> int:
    """Run a job's command in the foreground (see `Foreground`); its exit status is ours,
    or 128 + the signal when a Ctrl-C / SIGTERM stopped it."""
    fg = Foreground(command, run_dir or Path(os.getcwd()), grace_s)
    rc = fg.run()
    return 128 + fg.signal if fg.signal is not None else rc


# what a process of a job runs: the ranks' entries, torchrun, a script of the run folder
JOB_MARKERS = (b"ddp_lab.worker", b"ddp_lab.bench.worker", b"torch.distributed.run")
JOB_ENV = "DDP_LAB_JOB_DIR"  # set in the environment of a job `Foreground` starts


def job_processes(run_dir: Path, marked: bool = False) -> list[int]:
    """Processes of this machine that belong to the job of `run_dir`: the ranks, torchrun,
    mpirun and the launch scripts (their command line names the run folder and one of
    JOB_MARKERS, or runs a script inside it). Whatever only watches the run (`python -m
    ddp_lab.status RUN_DIR --follow`, `tail -f RUN_DIR/logs/...`) is not one of them. With
    `marked`, only those that also carry the job's mark in their environment (JOB_ENV,
    inherited from the command `Foreground` started): what a sweep may kill."""
    key = str(run_dir).encode()
    mark = f"{JOB_ENV}={run_dir}".encode()
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
    """Kill what is left of a job that has ended (a rank frozen by SIGSTOP survives its
    torchrun); the pids killed."""
    pids = job_processes(run_dir, marked=True)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if pids:
        print(f"[ddp_lab] killed {len(pids)} leftover process(es) of the job: {pids}",
              file=sys.stderr, flush=True)
    return pids
