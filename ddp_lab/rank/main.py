"""The ranks' side of a job (command/job.py is the submitting side): every rank runs `python -m
<run.entry> RUN_DIR`, that is `rank_main` -> `run_rank(run_dir, cfg, body)`, which sets up the
rank's log, threads, heartbeat record, hang watchdog and process group, runs `body(ctx)`, and turns
a failure into one line naming the rank(s) that stopped. A training rank's body is `run_training`.

`python -m ddp_lab.rank.main MODULE ARGS...` runs MODULE as `python -m MODULE ARGS...` would, its
console written a whole line at a time (`whole_lines`): the ranks of a machine share its console,
and under `python -u` a line and its newline are two writes another rank's line can land between.
ddp_lab.launch.torchrun starts every spawned rank through this (forked ones: `rank_main`).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import runpy
import select
import signal
import socket
import sys
import threading
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

from ..world import cpu, ports
from ..world.env import AGENT_SIGNALS, detect_env
from ..world.hang import Watchdog
from ..folder import heartbeat
from ..folder.files import DiskFull, read_json_or_empty
from ..folder.failure import diagnose, end_stuck, failure_line
from ..folder.rundir import mark_failed
from ..folder.metrics import setup_logging


def _threads(run_dir: Path, env, requested: int) -> cpu.RankThreads:
    """This rank's torch threads: train.threads, the run's first count, or the launcher's."""
    first = (read_json_or_empty(run_dir / "summary.json").get("segments") or [{}])[0]
    earlier = (first.get("cpu") or {}).get("threads", 0) \
        if first.get("world_size") == env.world_size else 0
    return cpu.rank_threads(env.local_world_size, requested, earlier)


