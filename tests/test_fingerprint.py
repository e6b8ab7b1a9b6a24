"""The allocation fingerprint: NCCL's INFO lines parsed, the id stable and sensitive to
what changes timings only, the differences named."""

from __future__ import annotations

import os

from ddp_lab.measure import fingerprint as fpm

# INFO lines as NCCL 2.18-2.21 write them (NCCL_DEBUG=INFO, NCCL_DEBUG_FILE): two nodes of
# two GPUs on InfiniBand, and a node without RDMA that falls back to sockets
IB_TWO_NODES = """\
gpu-a:21012:21012 [0] NCCL INFO Bootstrap : Using ib0:10.1.0.11<0>
gpu-a:21012:21012 [0] NCCL INFO NET/Plugin : dlerror=libnccl-net.so: cannot open shared object file: No such file or directory No plugin found (libnccl-net.so), using internal implementation
gpu-a:21012:21012 [0] NCCL INFO cudaDriverVersion 12040
NCCL version 2.20.5+cuda12.4
gpu-a:21012:21090 [0] NCCL INFO NCCL_IB_HCA set by environment to mlx5_0
gpu-a:21012:21090 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ; OOB ib0:10.1.0.11<0>
gpu-a:21012:21090 [0] NCCL INFO Using non-device net plugin version 0
gpu-a:21012:21090 [0] NCCL INFO Using network IB
gpu-a:21012:21090 [0] NCCL INFO comm 0x55e4b3c0 rank 0 nranks 4 cudaDev 0 nvmlDev 0 busId 18000 commId 0x8c1f2b7e6f2a1d3b - Init START
gpu-a:21012:21090 [0] NCCL INFO Channel 00/02 :    0   1   2   3
gpu-a:21012:21090 [0] NCCL INFO Channel 00/0 : 3[1] -> 0[0] [receive] via NET/IB/0/GDRDMA
gpu-a:21012:21090 [0] NCCL INFO Channel 01/0 : 3[1] -> 0[0] [receive] via NET/IB/0/GDRDMA
gpu-a:21012:21090 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read
gpu-a:21012:21090 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] via P2P/CUMEM/read
gpu-a:21012:21090 [0] NCCL INFO Connected all rings
gpu-a:21012:21090 [0] NCCL INFO comm 0x55e4b3c0 rank 0 nranks 4 cudaDev 0 nvmlDev 0 busId 18000 commId 0x8c1f2b7e6f2a1d3b - Init COMPLETE
"""
SOCKET_SHM = """\
node7:3301:3301 [0] NCCL INFO Bootstrap : Using eth0:192.168.5.7<0>
node7:3301:3355 [0] NCCL INFO NET/IB : No device found.
node7:3301:3355 [0] NCCL INFO NET/Socket : Using [0]eth0:192.168.5.7<0>
node7:3301:3355 [0] NCCL INFO Using network Socket
node7:3301:3355 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] via SHM/direct/direct
node7:3301:3355 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/Socket/0
node7:3301:3355 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0
"""
ONE_RANK = """\
h100:900:900 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.2<0>
h100:900:920 [0] NCCL INFO Using network Socket
h100:900:920 [0] NCCL INFO comm 0x1 rank 0 nranks 1 cudaDev 0 nvmlDev 0 busId 1000 commId 0x2 - Init COMPLETE
"""


# Alps (GH200, Slingshot) through the aws-ofi-nccl plugin: the network's name has a space
SLINGSHOT = """\
nid001:5501:5601 [0] NCCL INFO NET/OFI Selected provider is cxi, fabric is cxi (found 4 nics)
nid001:5501:5601 [0] NCCL INFO Using network AWS Libfabric
nid001:5501:5601 [0] NCCL INFO Channel 00/0 : 3[3] -> 4[0] [send] via NET/AWS Libfabric/0/GDRDMA
"""


