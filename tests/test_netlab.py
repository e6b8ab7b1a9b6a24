"""Proof that scripts/netlab.sh gives nodes joined by a real, shaped interconnect:

* up then down leaves nothing of the lab (namespaces, links, record, hosts files, processes
  inside, daemons too), two labs of different names coexist on different /24s (also when
  made at the same moment), bad arguments exit 2 naming the option;
* names resolve on a node as on a real cluster: node1..N to the nodes' addresses, the
  machine's hostname to that node's own address;
* `shape` changes a live lab's rate and back, leaving what runs in it running;
* a shaped link carries its configured rate each way (a TCP transfer), an unshaped one is
  far faster;
* a 2-node gloo all_reduce across the link (one process per node, rendezvous at `node1`, no
  GLOO_SOCKET_IFNAME: the hostname names the uplink) reaches the link's rate as bus bandwidth.
"""

from __future__ import annotations

from pathlib import Path

import ipaddress
import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from netlab_fixture import (NETLAB_SCRIPT, RECORD_DIR, free_port_on, lab_down, measure_transfer,
                            netlab_sh, parse_nodes, read_record, unique_name)

pytestmark = [pytest.mark.netlab]

MB = 1_000_000


def namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True)
    return {line.split()[0] for line in out.stdout.splitlines() if line.strip()}


def links() -> set[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True)
    return {line.split(": ")[1].split("@")[0] for line in out.stdout.splitlines()}


ETC_NETNS = Path("/etc/netns")


def leftovers(name: str) -> list[str]:
    prefix = f"{name}-"
    found = sorted(n for n in namespaces() | links() if n.startswith(prefix))
    if (RECORD_DIR / f"{name}.env").exists():
        found.append(str(RECORD_DIR / f"{name}.env"))
    if ETC_NETNS.is_dir():
        found += sorted(str(p) for p in ETC_NETNS.iterdir() if p.name.startswith(prefix))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def subnet(addr: str) -> ipaddress.IPv4Network:
    return ipaddress.ip_network(f"{addr}/24", strict=False)


def test_up_down_leaves_nothing_and_labs_coexist(netlab_factory):
    a = netlab_factory(nodes=2, link="200mbit")
    b = netlab_factory(nodes=3, link="none")
    bench = ipaddress.ip_network("198.18.0.0/15")
    for lab in (a, b):
        assert [n.name for n in lab.nodes] == [f"node{i}" for i in range(1, len(lab.nodes) + 1)]
        nets = {subnet(n.addr) for n in lab.nodes} | {subnet(lab.bridge_addr)}
        assert len(nets) == 1 and nets.pop().subnet_of(bench), lab
        assert {n.netns for n in lab.nodes} <= namespaces()
        # each node has lo up and exactly its address on its uplink
        out = lab.run(lab.nodes[-1], ["ip", "-o", "addr", "show"], check=True).stdout
        assert "127.0.0.1/8" in out and f"{lab.nodes[-1].addr}/24" in out, out
    assert subnet(a.nodes[0].addr) != subnet(b.nodes[0].addr)
    assert len(b.nodes) == 3 and a.rate_bytes == 25 * MB and b.rate_bytes is None

    # status prints what up printed
    res = netlab_sh("status", "--name", a.name)
    assert res.returncode == 0 and parse_nodes(res.stdout) == a.nodes, res.stderr

    # a labs' nodes reach each other and the root namespace, not the other lab
    reach = ("import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], 9), "
             "timeout=3)\nexcept ConnectionRefusedError:\n    print('reached')\n"
             "except OSError as e:\n    print('unreachable', e)")
    for target, want in ((a.nodes[1].addr, "reached"), (a.bridge_addr, "reached"),
                         (b.nodes[0].addr, "unreachable")):
        out = a.run(a.nodes[0], [sys.executable, "-c", reach, target], check=True).stdout
        assert out.startswith(want), (target, out)

    # down kills what runs in the nodes (a daemon detached from us too: a slurmd) and
    # removes everything of that name, only that
    sleeper = a.popen(a.nodes[0], ["sleep", "300"])
    daemon = a.run(a.nodes[1], ["sh", "-c", "setsid sleep 301 </dev/null >/dev/null 2>&1 & "
                                "echo $!"], check=True).stdout.strip()
    assert alive(int(daemon)) and int(daemon) in netns_pids(a.nodes[1].netns)
    res = netlab_sh("down", "--name", a.name)
    assert res.returncode == 0, res.stderr
    assert sleeper.wait(timeout=10) is not None
    assert not alive(int(daemon))
    assert leftovers(a.name) == []
    assert netlab_sh("status", "--name", a.name).returncode == 1
    assert netlab_sh("down", "--name", a.name).returncode == 0  # idempotent
    assert netlab_sh("status", "--name", b.name).returncode == 0

    # a lab up with other options is left alone; down removes it
    res = netlab_sh("up", "--nodes", "2", "--name", b.name)
    assert res.returncode == 1 and "already up with --nodes 3" in res.stderr, res.stderr
    assert netlab_sh("status", "--name", b.name).returncode == 0
    assert netlab_sh("down", "--name", b.name).returncode == 0
    assert leftovers(b.name) == []


