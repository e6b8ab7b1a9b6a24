"""Launchers: render what will run into the run folder, then start it and follow it.

Each launcher module has `render(cfg, run_dir) -> Rendered` (pure: files and a command)
and the shared `start` runs the command and returns the job's exit status.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable


class LaunchError(RuntimeError):
    """A launcher cannot start this configuration; the message says why and the fix."""


@dataclass
class Rendered:
    command: list[str]  # run on this machine to start the job
    files: dict[str, str] = field(default_factory=dict)  # name -> content, into the run folder
    executable: tuple[str, ...] = ()  # which of `files` get the x bit
    show: str = ""  # what dry_run prints

    def write(self, run_dir: Path) -> None:
        for name, content in self.files.items():
            path = run_dir / name
            path.write_text(content)
            if name in self.executable:
                path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            raise LaunchError(f"port {port} is in use on {host}: pick another "
                              "launcher.master_port, or leave it null for a free one") from None


def start(rendered: Rendered, run_dir: Path) -> int:
    """Run the job in the foreground; its exit status is ours. Ctrl-C reaches the job too
    (same process group): give it time to stop its ranks, then make sure it is gone."""
    proc = subprocess.Popen(rendered.command, cwd=os.getcwd())
    try:
        return proc.wait()
    except KeyboardInterrupt:
        try:
            return proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return 130


def registry() -> dict[str, Callable]:
    from . import local

    return {"local": local.render}


def render(cfg, run_dir: Path) -> Rendered:
    renderers = registry()
    try:
        fn = renderers[cfg.launcher.name]
    except KeyError:
        raise LaunchError(f"unknown launcher '{cfg.launcher.name}': choose one of "
                          f"{', '.join(renderers)}") from None
    return fn(cfg, run_dir)
