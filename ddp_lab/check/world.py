"""A checked world of n real gloo ranks, forked from this process (which
imported torch once), and its cases run one at a time.

The parent hands every rank a case and waits for all of them, at most
the case's time limit. A rank that does not answer in time is waiting
in a call (the board says which); a rank that raised is a crash; then
the world is ended (every rank killed) and the next world starts fresh.
Forked ranks die with their parent (PR_SET_PDEATHSIG), so no verdict
leaves a process behind.
"""

from __future__ import annotations

import mmap
import multiprocessing
import multiprocessing.connection
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from ..config.student import StudentFunction
from . import rank as R
from .cases import Case

#: how long a world may take to start (fork + gloo's rendezvous)
START_S = 60.0


@dataclass
class CaseRun:
    """What the ranks of one case did: results by rank, and the board
    of every rank that did not answer."""

    case: Case
    results: dict[int, dict] = field(default_factory=dict)
    states: dict[int, dict] = field(default_factory=dict)
    timed_out: bool = False
    dead: list[int] = field(default_factory=list)
    exitcodes: dict[int, Optional[int]] = field(default_factory=dict)


class WorldFailed(RuntimeError):
    """The world itself did not start (not the student's doing)."""


class World:
    def __init__(self, fn: Callable, info: StudentFunction, size: int, namespaces: list,
                 log_dir: Path):
        self.fn, self.info, self.size = fn, info, size
        self.namespaces, self.log_dir = namespaces, log_dir
        self.procs: list[Any] = []
        self.conns: list[Any] = []
        self.tmp: Optional[str] = None
        self.buf: Optional[mmap.mmap] = None

    def log_path(self, rank: int) -> Path:
        return self.log_dir / f"{self.info.name}_w{self.size}_rank{rank}.log"

    def __enter__(self) -> "World":
        ctx = multiprocessing.get_context("fork")
        self.tmp = tempfile.mkdtemp(prefix="ddp_lab_check_")
        self.buf = mmap.mmap(-1, R.SLOT * self.size)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for rank in range(self.size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=R.main, daemon=True, args=(
                rank, self.size, child, self.buf, f"{self.tmp}/store", self.fn, self.info,
                self.namespaces, str(self.log_path(rank))))
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
        deadline = time.monotonic() + START_S
        for rank, conn in enumerate(self.conns):
            if not conn.poll(max(deadline - time.monotonic(), 0)):
                self.close()
                raise WorldFailed(f"{self.size} gloo ranks did not start in {START_S:.0f} s "
                                  f"(see {self.log_path(rank)})")
            try:
                conn.recv()
            except EOFError:
                self.close()
                raise WorldFailed(f"rank {rank} of {self.size} died while starting "
                                  f"(see {self.log_path(rank)})") from None
        return self

    def run(self, index: int, case: Case, limit_s: float, grace_s: float = 0.5) -> CaseRun:
        """Run one case on every rank; wait at most `limit_s` (and only
        `grace_s` more once a rank has raised: the others wait on it)."""
        out = CaseRun(case)
        for conn in self.conns:
            conn.send(("case", index, case))
        waiting = dict(enumerate(self.conns))
        deadline = time.monotonic() + limit_s
        while waiting:
            left = deadline - time.monotonic()
            if left <= 0:
                out.timed_out = True
                break
            ready = multiprocessing.connection.wait(list(waiting.values()), timeout=left)
            for conn in ready:
                rank = next(r for r, c in waiting.items() if c is conn)
                try:
                    _, got, result = conn.recv()
                except EOFError:
                    out.dead.append(rank)
                    waiting.pop(rank)
                    deadline = min(deadline, time.monotonic() + grace_s)
                    continue
                if got == index:
                    out.results[rank] = result
                    waiting.pop(rank)
                    if result.get("status") in ("raised", "unsupported"):
                        deadline = min(deadline, time.monotonic() + grace_s)
        for rank in out.dead:
            self.procs[rank].join(1.0)
            out.exitcodes[rank] = self.procs[rank].exitcode
        assert self.buf is not None
        out.states = {r: R.read_board(self.buf, r) for r in range(self.size)}
        return out

    def close(self) -> None:
        """Every rank ended: asked to stop if the world is sound, else
        killed."""
        for conn, p in zip(self.conns, self.procs):
            try:
                if p.is_alive():
                    conn.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
        deadline = time.monotonic() + 2.0
        for p in self.procs:
            p.join(max(deadline - time.monotonic(), 0))
            if p.is_alive():
                p.kill()
                p.join()
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
        for rank in range(self.size):
            log = self.log_path(rank)
            if log.exists() and log.stat().st_size == 0:
                log.unlink()

    def kill(self) -> None:
        for p in self.procs:
            if p.is_alive():
                p.kill()
        self.close()

    def __exit__(self, *exc: object) -> None:
        self.kill() if exc and exc[0] is not None else self.close()
