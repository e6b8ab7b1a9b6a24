"""The allocation fingerprint: NCCL's INFO lines parsed, the id stable and sensitive to
what changes timings only, the differences named."""

from __future__ import annotations

import os

from ddp_lab.world import fingerprint as fpm

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
                "nccl_transport", "env", "link", "python", "launcher", "nodes", "nproc_per_node"):
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


# what `tc -j qdisc show dev eth0` and `ip -j addr show` print in a netlab node
TBF_200MBIT = [{"kind": "tbf", "handle": "8137:", "root": True, "refcnt": 3,
                "options": {"rate": 25000000, "burst": 250000, "lat": 50000}}]
UNSHAPED = [{"kind": "pfifo_fast", "handle": "0:", "root": True, "options": {"bands": 3}}]
ADDRS = [{"ifname": "lo", "addr_info": [{"family": "inet", "local": "127.0.0.1"}]},
         {"ifname": "eth0", "addr_info": [{"family": "inet", "local": "198.18.0.2"}]}]


def test_link_rate_from_tc_and_the_interface_from_its_address():
    assert fpm.root_tbf(TBF_200MBIT) == {"rate": 25000000, "burst": 250000, "lat": 50000}
    assert fpm.root_tbf(UNSHAPED) == {} and fpm.root_tbf(None) == {}
    assert fpm.iface_with_address(ADDRS, "198.18.0.2") == "eth0"
    assert fpm.iface_with_address(ADDRS, "10.0.0.1") is None
    assert fpm.chosen_iface({"GLOO_SOCKET_IFNAME": "ib0,eth0"}) == "ib0"
    assert fpm.chosen_iface({"NCCL_SOCKET_IFNAME": "=eth1"}) == "eth1"
    assert fpm.chosen_iface({"NCCL_SOCKET_IFNAME": "^lo,docker"}) is None


def test_sysfs_speed_only_where_sysfs_shows_this_namespace(tmp_path):
    eth0 = tmp_path / "eth0"
    eth0.mkdir()
    (eth0 / "address").write_text("92:a5:c5:b4:b9:34\n")
    (eth0 / "speed").write_text("10000\n")
    assert fpm.sysfs_speed("eth0", "92:a5:c5:b4:b9:34", str(tmp_path)) == 10000
    # another namespace's eth0 (nsenter --net keeps the machine's /sys), or no MAC known
    assert fpm.sysfs_speed("eth0", "02:00:00:00:00:01", str(tmp_path)) is None
    assert fpm.sysfs_speed("eth0", None, str(tmp_path)) is None
    (eth0 / "speed").write_text("-1\n")  # a virtual link without a speed
    assert fpm.sysfs_speed("eth0", "92:a5:c5:b4:b9:34", str(tmp_path)) is None
    assert fpm.sysfs_speed("missing", "92:a5:c5:b4:b9:34", str(tmp_path)) is None


def test_the_link_rate_is_part_of_the_id():
    fast = {"iface": "eth0", "speed_mbit": 10000, "shaped_Bps": 25e6}
    slow = dict(fast, shaped_Bps=6.25e6)
    assert fpm.link_label(fast) == "tbf 25 MB/s" and fpm.link_label(slow) == "tbf 6.25 MB/s"
    assert fpm.link_label(dict(fast, shaped_Bps=None)) == "10000 Mbit/s"
    assert fpm.link_label({"iface": "eth0", "speed_mbit": None, "shaped_Bps": None}) is None
    a, b = _fp(link=fast), _fp(link=slow)
    assert fpm.fingerprint_id(a) != fpm.fingerprint_id(b)
    assert fpm.differences(a, b) == ["link: tbf 25 MB/s vs tbf 6.25 MB/s"]
    # an unknown link (and a fingerprint written before links were) keeps the old id
    old = _fp()
    del old["link"]
    assert fpm.fingerprint_id(old) == fpm.fingerprint_id(_fp(link=None)) == fpm.fingerprint_id(
        _fp(link={"iface": "eth0", "speed_mbit": None, "shaped_Bps": None}))
    assert fpm.fingerprint_id(old) != fpm.fingerprint_id(a)
