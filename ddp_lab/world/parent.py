"""A process and the one that started it (torch-free): death with the parent, and the signal
handlers torchrun's agent takes over.

The agent (ddp_lab/launch/torchrun.py) keeps this process's handlers of AGENT_SIGNALS before it
installs its own (`keep_handlers`); a rank forked from it takes them back (`restore_handlers`,
ddp_lab/rank/forked.py).
"""

from __future__ import annotations

import ctypes
import signal

AGENT_SIGNALS = (signal.SIGTERM, signal.SIGINT,
                 signal.SIGHUP, signal.SIGQUIT)
# the handlers this process had before torchrun's agent took them
_before_agent: dict = {}


def keep_handlers() -> None:
    """Remember this process's handlers of AGENT_SIGNALS."""
    for sig in AGENT_SIGNALS:
        _before_agent[sig] = signal.getsignal(sig)


def restore_handlers() -> None:
    """Put back the handlers `keep_handlers` remembered."""
    for sig, handler in _before_agent.items():
        signal.signal(sig, handler)


def set_parent_death_signal(sig: int = signal.SIGTERM) -> bool:
    """Linux: get `sig` when the parent process dies (torchrun SIGKILLed). False elsewhere."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        # PR_SET_PDEATHSIG = 1
        return libc.prctl(1, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False
