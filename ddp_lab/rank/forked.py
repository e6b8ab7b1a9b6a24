"""A rank forked by torchrun's fork_ranks (ddp_lab/launch/torchrun.py):
its start as a fresh `python -u` would begin, and its end. Torch-free:
rank/main imports it before torch loads."""

from __future__ import annotations

import multiprocessing
import os
import select
import signal
import threading

from ..world.env import AGENT_SIGNALS, restore_handlers
from .whole_lines import whole_lines


def as_forked_rank() -> None:
    """A forked rank starts as a fresh `python -u` would: this process's
    signal handlers, not the agent's, and its console written a whole
    line at a time (whole_lines)."""
    restore_handlers()
    whole_lines()



def exit_soon(rc: int) -> None:
    """A forked rank's last step. torchrun ends a rank in two moves: the
    rank queues its return value, then waits on a shared Event until
    torchrun has read them all. A rank ended inside that
    `multiprocessing.Condition` wait never acknowledges the wake-up, and
    torchrun's `Event.set` then waits forever. So a thread ends the rank
    with `rc` only when waiting is pointless: torchrun is gone
    (reparented, or the SIGINT of its death) or has signalled it
    (closing the ranks: then it never sets the Event)."""
    # reparented once torchrun is gone
    torchrun = multiprocessing.parent_process().pid
    # the signals reach this process's C handler on whichever thread:
    # the wakeup fd tells the watcher, whatever the main thread is
    # blocked in (the Condition's semaphore)
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
