"""Network labs of the tests (scripts/netlab.sh): nodes in network namespaces joined by
shaped links, brought up and torn down around a test; commands run on a node; a link measured.

conftest.py offers the fixtures ``netlab`` (a 2-node lab, links shaped to 200 Mbit/s each
way) and ``netlab_factory`` (labs of any shape: ``netlab_factory(nodes=2, link="none")``),
each torn down when its test ends, whatever the test did::

    @pytest.mark.netlab
    def test_x(netlab):
        n1, n2 = netlab.nodes
        res = netlab.run(n1, ["hostname", "-I"])      # ip netns exec <ns> hostname -I
        rate = measure_transfer(netlab, n1, n2, 10_000_000)   # bytes/s

A lab's name is unique to this process (``nl<pid><n>``): two test sessions on one machine
never collide, and a lab a killed session left behind under a reused pid is cleaned first.
Outside pytest, :func:`lab_up` and :func:`lab_down` do the same.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator, Mapping, Sequence

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
NETLAB_SCRIPT = REPO_ROOT / "scripts" / "netlab.sh"
RECORD_DIR = Path("/run/ddp_lab_netlab")  # NAME.env: the script's record of a lab
SCRIPT_TIMEOUT_S = 120  # the script's waits: a 60 s lock, 5+2 s of killing, 10 s for links
DEFAULT_LINK = "200mbit"  # 25 MB/s each way: slow enough to see, fast enough for a short test

_counter = itertools.count()


@dataclasses.dataclass(frozen=True)
class Node:
    name: str  # node1, node2, ...
    netns: str  # the namespace: `ip netns exec <netns> cmd`
    addr: str  # its address on the lab's network
    ifname: str  # its uplink inside the namespace: GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME

    def cmd(self, argv: Sequence[str]) -> list[str]:
        """argv, run on this node."""
        return ["ip", "netns", "exec", self.netns, *argv]


@dataclasses.dataclass
class Lab:
    name: str
    nodes: list[Node]
    link: str  # the tc rate asked for, or "none"
    rate_bytes: float | None  # bytes/s each way of a node's link; None: unshaped
    bridge_addr: str  # the root namespace's address on the lab's network
    up_seconds: float

    def run(self, node: Node, argv: Sequence[str], timeout: float = 60,
            env: Mapping[str, str] | None = None, check: bool = False,
            **kwargs) -> subprocess.CompletedProcess:
        """Run argv on `node` and wait (bounded); text output captured."""
        return subprocess.run(node.cmd(argv), env=None if env is None else dict(env),
                              capture_output=True, text=True, timeout=timeout, check=check,
                              stdin=subprocess.DEVNULL, **kwargs)

    def popen(self, node: Node, argv: Sequence[str], env: Mapping[str, str] | None = None,
              **kwargs) -> subprocess.Popen:
        """Start argv on `node` (the caller waits for it; `down` kills what is left)."""
        return subprocess.Popen(node.cmd(argv), env=None if env is None else dict(env),
                                stdin=subprocess.DEVNULL, **kwargs)


def free_port_on(node: Node) -> int:
    """A port nothing listens on in node's namespace (its own ports: the root namespace's
    free ports say nothing about a node's)."""
    res = subprocess.run(node.cmd([sys.executable, "-c", "import socket; s = socket.socket(); "
                                   "s.bind(('0.0.0.0', 0)); print(s.getsockname()[1])"]),
                         capture_output=True, text=True, timeout=30, check=True)
    return int(res.stdout)


def unique_name() -> str:
    """A lab name no other live process uses: nl + pid + a counter (<= 10 characters)."""
    return f"nl{os.getpid()}{next(_counter):x}"[:10]