def stacks_into(run_dir: Path, rank: int) -> int:
    """This rank's log, where faulthandler writes every thread's stack (a fatal signal, the hang
    watchdog): a bare descriptor, open until the process ends, as faulthandler needs."""
    import faulthandler

    fd = os.open(run_dir / "logs" / f"rank{rank}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    faulthandler.enable(file=fd, all_threads=True)
    return fd


def run_rank(run_dir: Path, cfg: Any, body: Callable[[Any], None], threads: int = 0,
             failure: Optional[dict] = None) -> int:
    """Run `body(ctx)` on this rank inside an initialised process group; 0 on success, 1 after
    logging the failure (rank 0 also into summary.json) instead of a traceback; see the module
    docstring. A start that cannot reach its rendezvous ends within dist.init_timeout_s."""
    # lazy: torch loads here, on the rank, after rank_main set OMP_WAIT_POLICY (libgomp reads it
    # once, at load: ddp_lab/world/cpu.py); the submitting side needs no torch
    import torch

    from ..world.distributed import distributed
    from .epochs import die_with_parent

    die_with_parent()
    env = detect_env()
    log = setup_logging(env, run_dir, cfg.log.level, every_rank=cfg.log.ranks == "all")
    record = heartbeat.start(run_dir, env.rank, env.local_rank, env.world_size)
    timeout_s = float(cfg.dist.timeout_s)
    init_s = float(cfg.dist.get("init_timeout_s") or timeout_s)
    fields = {**(failure or {}), "world_size": env.world_size}

    # on the timer's thread: the main one is stuck in torch
    def start_timed_out() -> None:
        line = ports.no_answer(env.master_addr, env.master_port, init_s)
        _failed(run_dir, record, log, line, fields)
        logging.shutdown()
        os._exit(1)

    try:
        # a little before the peers' collectives time out, so a stuck rank's stack is in its log
        watchdog = Watchdog(max(1.0, timeout_s - 2.0), stacks_into(run_dir, env.rank))
        share = _threads(run_dir, env, threads)
        torch.set_num_threads(share.threads)
        start_timer = StartTimer(init_s + START_SLACK_S, start_timed_out)
    except Exception as e:  # noqa: BLE001 -- before any collective: no peer can say why
        log.debug(traceback.format_exc())
        # on the console (every rank's errors are) and in the record the launcher reads
        _failed(run_dir, record, log, f"rank {env.rank} on host {socket.gethostname()} died at "
                f"start: {short_error(e)} (traceback in logs/rank{env.rank}.log)", fields)
        return 1
    try:
        with distributed(env, cfg.dist.backend, cfg.dist.device, timeout_s, init_s, run_dir,
                         heartbeat=record, watchdog=watchdog, threads=share) as ctx:
            start_timer.stop()  # the group is up: the start is over
            record.state("running")
            body(ctx)
            record.phase("teardown")
        record.state("done")
        return 0
    except Exception as e:  # noqa: BLE001 -- the log keeps the trace, the console the reason
        in_start = start_timer.stop()  # True: it failed while still starting
        # torchrun's SIGTERM (another rank failed) must not cut this short
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        watchdog.cancel()
        log.debug(traceback.format_exc())
        mine = short_error(e)
        if in_start and isinstance(e, torch.distributed.DistNetworkError):
            # the store could not be bound or reached: nothing of a peer to diagnose
            line = (ports.taken(env.master_addr, env.master_port) if "EADDRINUSE" in mine
                    else ports.no_answer(env.master_addr, env.master_port, init_s))
            _failed(run_dir, record, log, line, fields)
            return 1
        here = record.snapshot()
        record.state("failed", mine)
        # probe: a node that no longer answers this one is named as a node (a cut link)
        culprits = diagnose(run_dir, me=env.rank, stale_s=min(5.0, timeout_s / 2),
                             probe=env.num_nodes > 1)
        trace = run_dir / "logs" / f"rank{env.rank}.log"
        if culprits:
            line = failure_line(culprits)
            at = f" at {heartbeat.where(here)}" if here else ""
            log.error("failed: %s [rank %d: %s%s] (traceback in %s)", line, env.rank, mine, at, trace)
        else:
            line = mine
            log.error("failed: %s (traceback in %s)", mine, trace)
        if env.is_main:
            mark_failed(run_dir, f"failed: {line}", {**fields, "error": mine})
        killed = end_stuck(culprits, run_dir, by=f"rank {env.rank}")
        if killed:
            log.error("killed stuck process(es) of this job: %s", killed)
        return 1
    finally:
        start_timer.stop()
        watchdog.cancel()
        logging.shutdown()


def _failed(run_dir: Path, record: Any, log: logging.Logger, line: str, fields: dict) -> None:
    """A start that failed on its own (no peer to name): the line into this rank's record, its log
    and summary.json, by any rank, since the launcher may end rank 0 before it says why."""
    record.state("failed", line)
    log.error("failed: %s", line)
    mark_failed(run_dir, f"failed: {line}", {**fields, "error": line})


def short_error(e: BaseException, limit: int = 200) -> str:
    """The exception's type and first meaningful line, without source paths ('RuntimeError: Timed
    out ...'); a full disk as `no space left on <folder> (writing <file>)`."""
    if isinstance(e, DiskFull):
        return str(e)
    text = " ".join(str(e).split("\n\n")[0].split())
    text = re.sub(r"\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", text)
    text = text.replace("Got the following error when running the callback: ", "")
    name = type(e).__name__
    text = text.removeprefix(f"{name}: ")
    text = f"{name}: {text}" if text else name
    return text if len(text) <= limit else text[: limit - 3] + "..."


# torch gives up on an unreachable store after about twice dist.init_timeout_s: the timer ends the
# rank at the bound, these seconds after it leave torch's own errors first
START_SLACK_S = 2.0


class StartTimer(threading.Timer):
    """The start's time limit: calls `end` on a timer thread unless `stop()` comes within
    `seconds`; it works while the main thread waits inside torch's C++ code."""

    def __init__(self, seconds: float, end: Callable[[], None]):
        super().__init__(seconds, self._expire, (end,))
        self._guard, self._over, self.daemon = threading.Lock(), False, True
        self.start()

    def stop(self) -> bool:
        """The start has ended: stop the timer; True the first time (waits if it fires now)."""
        self.cancel()
        with self._guard:
            first, self._over = not self._over, True
        return first

    def _expire(self, end: Callable[[], None]) -> None:
        with self._guard:  # held until `end` has ended the process
            if not self._over:
                end()


def run_training(train: Callable, cfg: Any, ctx: Any, run_dir: Path) -> Any:
    """`train(cfg, ctx, ...)` (ddp_lab/train.py) handed the run folder's checkpoint, epochs and
    records parts; stops are heard inside."""
    from ..config import batch_plan
    from .checkpoint import Checkpointer
    from .epochs import EpochControl
    from .records import Records

    checkpoint = Checkpointer(cfg.train, ctx, run_dir / "checkpoints",
                              batch_plan(cfg.train, ctx.env.world_size))
    records = Records(cfg, ctx, run_dir)
    with EpochControl(cfg, ctx, run_dir, records) as epochs:
        return train(cfg, ctx, checkpoint, epochs, records)


def rank_main(argv: Optional[list[str]], module: str, maker: str,
              run: Callable[[Path], int]) -> int:
    """`python -m <module> RUN_DIR`: `run(run_dir)`'s exit status (2 and a usage line if wrong)."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not (Path(argv[0]) / "config.yaml").is_file():
        print(f"usage: python -m {module} RUN_DIR  (a folder holding config.yaml, "
              f"as `{maker}` makes)", file=sys.stderr)
        return 2
    # before torch loads: libgomp reads its variables once (ddp_lab/world/cpu.py)
    cpu.prepare_rank()
    # and the steps' freed memory is kept for the next step, not faulted in afresh
    cpu.keep_freed_memory()
    forked = multiprocessing.parent_process() is not None  # ddp_lab.launch.torchrun.fork_ranks
    if forked:
        whole_lines()
    rc = run(Path(argv[0]).resolve())
    # Leave without the interpreter's teardown (with torch loaded, ~1 s of CPU; a broken process
    # group can block it): everything the rank wrote is closed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    from .epochs import RECEIVED

    if forked and rc == 0 and not RECEIVED & set(AGENT_SIGNALS):
        # torchrun reads the result, then frees the ranks: wait for it
        exit_soon(rc)
        sys.exit(rc)
    # a failed or stopped rank puts no result on torchrun's queue, and a rank torchrun has
    # signalled (closing its ranks: it reads no result) has nobody to wait for: it leaves now
    os._exit(rc)


# ------------------------------------------------------------------ a rank's start and end
def exit_soon(rc: int) -> None:
    """A forked rank's last step. torchrun ends a rank in two moves: the rank queues its return
    value, then waits on a shared Event until torchrun has read them all. A rank ended inside that
    `multiprocessing.Condition` wait never acknowledges the wake-up, and torchrun's `Event.set`
    then waits forever. So a thread ends the rank with `rc` only when waiting is pointless:
    torchrun is gone (reparented, or the SIGINT of its death) or has signalled it (closing the
    ranks: then it never sets the Event)."""
    torchrun = multiprocessing.parent_process().pid  # reparented once torchrun is gone
    # the signals reach this process's C handler on whichever thread: the wakeup fd tells the
    # watcher, whatever the main thread is blocked in (the Condition's semaphore)
    r, w = os.pipe()
    os.set_blocking(w, False)
    for sig in AGENT_SIGNALS:
        signal.signal(sig, lambda *_: None)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)

    def watch() -> None:
        while os.getppid() == torchrun and not select.select([r], [], [], 0.05)[0]:
            pass
        os._exit(rc)

    threading.Thread(target=watch, name="exit_soon", daemon=True).start()


def whole_lines() -> None:
    """stdout and stderr written a line at a time: one write per line, never a part."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(line_buffering=True, write_through=False)


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit("usage: python -m ddp_lab.rank.main MODULE [ARGS...]")
    whole_lines()
    module = sys.argv[1]
    sys.argv = [module, *sys.argv[2:]]  # as `python -m MODULE ARGS` sees them
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