def netns_pids(ns: str) -> set[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=30)
    return {int(p) for p in out.stdout.split()}


RESOLVE_PY = ("import socket, sys\n"
              "print(' '.join(socket.gethostbyname(n) for n in sys.argv[1:]))")


def test_names_resolve_as_on_a_cluster(netlab_factory):
    """On node i: nodeJ is node J's address, the machine's hostname node i's own (the hosts
    file netlab.sh binds over /etc/hosts there); the root namespace's /etc/hosts is untouched."""
    before = Path("/etc/hosts").read_text()
    lab = netlab_factory(nodes=3, link="none")
    host = socket.gethostname()
    names = [n.name for n in lab.nodes]
    for node in lab.nodes:
        assert (ETC_NETNS / node.netns / "hosts").is_file()
        out = lab.run(node, [sys.executable, "-c", RESOLVE_PY, *names, host, "localhost"],
                      check=True).stdout.split()
        assert out == [n.addr for n in lab.nodes] + [node.addr, "127.0.0.1"], (node, out)
    assert Path("/etc/hosts").read_text() == before
    record = read_record(lab.name)  # what slurm_cluster.sh reads: the addresses printed
    assert [record[f"NETLAB_NODE{i}_ADDR"] for i in (1, 2, 3)] == [n.addr for n in lab.nodes]


def test_shape_changes_a_live_lab(netlab_factory):
    lab = netlab_factory(nodes=2, link="none")
    n1, n2 = lab.nodes
    sleeper = lab.popen(n1, ["sleep", "300"])  # what runs in a node keeps running

    def qdiscs() -> list[str]:
        return [subprocess.run(["tc", *args, "qdisc", "show", "dev", dev], capture_output=True,
                               text=True, timeout=30, check=True).stdout
                for args, dev in ((["-n", n1.netns], "eth0"), (["-n", n2.netns], "eth0"),
                                  ([], f"{lab.name}-h1"), ([], f"{lab.name}-h2"))]

    try:
        assert not any("tbf" in q for q in qdiscs())
        res = netlab_sh("shape", "--name", lab.name, "--link", "200mbit")
        assert res.returncode == 0 and res.stdout == "", res.stderr
        assert all("tbf" in q and "rate 200Mbit" in q for q in qdiscs()), qdiscs()
        record = read_record(lab.name)
        assert (record["NETLAB_LINK"], record["NETLAB_RATE_BYTES"]) == ("200mbit", "25000000")
        rate, rates = best_rate(lab, n1, n2, 10 * MB, enough=0.9 * 25 * MB)
        assert abs(rate / (25 * MB) - 1) < 0.10, rates
        assert netlab_sh("shape", "--name", lab.name, "--link", "1gbit").returncode == 0
        assert all("rate 1Gbit" in q for q in qdiscs()), qdiscs()
        assert netlab_sh("shape", "--name", lab.name, "--link", "none").returncode == 0
        assert not any("tbf" in q for q in qdiscs()), qdiscs()
        assert read_record(lab.name)["NETLAB_LINK"] == "none"
        assert netlab_sh("shape", "--name", lab.name, "--link", "none").returncode == 0
        assert sleeper.poll() is None
        assert netlab_sh("status", "--name", lab.name).returncode == 0
    finally:
        sleeper.kill()
        sleeper.wait(10)
    res = netlab_sh("shape", "--name", unique_name(), "--link", "200mbit")
    assert res.returncode == 1 and "is not up" in res.stderr, res.stderr