def netlab_sh(*args: str, timeout: float = SCRIPT_TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(NETLAB_SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)


def parse_nodes(stdout: str) -> list[Node]:
    """The node lines of `up` / `status`: NODE NAMESPACE ADDRESS IFNAME."""
    nodes = []
    for line in stdout.splitlines():
        fields = line.split()
        if len(fields) != 4:
            raise ValueError(f"netlab.sh printed {line!r}, not NODE NAMESPACE ADDRESS IFNAME")
        nodes.append(Node(*fields))
    return nodes


def read_record(name: str) -> dict[str, str]:
    path = RECORD_DIR / f"{name}.env"
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def lab_up(name: str | None = None, nodes: int = 2, link: str = DEFAULT_LINK) -> Lab:
    """A lab of `nodes` nodes whose links run at `link` ("none": unshaped). Anything left
    under that name is removed first; on failure nothing is left and RuntimeError says why."""
    name = name or unique_name()
    lab_down(name)
    t0 = time.monotonic()
    try:
        res = netlab_sh("up", "--nodes", str(nodes), "--link", link, "--name", name)
    except subprocess.TimeoutExpired as e:
        lab_down(name)
        raise RuntimeError(f"netlab.sh up did not finish in {SCRIPT_TIMEOUT_S} s: {e}") from e
    if res.returncode != 0:
        lab_down(name)
        raise RuntimeError(f"netlab.sh up failed (rc={res.returncode}):\n{res.stderr}")
    record = read_record(name)
    rate = float(record["NETLAB_RATE_BYTES"])
    return Lab(name=name, nodes=parse_nodes(res.stdout), link=link, rate_bytes=rate or None,
               bridge_addr=record["NETLAB_BRIDGE_ADDR"], up_seconds=time.monotonic() - t0)


def lab_status(name: str) -> Lab | None:
    """The lab of that name if it is up (made by anyone), else None."""
    res = netlab_sh("status", "--name", name)
    if res.returncode != 0:
        return None
    record = read_record(name)
    rate = float(record["NETLAB_RATE_BYTES"])
    return Lab(name=name, nodes=parse_nodes(res.stdout), link=record["NETLAB_LINK"],
               rate_bytes=rate or None, bridge_addr=record["NETLAB_BRIDGE_ADDR"], up_seconds=0.0)


def lab_down(name: str) -> None:
    """Kill what runs in the lab's nodes and remove it (nothing there: nothing done)."""
    res = netlab_sh("down", "--name", name)
    if res.returncode != 0:
        raise RuntimeError(f"netlab.sh down --name {name} failed (rc={res.returncode}):\n"
                           f"{res.stderr}")


@contextlib.contextmanager
def shaped(lab: Lab, link: str) -> Iterator[float]:
    """`lab`'s links at `link` (a tc rate) for the block, then back to what they were; yields
    the rate in bytes/s. What runs in the nodes (the cluster's slurmd) is not touched."""
    before = read_record(lab.name)["NETLAB_LINK"]
    res = netlab_sh("shape", "--name", lab.name, "--link", link)
    if res.returncode != 0:
        raise RuntimeError(f"netlab.sh shape --link {link} failed: {res.stderr}")
    try:
        yield float(read_record(lab.name)["NETLAB_RATE_BYTES"])
    finally:
        res = netlab_sh("shape", "--name", lab.name, "--link", before)
        if res.returncode != 0:
            raise RuntimeError(f"netlab.sh shape --link {before} (restoring) failed: {res.stderr}")


def skip_reason() -> str | None:
    """Why network labs cannot be made here, or None."""
    if os.geteuid() != 0:
        return "not root: network namespaces need root (scripts/netlab.sh)"
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (iproute2): no network lab tests"
    return None


@pytest.fixture
def netlab_factory():
    """lab = netlab_factory(nodes=2, link="200mbit"): as many labs as the test wants, each
    on its own name, all torn down at the end of the test."""
    reason = skip_reason()
    if reason:
        pytest.skip(reason)
    names: list[str] = []

    def make(nodes: int = 2, link: str = DEFAULT_LINK) -> Lab:
        name = unique_name()
        names.append(name)
        return lab_up(name, nodes, link)

    try:
        yield make
    finally:
        errors = []
        for name in names:
            try:
                lab_down(name)
            except Exception as e:  # noqa: BLE001 - tear every lab down, then report
                errors.append(str(e))
        if errors:
            raise RuntimeError("\n".join(errors))


@pytest.fixture
def netlab(netlab_factory) -> Lab:
    """A 2-node lab, each node's link shaped to 200 Mbit/s (25 MB/s) each way."""
    return netlab_factory(2, DEFAULT_LINK)


# ---------------------------------------------------------------------------------------
# measuring a link: a plain TCP transfer, timed where it arrives
# ---------------------------------------------------------------------------------------
RECEIVER_PY = r"""
import socket, sys, time
n = int(sys.argv[1])
srv = socket.socket(); srv.bind(("0.0.0.0", 0)); srv.listen(1); srv.settimeout(30)
print(srv.getsockname()[1], flush=True)
conn, _ = srv.accept(); conn.settimeout(30)
got, first, t0 = 0, 0, None
buf = bytearray(1 << 20)
while got < n:
    k = conn.recv_into(buf)
    if not k:
        break
    if t0 is None:  # from the first chunk's arrival: the connection's setup is not timed
        t0, first = time.perf_counter(), k
    got += k
t1 = time.perf_counter()
conn.sendall(b"k"); conn.close()
print(f"{got} {(got - first) / max(t1 - t0, 1e-9):.0f}", flush=True)
"""

SENDER_PY = r"""
import socket, sys
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = socket.create_connection((host, port), timeout=30)
chunk = b"x" * (1 << 20)
left = n
while left > 0:
    left -= s.send(chunk[:min(left, len(chunk))])
s.recv(1)  # the receiver's ack: everything arrived
"""


def measure_transfer(lab: Lab, src: Node, dst: Node | None, nbytes: int,
                     timeout: float = 60) -> float:
    """Bytes/s of one TCP transfer of nbytes from src to dst (None: the root namespace, on
    the bridge's address), timed by the receiver from its first chunk to its last."""
    recv_argv = [sys.executable, "-c", RECEIVER_PY, str(nbytes)]
    receiver = subprocess.Popen(dst.cmd(recv_argv) if dst else recv_argv,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL)
    try:
        port = receiver.stdout.readline().strip()  # the receiver times its accept out
        if not port.isdigit():
            receiver.kill()
            raise RuntimeError(f"receiver did not start: {receiver.communicate()[1]}")
        host = dst.addr if dst else lab.bridge_addr
        sent = lab.run(src, [sys.executable, "-c", SENDER_PY, host, port, str(nbytes)],
                       timeout=timeout)
        out, err = receiver.communicate(timeout=timeout)
        if sent.returncode != 0 or receiver.returncode != 0:
            raise RuntimeError(f"transfer {src.name} -> {dst.name if dst else 'root'} failed:\n"
                               f"sender: {sent.stderr}\nreceiver: {err}")
        got, rate = (int(x) for x in out.split())
        assert got == nbytes, (got, nbytes)
        return float(rate)
    finally:
        if receiver.poll() is None:
            receiver.kill()
            receiver.wait(5)