def test_parse_nccl_info_lines():
    ib = fpm.parse_nccl_info(IB_TWO_NODES.splitlines())
    assert ib == {"network": "IB", "net_devices": "[0]mlx5_0:1/IB ; OOB ib0:10.1.0.11<0>",
                  "connections": {"NET/IB": 2, "P2P": 2}}
    sock = fpm.parse_nccl_info(SOCKET_SHM.splitlines())
    assert sock["network"] == "Socket" and sock["connections"] == {"NET/Socket": 2, "SHM": 1}
    one = fpm.parse_nccl_info(ONE_RANK.splitlines())
    assert one["connections"] == {} and one["network"] == "Socket"
    assert fpm.transport_label([ib, sock]) == "NET/IB+NET/Socket+P2P+SHM"
    assert fpm.transport_label([ib]) == "NET/IB+P2P"
    assert fpm.transport_label([one]) == "none (network Socket)"
    assert fpm.transport_label([None]) is None
    assert fpm.parse_nccl_info(SLINGSHOT.splitlines())["network"] == "AWS Libfabric"


def test_nccl_debug_file_read_back(tmp_path):
    env = {}
    assert fpm.enable_nccl_debug(tmp_path, env)
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_FILE"].endswith("logs/nccl.%h.%p.log")
    # NCCL expands %h and %p itself: this process's file, not another pid's
    (tmp_path / "logs" / "nccl.gpu-a.4242.log").write_text(IB_TWO_NODES)
    (tmp_path / "logs" / "nccl.gpu-a.4243.log").write_text(SOCKET_SHM)
    assert fpm.read_nccl_transport(tmp_path, pid=4242)["network"] == "IB"
    assert fpm.read_nccl_transport(tmp_path, pid=1) is None
    user = {"NCCL_DEBUG": "WARN"}
    assert not fpm.enable_nccl_debug(tmp_path, user) and user == {"NCCL_DEBUG": "WARN"}


def _fp(**over):
    fp = fpm.collect("gloo", "cpu", ["h1"], "local", 1, 2,
                     environ={"OMP_NUM_THREADS": "1", "PATH": "/bin",
                              "NCCL_DEBUG_FILE": "/run/a/logs/nccl.%h.%p.log"})
    fp.update(over)
    return fp


def test_fingerprint_fields_and_id():
    fp = _fp()
    for key in ("hosts", "cpu", "cpu_count", "gpu", "torch", "cuda", "nccl", "gloo", "backend", "device",
                "nccl_transport", "env", "python", "launcher", "nodes", "nproc_per_node"):
        assert key in fp, key
    assert fp["gloo"] is True and fp["gpu"] is None and fp["backend"] == "gloo"
    assert fp["env"] == {"NCCL_DEBUG_FILE": "/run/a/logs/nccl.%h.%p.log", "OMP_NUM_THREADS": "1"}
    assert fp["cpu"] and fp["cpu"] != "?" and fp["cpu_count"] >= 1
    fid = fpm.fingerprint_id(fp)
    assert len(fid) == 10 and fid == fpm.fingerprint_id(_fp())
    # the run's own log path, the launcher and the layout do not change the id ...
    assert fpm.fingerprint_id(_fp(env={**fp["env"], "NCCL_DEBUG_FILE": "/b"}, launcher="slurm",
                                  nodes=2, nproc_per_node=1, python="3.99")) == fid
    # ... nor the run's shape (hosts, the P2P/SHM/NET mix a shape makes: a study's points
    # in one allocation share it) ...
    assert fpm.fingerprint_id(_fp(hosts=["h1", "h2"], nccl_transport="NET/IB+P2P")) == fid
    # ... the CPU, NCCL's network, the env and the versions do
    for over in ({"cpu": "other"}, {"nccl_detail": [{"network": "IB"}, None]},
                 {"env": {"OMP_NUM_THREADS": "4"}}, {"torch": "0.0"}):
        assert fpm.fingerprint_id(_fp(**over)) != fid, over
    diff = fpm.differences(fp, _fp(cpu="other", env={"OMP_NUM_THREADS": "4"}))
    assert diff == [f"cpu: {fp['cpu']} vs other", "env OMP_NUM_THREADS: 1 vs 4"]


def test_cpu_model_from_cpuinfo(tmp_path):
    (tmp_path / "cpuinfo").write_text("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n")
    assert fpm.cpu_model(str(tmp_path / "cpuinfo")) == "Intel(R) Xeon(R) Platinum 8480+"
    assert fpm.cpu_model(str(tmp_path / "missing")) != ""
    assert os.path.exists("/proc/cpuinfo")