def test_shape_one_node(netlab_factory):
    """`shape --node 2` shapes node2's link alone (a slow node among fast ones); a `shape`
    without --node sets every link again."""
    lab = netlab_factory(nodes=3, link="200mbit")

    def rates() -> list[str]:
        out = []
        for i, node in enumerate(lab.nodes, 1):
            ends = [["tc", "-n", node.netns, "qdisc", "show", "dev", "eth0"],
                    ["tc", "qdisc", "show", "dev", f"{lab.name}-h{i}"]]
            shown = [subprocess.run(a, capture_output=True, text=True, timeout=30,
                                    check=True).stdout for a in ends]
            out.append(" ".join(sorted({w for q in shown for w in q.split()
                                        if w.endswith("bit")})))
        return out

    res = netlab_sh("shape", "--name", lab.name, "--node", "2", "--link", "50mbit")
    assert res.returncode == 0 and res.stdout == "", res.stderr
    assert rates() == ["200Mbit", "50Mbit", "200Mbit"], rates()
    record = read_record(lab.name)
    assert (record["NETLAB_LINK"], record["NETLAB_LINK_NODE2"]) == ("200mbit", "50mbit")
    res = netlab_sh("shape", "--name", lab.name, "--node", "4", "--link", "50mbit")
    assert res.returncode == 1 and "has 3 nodes" in res.stderr, res.stderr
    assert netlab_sh("shape", "--name", lab.name, "--link", "1gbit").returncode == 0
    assert rates() == ["1Gbit"] * 3, rates()
    assert "NETLAB_LINK_NODE2" not in read_record(lab.name)


def test_labs_made_at_once_get_their_own_subnets(netlab_factory):
    """Two `up`s at the same moment (two test sessions): the lock gives each its own /24."""
    names = [unique_name(), unique_name()]
    try:
        ups = [subprocess.Popen(["bash", str(NETLAB_SCRIPT), "up", "--link", "none", "--name", n],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL) for n in names]
        outs = [p.communicate(timeout=120) for p in ups]
        assert [p.returncode for p in ups] == [0, 0], outs
        nets = [subnet(parse_nodes(out)[0].addr) for out, _ in outs]
        assert nets[0] != nets[1], nets
    finally:
        for n in names:
            lab_down(n)
    assert leftovers(names[0]) == leftovers(names[1]) == []


@pytest.mark.parametrize("args, option", [
    (["up", "--nodes", "0"], "--nodes"),
    (["up", "--link", "200mb"], "--link"),
    (["up", "--name", "Bad-name"], "--name"),
    (["up", "--name", "waytoolongname"], "--name"),
    (["down", "--link", "1gbit"], "--link"),
    (["up", "--speed", "1"], "--speed"),
    (["up", "--nodes"], "--nodes"),
    (["shape"], "--link"),
    (["shape", "--link", "fast"], "--link"),
    (["shape", "--nodes", "3", "--link", "none"], "--nodes"),
    (["shape", "--node", "x", "--link", "50mbit"], "--node"),
    (["shape", "--node", "0", "--link", "50mbit"], "--node"),
    (["up", "--node", "2"], "--node"),
])
def test_bad_arguments(args, option):
    res = netlab_sh(*args, timeout=30)
    assert res.returncode == 2 and res.stdout == ""
    assert len(res.stderr.splitlines()) == 1 and option in res.stderr, res.stderr


