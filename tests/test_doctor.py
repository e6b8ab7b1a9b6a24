"""`python -m ddp_lab.doctor` (issue 48, docs/doctor.md): the parsers on the formats NVIDIA
documents, the interface and core helpers, each verdict on the facts of a wrong allocation,
the records a run and the report read; then the doctor itself on this machine (launcher
local): healthy, a damaged data file (and the run after it says so first), a wrong
interface, a mistake on the command line. The 2-node allocations: test_doctor_slurm.py."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from helpers import describe, run_cli, run_dir_of

from ddp_lab.doctor import probe
from ddp_lab.doctor.verdicts import nccl_transport, nearest_nic, parse_topo
from ddp_lab.doctor.verdicts import Facts
from ddp_lab.doctor.verdicts import verdicts
from ddp_lab.folder import doctor as records

# ---------------------------------------------------------------- NCCL's INFO lines
# as NCCL_DEBUG=INFO prints them (NCCL 2.18+: "host:pid:tid [dev] NCCL INFO ...")
NCCL_IB = """\
nid001:4242:4300 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to hsn
nid001:4242:4300 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB hsn0:10.1.0.1<0>
nid001:4242:4300 [0] NCCL INFO Using network IB
nid001:4242:4300 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC
nid001:4242:4300 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/IPC/read
nid001:4242:4300 [0] NCCL INFO Channel 00/0 : 3[3] -> 4[0] [send] via NET/IB/0/GDRDMA
nid001:4242:4300 [0] NCCL INFO Channel 00/0 : 7[3] -> 0[0] [receive] via NET/IB/1/GDRDMA
nid001:4242:4300 [0] NCCL INFO Connected all rings
"""
NCCL_SOCKET = """\
gpu-a:77:90 [0] NCCL INFO NET/IB : No device found.
gpu-a:77:90 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.5<0>
gpu-a:77:90 [0] NCCL INFO Using network Socket
gpu-a:77:90 [0] NCCL INFO Channel 00/0 : 1[1] -> 0[0] via SHM/direct/direct
gpu-a:77:90 [0] NCCL INFO Channel 00/0 : 2[0] -> 0[0] [receive] via NET/Socket/0
gpu-a:77:90 [0] NCCL INFO Channel 00/0 : 0[0] -> 2[0] [send] via NET/Socket/0
"""


def test_nccl_transport_reads_ib_with_gpudirect_and_p2p():
    t = nccl_transport(NCCL_IB.splitlines())
    assert t["network"] == "IB" and t["connections"] == {"NET/IB": 2, "P2P": 2}
    assert t["gdrdma"] and t["net_devices"].startswith("[0]mlx5_0:1/IB")


def test_nccl_transport_reads_sockets_and_their_interface():
    t = nccl_transport(NCCL_SOCKET.splitlines())
    assert t["network"] == "Socket" and t["connections"] == {"NET/Socket": 2, "SHM": 1}
    assert t["socket_ifaces"] == ["eth0"] and not t["gdrdma"]


# ---------------------------------------------------------------- nvidia-smi topo -m
# the matrix and legends as `nvidia-smi topo -m` prints them (tab separated, NIC legend)
TOPO = ("\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n"
        "GPU0\t X \tNV18\tNV18\tNV18\tPIX\tSYS\t0-71\t0\t\tN/A\n"
        "GPU1\tNV18\t X \tNV18\tNV18\tPXB\tSYS\t0-71\t0\t\tN/A\n"
        "GPU2\tNV18\tNV18\t X \tNV18\tSYS\tNODE\t72-143\t1\t\tN/A\n"
        "GPU3\tNV18\tNV18\tNV18\t X \tSYS\tSYS\t72-143\t1\t\tN/A\n"
        "NIC0\tPIX\tPXB\tSYS\tSYS\t X \tSYS\t\t\t\t\n"
        "NIC1\tSYS\tSYS\tNODE\tSYS\tSYS\t X \t\t\t\t\n"
        "\nLegend:\n\n  X    = Self\n"
        "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n"
        "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node\n"
        "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
        "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)\n"
        "  PIX  = Connection traversing at most a single PCIe bridge\n"
        "  NV#  = Connection traversing a bonded set of # NVLinks\n\n"
        "NIC Legend:\n\n  NIC0: mlx5_0\n  NIC1: mlx5_1\n")


def test_topo_matrix_affinities_and_nearest_nic():
    topo = parse_topo(TOPO)
    assert topo["gpus"] == ["GPU0", "GPU1", "GPU2", "GPU3"] and topo["nics"] == ["NIC0", "NIC1"]
    assert topo["matrix"]["GPU0"]["GPU1"] == "NV18" and topo["matrix"]["NIC1"]["GPU2"] == "NODE"
    assert topo["cpu_affinity"]["GPU2"] == "72-143" and topo["numa_affinity"]["GPU3"] == "1"
    assert nearest_nic(topo) == {"GPU0": ("mlx5_0", "PIX"), "GPU1": ("mlx5_0", "PXB"),
                                 "GPU2": ("mlx5_1", "NODE"), "GPU3": ("mlx5_0", "SYS")}
    assert parse_topo("NVIDIA-SMI has failed") is None


# ---------------------------------------------------------------- helpers of the ranks' facts
def test_interfaces_as_gloo_and_nccl_read_them():
    names = ["lo", "eth0", "eth1", "ib0", "docker0"]
    assert probe.resolve_ifname("GLOO_SOCKET_IFNAME", "eth1", names) == ["eth1"]
    assert probe.resolve_ifname("GLOO_SOCKET_IFNAME", "nonexistent", names) == []
    assert probe.resolve_ifname("NCCL_SOCKET_IFNAME", "eth", names) == ["eth0", "eth1"]
    assert probe.resolve_ifname("NCCL_SOCKET_IFNAME", "=eth", names) == []
    assert probe.resolve_ifname("NCCL_SOCKET_IFNAME", "^docker,eth", names) == ["ib0"]
    assert probe.resolve_ifname("NCCL_SOCKET_IFNAME", "hsn", names) == []


def test_cpu_lists_and_numa_nodes(tmp_path):
    assert probe.ranges([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"
    assert probe.parse_cpulist("0-2,5") == {0, 1, 2, 5}
    for n, cpus in ((0, "0-3"), (1, "4-7")):
        (tmp_path / f"node{n}").mkdir()
        (tmp_path / f"node{n}" / "cpulist").write_text(cpus + "\n")
    assert probe.numa_of([2, 5], str(tmp_path)) == [0, 1]
    assert probe.numa_of([6], str(tmp_path)) == [1]
    assert probe.numa_of([0], str(tmp_path / "none")) is None


# ---------------------------------------------------------------- verdicts
SUMS = {"t10k-images-idx3-ubyte": "a", "t10k-labels-idx1-ubyte": "b",
        "train-images-idx3-ubyte": "c", "train-labels-idx1-ubyte": "d"}
SOFTWARE = {"python": "3.11.7", "torch": "2.14.1", "cuda": "13.0", "nccl": "2.30.7",
            "ddp_lab": "0.1.0"}


def healthy(nodes=2, nproc=1, launcher="slurm", per_task=False) -> Facts:
    """The facts of a healthy 2-node allocation as the worker writes them (gloo, CPUs)."""
    ranks, measures = [], {}
    for node in range(nodes):
        for local in range(nproc):
            rank = node * nproc + local
            r = {"rank": rank, "local_rank": local, "world_size": nodes * nproc,
                 "local_world_size": nproc, "node_rank": node, "num_nodes": nodes,
                 "node": f"node{node + 1}", "master_addr": "node1", "master_port": 29500,
                 "cpus": "0-7", "ncpus": 8, "numa": [0], "gpus": {"count": 0},
                 "scheduler": {"SLURM_NTASKS_PER_NODE": str(nproc if per_task else 1)},
                 "master": {"answers": True}}
            if local == 0:
                r["node_facts"] = {
                    "software": dict(SOFTWARE),
                    "data": {"root": "/data", "files": dict(SUMS), "expected": dict(SUMS)},
                    "network": {"interfaces": ["lo", "eth0"], "chosen": {},
                                "link": {"iface": "eth0", "speed_mbit": 10000,
                                         "shaped_Bps": None, "mtu": 1500},
                                "rdma_devices": []}}
            ranks.append(r)
            measures[rank] = {"rank": rank, "backend": "gloo", "device": "cpu"}
            if local == 0 and nodes > 1:
                measures[rank]["cross"] = {"bytes": 1 << 24, "ranks": nodes, "backend": "gloo",
                                           "busbw_Bps": 900e6, "seconds": 0.02}
    settings = {"launcher": launcher, "nodes": nodes, "nproc_per_node": nproc,
                "world_size": nodes * nproc, "per_task": per_task, "device": "cpu",
                "node_local": False}
    return Facts(settings, ranks, measures, "", 0)


def lines(f: Facts) -> dict[str, str]:
    return {c.name: c.line() for c in verdicts(f)}


def failed(f: Facts) -> dict[str, str]:
    return {c.name: c.line() for c in verdicts(f) if not c.ok}


def test_a_healthy_allocation_passes_every_check():
    got = lines(healthy())
    assert not failed(healthy()), got
    assert set(got) == {"ranks", "tasks", "cores", "software", "data", "interface", "link",
                        "rendezvous", "inter-node all-reduce"}
    assert got["inter-node all-reduce"].startswith("ok inter-node all-reduce: busbw 900 MB/s")
    assert "72% of the link's rate" in got["inter-node all-reduce"]


def test_another_torch_on_one_node():
    f = healthy()
    f.ranks[1]["node_facts"]["software"]["torch"] = "2.3.1"
    assert failed(f) == {"software": "FAIL software: torch differs: node2 has 2.3.1, node1 "
                         "2.14.1 -> install the same torch on every node, or point "
                         "launcher.venv (or launcher.image) at one every node sees"}


def test_data_missing_on_one_node_and_a_damaged_copy():
    f = healthy()
    f.ranks[1]["node_facts"]["data"]["files"] = dict.fromkeys(SUMS)
    assert failed(f)["data"].startswith("FAIL data: data missing on node2 under /data (4 of "
                                        "4 files) -> data.root is shared")
    f.settings["node_local"] = True
    assert "copy it there first" in failed(f)["data"]
    g = healthy()
    g.ranks[0]["node_facts"]["data"]["files"]["t10k-labels-idx1-ubyte"] = "x"
    assert failed(g)["data"].startswith("FAIL data: t10k-labels-idx1-ubyte under /data has MD5 "
                                        "x on node1, not b -> remove it")
    nowhere = healthy()
    for r in nowhere.ranks:
        r["node_facts"]["data"]["files"] = dict.fromkeys(SUMS)
    assert "global rank 0 fetches it" in lines(nowhere)["data"] and not failed(nowhere)


def test_a_wrong_socket_interface():
    f = healthy()
    for r in f.ranks:
        r["node_facts"]["network"].update(chosen={"GLOO_SOCKET_IFNAME": {
            "spec": "nonexistent", "resolved": []}}, link=None)
        r["skipped_group"] = True
    f.measures, f.rc = {}, 1
    bad = failed(f)
    assert bad["interface"] == ("FAIL interface: GLOO_SOCKET_IFNAME=nonexistent does not exist "
                                "on node1 (it has lo, eth0) -> set GLOO_SOCKET_IFNAME=eth0 or "
                                "unset it (then the interface of the hostname's address is "
                                "used)")
    assert "did not try" in bad["rendezvous"] and "not read" in bad["link"]


def test_tasks_per_node_against_the_launcher():
    f = healthy(nproc=2, per_task=True)
    for r in f.ranks:
        r["scheduler"]["SLURM_NTASKS_PER_NODE"] = "1"
    assert failed(f)["tasks"].startswith(
        "FAIL tasks: SLURM gives 1 task(s) per node on node1, node2, launcher.nproc_per_node=2 "
        "(launcher.per_task=true: one task per rank wants 2) -> drop the --ntasks-per-node")
    g = healthy(nproc=2)
    g.settings["device"] = "cuda"
    for r in g.ranks:
        r["scheduler"]["SLURM_GPUS_ON_NODE"] = "4"
        r["gpus"] = {"count": 4}
    assert failed(g)["tasks"].startswith("FAIL tasks: SLURM gives 4 GPU(s) on node1, node2, "
                                         "launcher.nproc_per_node=2 -> set "
                                         "launcher.nproc_per_node=4")
    h = healthy(nproc=2)
    h.ranks = h.ranks[:3]  # node2 started one rank of two
    assert "ranks" in failed(h) and "node2 runs 1 rank(s)" in failed(h)["tasks"]
    m = healthy(nproc=2, launcher="mpirun")
    m.settings["slots"] = [2, 3]  # launcher.hosts=[a:2,b:3]: node2 should run 3
    assert failed(m)["tasks"].startswith("FAIL tasks: node2 runs 2 rank(s), launcher.hosts "
                                         "gives it 3 slot(s)")
    m.settings["slots"] = [2, 2]
    assert "tasks" not in failed(m)


def test_one_slow_link_and_a_slow_all_reduce():
    f = healthy()
    f.ranks[1]["node_facts"]["network"]["link"].update(shaped_Bps=6.25e6)
    f.measures[0]["cross"]["busbw_Bps"] = 6.0e6
    bad = failed(f)
    assert bad["link"].startswith("FAIL link: the nodes' links differ: node2 eth0 shaped to "
                                  "6.25 MB/s (tbf), MTU 1500; node1 eth0 10000 Mbit/s")
    assert bad["inter-node all-reduce"].startswith(
        "FAIL inter-node all-reduce: inter-node all-reduce at 6 MB/s, held to node2's link")
    g = healthy()
    g.measures[0]["cross"].update(backend="nccl", busbw_Bps=0.11 * 1.25e9)
    assert failed(g)["inter-node all-reduce"].startswith(
        "FAIL inter-node all-reduce: inter-node all-reduce at 11% of the link's rate")


def test_nccl_on_sockets_where_the_nodes_have_infiniband():
    f = healthy()
    for r in f.ranks:
        if "node_facts" in r:
            r["node_facts"]["network"]["rdma_devices"] = ["mlx5_0 (roce)"]
    f.measures[0]["nccl"] = nccl_transport(NCCL_SOCKET.splitlines())
    assert failed(f)["nccl transport"].startswith(
        "FAIL nccl transport: NCCL on NET/Socket eth0: InfiniBand/RoCE/Slingshot not used though "
        "the nodes have mlx5_0 (roce)")
    f.measures[0]["nccl"] = nccl_transport(NCCL_IB.splitlines())
    assert lines(f)["nccl transport"] == "ok nccl transport: NET/IB+P2P with GPUDirect RDMA"


def test_a_gpu_far_from_every_nic():
    f = healthy()
    f.ranks[0]["node_facts"]["topo"] = TOPO
    assert failed(f)["gpu-nic affinity"].startswith(
        "FAIL gpu-nic affinity: node1 GPU2's nearest NIC mlx5_1 is NODE")


# ---------------------------------------------------------------- records
def test_a_run_hears_of_the_newest_doctor_of_its_fingerprint(tmp_path):
    ok = {"checks": [{"name": "data", "ok": True, "line": "ok data: fine"}]}
    bad = {"checks": [{"name": "data", "ok": False, "line": "FAIL data: missing"}]}
    records.write(tmp_path / "doctor_a", {**bad, "fingerprint_id": "f1", "finished": "1"})
    records.write(tmp_path / "doctor_b", {**ok, "fingerprint_id": "f2", "finished": "2"})
    assert records.run_warnings(tmp_path, "f2") == [] and records.run_warnings(tmp_path, None) == []
    warn = records.run_warnings(tmp_path, "f1")
    assert warn[0].startswith("this allocation (fingerprint f1) failed 1 doctor check(s)")
    assert warn[1] == "  FAIL data: missing"
    records.write(tmp_path / "doctor_c", {**ok, "fingerprint_id": "f1", "finished": "3"})
    assert records.run_warnings(tmp_path, "f1") == []  # the newest passed


# ---------------------------------------------------------------- the doctor on this machine
@pytest.mark.dist
@pytest.mark.slow
def test_the_doctor_on_this_machine(tmp_path, shared_data_root):
    """Healthy: exit 0, every check listed, doctor.json kept with the fingerprint id. A
    damaged data file: exit 1 naming it, and the run after it on the same allocation says
    so in its first lines (then repairs the file, as it always does). A wrong interface:
    exit 1 at once, no rank waits out a timeout. A mistake: exit 2, one line. The report
    lists both doctors beside the run of their fingerprint."""
    data = tmp_path / "data"
    shutil.copytree(shared_data_root, data)
    common = [f"run.root={tmp_path / 'runs'}", f"data.root={data}", "launcher.nproc_per_node=2"]
    proc = run_cli(*common, cwd=tmp_path, module="ddp_lab.doctor", timeout=240)
    assert proc.returncode == 0, describe(proc)
    verdict = [ln for ln in proc.stdout.splitlines() if ln.startswith(("ok ", "FAIL "))]
    assert [ln.split(":")[0] for ln in verdict] == [
        "ok ranks", "ok tasks", "ok cores", "ok software", "ok data", "ok interface", "ok link",
        "ok rendezvous", "ok intra-node all-reduce"], describe(proc)
    folder = run_dir_of(proc)
    assert folder.name.startswith("doctor_")
    doc = json.loads((folder / "doctor.json").read_text())
    assert doc["healthy"] and len(doc["fingerprint_id"]) == 10 and doc["elapsed_s"] < 60, doc
    print(f"the doctor took {doc['elapsed_s']} s here (local, 2 ranks)")

    raw = data / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    raw.write_bytes(raw.read_bytes()[:-1] + b"\x00")
    proc = run_cli(*common, cwd=tmp_path, module="ddp_lab.doctor", timeout=240)
    assert proc.returncode == 1, describe(proc)
    (bad,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("FAIL ")]
    assert bad.startswith("FAIL data: t10k-labels-idx1-ubyte under ") and " -> " in bad, bad
    fid = json.loads((run_dir_of(proc) / "doctor.json").read_text())["fingerprint_id"]
    assert fid == doc["fingerprint_id"]  # the data is not in the fingerprint

    run = run_cli(*common, "train.epochs=1", "train.max_steps_per_epoch=3", cwd=tmp_path,
                  timeout=240)
    assert run.returncode == 0, describe(run)
    first = run.stdout.splitlines()[:6]
    assert any(f"this allocation (fingerprint {fid}) failed 1 doctor check(s)" in ln
               for ln in first), describe(run)
    assert any(bad in ln for ln in first), describe(run)
    assert json.loads((run_dir_of(run) / "summary.json").read_text())["fingerprint_id"] == fid
    # the report shows the allocation's checks beside its runs of the same fingerprint
    rep = run_cli(str(tmp_path / "runs"), "-o", str(tmp_path / "report"), "--no-plots",
                  cwd=tmp_path, module="ddp_lab.report", timeout=120)
    assert rep.returncode == 0, describe(rep)
    md = (tmp_path / "report" / "report.md").read_text()
    section = md.split("## The allocations' doctor checks", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith(f"| {fid} |")]
    assert len(rows) == 2, section  # the healthy doctor and the failing one
    assert any("9 checks ok" in r for r in rows) and any("1 FAIL: data:" in r for r in rows)
    assert all(run_dir_of(run).name in r for r in rows), section

    proc = run_cli(*common, cwd=tmp_path, module="ddp_lab.doctor", timeout=240,
                   env={"GLOO_SOCKET_IFNAME": "nonexistent"})
    assert proc.returncode == 1, describe(proc)
    assert "FAIL interface: GLOO_SOCKET_IFNAME=nonexistent does not exist on " in proc.stdout

    proc = run_cli(*common, "launcher.nproc_per_node=0", cwd=tmp_path, module="ddp_lab.doctor")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, describe(proc)
    assert proc.stderr.startswith("error: launcher.nproc_per_node=0"), describe(proc)


def test_a_job_that_never_starts_its_ranks_is_ended_at_the_doctors_bound(
        tmp_path, shared_data_root, monkeypatch, capsys):
    """The doctor's whole job is bounded (doctor/submit.JOB_LIMIT_S, 180 s; 4 s here): a job
    whose ranks never start (every python of the job hangs as it starts, as mpirun does when a
    daemon dies) reaches none of the ranks' own timeouts. The doctor ends it, says so in a
    `job` check, exits 1, and leaves no process of the job."""
    from ddp_lab.command.job import T0_ENV
    from ddp_lab.doctor import submit
    from ddp_lab.launch.local import JOB_ENV, job_processes
    from helpers import compose

    site = tmp_path / "site"
    site.mkdir()
    # the job's processes carry JOB_ENV (launch/local.Foreground); this test's process does not
    (site / "sitecustomize.py").write_text(
        "import os, time\nif os.environ.get(%r):\n    time.sleep(600)\n" % JOB_ENV)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(site), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv(T0_ENV, "0")  # launch_job sets it for its job: put back after
    monkeypatch.setattr(submit, "JOB_LIMIT_S", 4.0)
    monkeypatch.chdir(tmp_path)
    cfg = compose(f"run.root={tmp_path / 'runs'}", f"data.root={shared_data_root}",
                  "launcher.nproc_per_node=2")
    outcome = submit.submit_doctor(cfg, argv=[])
    out = capsys.readouterr().out
    assert outcome.rc == 1, out
    checks = [ln for ln in out.splitlines() if ln.startswith(("ok ", "FAIL "))]
    assert "FAIL job: still running after 4 s: ended by the doctor" in "\n".join(checks), out
    assert any(ln.startswith("FAIL ranks: 0 of 2 rank(s) started") for ln in checks), out
    assert not job_processes(outcome.run_dir), job_processes(outcome.run_dir)
