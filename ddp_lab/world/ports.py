"""The rendezvous port: a free one, whether one is taken, and the lines that say a rendezvous could
not start (every launcher, test and script asks here); and whether a machine answers at all
(`answers`, ddp_lab.folder.failure's probe). The store listens on 0.0.0.0, so a port is free only
when nothing listens on it on any address.
"""

from __future__ import annotations

import random
import socket

WILDCARD = "0.0.0.0"  # where the store binds
PROBE_S = 2.0  # how long `answers` waits for a node's reply
PROBE_PORT = 9  # "discard": any port will do, a live node answers even where nothing listens
LOW = 20000  # free_port draws from here up to the ephemeral range: clear of well-known ports
FIX = "choose another launcher.master_port, or leave it unset for a free one"


def free_port(host: str = WILDCARD) -> int:
    """A port nothing listens on now, for a rendezvous that must name its port before it binds.
    Drawn at random below the kernel's ephemeral range (32768 where /proc does not say), where
    only another random draw can collide; another process may still take it first, so callers
    that can, retry."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for port in random.Random().sample(range(LOW, low), min(64, max(0, low - LOW))):
        if not port_in_use(port, host):
            return port
    # no room below: the OS's
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_in_use(port: int, host: str = WILDCARD) -> bool:
    """Whether the store could not bind `port`: the same bind (every address, SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def taken(host: str, port: int) -> str:
    """The line for a rendezvous whose port another program holds."""
    return (f"the rendezvous at {host}:{port} cannot start: another program holds port "
            f"{port} on that machine: {FIX}")


def no_answer(host: str, port: int, waited_s: float) -> str:
    """The line for a rendezvous that did not answer within dist.init_timeout_s."""
    return (f"the rendezvous at {host}:{port} did not answer within {waited_s:g} s "
            f"(dist.init_timeout_s): check that {host} is rank 0's machine and reachable "
            f"from this one on port {port}; if another program holds that port, {FIX}")


def answers(addr: str, timeout_s: float = PROBE_S) -> bool:
    """Whether the machine at `addr` answers a TCP connection attempt within `timeout_s`. Any reply
    counts, a refusal too: a live node's kernel refuses a port where nothing listens at once. A
    node behind a cut link sends nothing, and the attempt times out."""
    try:
        socket.create_connection((addr, PROBE_PORT), timeout=timeout_s).close()
    except ConnectionRefusedError:
        return True
    except OSError:  # timed out, or no route to it
        return False
    return True