def best_rate(lab, src, dst, nbytes: int, enough: float, tries: int = 3) -> tuple[float, list]:
    """The best of up to `tries` transfers, stopping at the first of `enough` bytes/s: load on
    these 2-core machines only ever slows a transfer down (seen under a parallel test suite:
    one of ten at 0.82 of a 200mbit link, unshaped ones from 108 to 390 MB/s)."""
    rates = []
    for _ in range(tries):
        rates.append(measure_transfer(lab, src, dst, nbytes))
        if rates[-1] >= enough:
            break
    return max(rates), rates


def test_shaped_link_carries_its_rate(netlab_factory):
    shaped = netlab_factory(nodes=2, link="200mbit")
    n1, n2 = shaped.nodes
    for src, dst in ((n1, n2), (n2, n1)):
        # 10 MB at 25 MB/s: 0.4 s. TCP/IP and Ethernet headers take ~4% of what tbf counts
        rate, rates = best_rate(shaped, src, dst, 10 * MB, enough=0.9 * shaped.rate_bytes)
        assert abs(rate / shaped.rate_bytes - 1) < 0.10, (src.name, dst.name, rates)
    free = netlab_factory(nodes=2, link="none")
    rate, rates = best_rate(free, *free.nodes, 10 * MB, enough=5 * shaped.rate_bytes)
    assert rate > 5 * shaped.rate_bytes, rates


ALLREDUCE_PY = textwrap.dedent(
    """
    import datetime, json, sys, time
    import torch
    import torch.distributed as dist

    rank, world, url = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", init_method=url, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    dist.all_reduce(torch.ones(1 << 18))  # warm-up: connections, buffers (1 MB)
    t = torch.ones(1 << 22)  # 16 MB of float32
    seconds = []
    for _ in range(3):  # the best of 3: load on the machine only ever slows one down
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(t)
        seconds.append(time.perf_counter() - t0)
    assert t[0].item() == world ** len(seconds), t[0].item()  # ones, summed each time
    print(json.dumps({"rank": rank, "bytes": t.numel() * 4, "seconds": seconds}), flush=True)
    dist.destroy_process_group()
    """
)


@pytest.mark.dist
def test_gloo_all_reduce_across_the_link(netlab):
    n1, n2 = netlab.nodes
    url = f"tcp://node1:{free_port_on(n1)}"  # the node's name, as on a cluster
    procs = []
    for rank, node in enumerate((n1, n2)):
        # no GLOO_SOCKET_IFNAME: gloo takes the address the hostname resolves to, which on a
        # node is its uplink's (netlab.sh's hosts files; the machine's says 127.0.0.1)
        env = {k: v for k, v in os.environ.items() if not k.endswith("_SOCKET_IFNAME")}
        env["OMP_NUM_THREADS"] = "1"
        procs.append(netlab.popen(node, [sys.executable, "-c", ALLREDUCE_PY, str(rank), "2", url],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True))
    outs = []
    deadline = time.monotonic() + 120
    for p in procs:
        try:
            outs.append(p.communicate(timeout=max(1.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("the 2-node all_reduce did not finish in 120 s")
    assert all(p.returncode == 0 for p in procs), outs
    result = json.loads(outs[0][0].strip().splitlines()[-1])
    world = 2
    algbw = result["bytes"] / min(result["seconds"])
    busbw = algbw * 2 * (world - 1) / world  # nccl-tests' definition
    assert abs(busbw / netlab.rate_bytes - 1) < 0.15, (busbw, result)
