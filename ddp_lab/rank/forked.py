"""A rank forked by torchrun's fork_ranks (ddp_lab/launch/torchrun.py): its start as a fresh
`python -u` would begin, and its end. Torch-free: the agent imports it before it forks."""

from __future__ import annotations

import multiprocessing
import os
import select
import signal
import threading

from .whole_lines import whole_lines

AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
_inherited: dict = {}  # fork_ranks: their handlers in this process before torchrun's agent


def as_forked_rank() -> None:
    """A rank forked by `fork_ranks` starts as a fresh `python -u` would, with the signal
    handlers this process was given, not the agent's (a SIGTERM ends the rank), and its
    console written a whole line at a time (whole_lines: the ranks share the console)."""
    for sig, handler in _inherited.items():
        signal.signal(sig, handler)
    whole_lines()



def exit_soon(rc: int) -> None:
    """A forked rank's last step. torchrun's fork protocol ends a rank in two moves: the
    rank puts its return value on a queue (a pipe: there the moment it is put), then waits
    on an Event torchrun shares with every rank until torchrun has read them all and sets
    it. That wait is a `multiprocessing.Condition` sleeper: a rank ended inside it never
    acknowledges the wake-up, and torchrun's `Event.set` then waits for it forever
    (`Condition.notify` -> `_woken_count.acquire()`). So the rank is never ended on a
    timer: it waits for torchrun, and a thread ends it with `rc` only when waiting is
    pointless, that is when torchrun is gone (killed: the rank is reparented, or gets the
    SIGINT torch's fork asks for at its parent's death), or when torchrun signals it
    (closing the ranks after a signal or a failed rank: then torchrun never sets the Event).
    A torchrun that polls seldom (torch < 2.4: every 5 s) only makes the end later."""
    torchrun = multiprocessing.parent_process().pid  # reparented once torchrun is gone
    # the signals reach this process's C handler on whichever thread: the wakeup fd tells
    # the watcher, whatever the main thread is blocked in (the Condition's semaphore)
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
