"""ddp_lab.nccl_env on fake sysfs trees (no RDMA hardware needed)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, child_env, run_cli

from ddp_lab.nccl_env import _hca_matches, main, network_kind, nccl_rdma_env, scan
from ddp_lab import nccl_env

ZERO = "0000:0000:0000:0000:0000:0000:0000:0000"
LL6 = "fe80:0000:0000:0000:0a5e:45ff:fe3c:1a2b"  # link-local IPv6
G6 = "fd00:0000:0000:0000:0000:0000:0a00:0005"  # global IPv6


def v4(last: str = "0a00:0001") -> str:
    return "0000:0000:0000:0000:0000:ffff:" + last


UNREADABLE = object()  # make the file a directory: reading raises IsADirectoryError


def make_device(root: Path, name: str, ports: dict, link_layer: str | None = "Ethernet"):
    """ports: {port: {index: (gid, type)}}; gid/type may be UNREADABLE or bytes."""
    dev = root / "class" / "infiniband" / name
    for port, gids in ports.items():
        pdir = dev / "ports" / str(port)
        (pdir / "gids").mkdir(parents=True, exist_ok=True)
        (pdir / "gid_attrs" / "types").mkdir(parents=True, exist_ok=True)
        if link_layer is not None:
            (pdir / "link_layer").write_text(link_layer + "\n")
        for idx, (gid, gtype) in gids.items():
            for path, content in ((pdir / "gids" / str(idx), gid),
                                  (pdir / "gid_attrs" / "types" / str(idx), gtype)):
                if content is None:
                    continue
                if content is UNREADABLE:
                    path.mkdir()
                elif isinstance(content, bytes):
                    path.write_bytes(content)
                else:
                    path.write_text(content + "\n")
    return dev


def runai_port() -> dict:
    """Typical mlx5 RoCE port: v1/v2 pairs for link-local, IPv4 and IPv6, unused slots."""
    return {
        0: (LL6, "IB/RoCE v1"),
        1: (LL6, "RoCE v2"),
        2: (v4(), "IB/RoCE v1"),
        3: (v4(), "RoCE v2"),
        4: (G6, "IB/RoCE v1"),
        5: (G6, "RoCE v2"),
        6: (ZERO, UNREADABLE),  # unused: real sysfs gives EINVAL on the type file
        7: (ZERO, None),
    }


def joined(warnings) -> str:
    return "\n".join(warnings)


# ----------------------------------------------------------------------------- library
def test_no_device_dir(tmp_path):
    env, warnings = nccl_rdma_env(tmp_path)
    assert env == {"NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "8"}
    msg = joined(warnings)
    assert f"no RDMA device under {tmp_path}/class/infiniband" in msg
    assert "RDMA off, NCCL falls back to sockets" in msg


def test_empty_infiniband_dir(tmp_path):
    (tmp_path / "class" / "infiniband").mkdir(parents=True)
    env, warnings = nccl_rdma_env(tmp_path)
    assert "NCCL_IB_GID_INDEX" not in env and "NCCL_IB_HCA" not in env
    assert "no RDMA device" in joined(warnings)


def test_sysfs_root_missing_entirely(tmp_path):
    env, warnings = nccl_rdma_env(tmp_path / "does-not-exist")
    assert "NCCL_IB_GID_INDEX" not in env
    assert "no RDMA device" in joined(warnings)


def test_runai_single_device(tmp_path):
    make_device(tmp_path, "mlx5_bond_0", {1: runai_port()})
    res = nccl_rdma_env(tmp_path)
    assert res.env == {"NCCL_IB_GID_INDEX": "3", "NCCL_IB_HCA": "mlx5_bond_0",
                       "NCCL_SOCKET_NTHREADS": "4", "NCCL_NSOCKS_PERTHREAD": "8"}
    assert res.warnings == []  # unused slots with unreadable types are normal
    assert res.chosen.device == "mlx5_bond_0" and res.chosen.port == 1
    assert any("NCCL_IB_GID_INDEX=3" in i for i in res.info)


def test_type_compare_is_case_insensitive_and_stripped(tmp_path):
    make_device(tmp_path, "mlx5_0", {1: {0: (v4(), "IB/RoCE v1"), 1: (v4(), "  roce V2 \t")}})
    env, _ = nccl_rdma_env(tmp_path)
    assert env["NCCL_IB_GID_INDEX"] == "1"


def test_gid_case_and_nul_padding(tmp_path):
    make_device(tmp_path, "mlx5_0", {1: {4: (b"0000:0000:0000:0000:0000:FFFF:0A00:0001\x00\n",
                                             b"RoCE v2\x00")}})
    env, warnings = nccl_rdma_env(tmp_path)
    assert env["NCCL_IB_GID_INDEX"] == "4", warnings


def test_several_ports_first_usable_port(tmp_path):
    make_device(tmp_path, "mlx5_0", {
        1: {0: (LL6, "RoCE v2"), 1: (G6, "RoCE v2")},  # IPv6 only on port 1
        2: {0: (LL6, "IB/RoCE v1"), 7: (v4(), "RoCE v2"), 9: (v4("0a00:0002"), "RoCE v2")},
        10: {2: (v4(), "RoCE v2")},  # numeric port order: 2 before 10
    })
    res = nccl_rdma_env(tmp_path)
    assert res.env["NCCL_IB_GID_INDEX"] == "7"
    assert (res.chosen.port, res.chosen.index) == (2, 7)
    assert res.env["NCCL_IB_HCA"] == "mlx5_0"


def test_numeric_index_order(tmp_path):
    make_device(tmp_path, "mlx5_0", {1: {10: (v4(), "RoCE v2"), 9: (v4(), "RoCE v2")}})
    assert nccl_rdma_env(tmp_path).env["NCCL_IB_GID_INDEX"] == "9"


def test_several_devices(tmp_path):
    make_device(tmp_path, "mlx5_0", {1: runai_port()})
    make_device(tmp_path, "mlx5_1", {1: runai_port()})
    make_device(tmp_path, "mlx5_2", {1: {0: (LL6, "RoCE v2"), 5: (v4(), "RoCE v2")}})
    make_device(tmp_path, "mlx5_3", {1: {0: (LL6, "RoCE v2"), 1: (G6, "RoCE v2")}})
    res = nccl_rdma_env(tmp_path)
    assert res.env["NCCL_IB_GID_INDEX"] == "3"
    assert res.env["NCCL_IB_HCA"] == "mlx5_0,mlx5_1"
    assert res.devices == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3"]
    msg = joined(res.warnings)
    assert "mlx5_2: usable RoCE v2 IPv4 GID only at index(es) [5], not 3" in msg
    assert "only IPv6 RoCE v2 GIDs on mlx5_3" in msg and "left out of NCCL_IB_HCA" in msg


def test_first_device_by_name_fixes_index(tmp_path):
    make_device(tmp_path, "mlx5_1", {1: {3: (v4(), "RoCE v2")}})
    make_device(tmp_path, "mlx5_0", {1: {5: (v4(), "RoCE v2")}})
    res = nccl_rdma_env(tmp_path)
    assert res.env["NCCL_IB_GID_INDEX"] == "5"
    assert res.env["NCCL_IB_HCA"] == "mlx5_0"


def test_ipv6_only(tmp_path):
    make_device(tmp_path, "mlx5_0", {1: {0: (LL6, "IB/RoCE v1"), 1: (LL6, "RoCE v2"),
                                         2: (G6, "IB/RoCE v1"), 3: (G6, "RoCE v2")}})
    env, warnings = nccl_rdma_env(tmp_path)
    assert "NCCL_IB_GID_INDEX" not in env and "NCCL_IB_HCA" not in env
    msg = joined(warnings)
    assert "only IPv6 RoCE v2 GIDs on mlx5_0 (indices [1, 3]); no IPv4-mapped GID" in msg
    assert "NCCL_IB_GID_INDEX not set" in msg


def test_roce_v1_only(tmp_path):
    make_device(tmp_path, "mlx5_0", {1: {0: (LL6, "IB/RoCE v1"), 2: (v4(), "IB/RoCE v1")}})
    env, warnings = nccl_rdma_env(tmp_path)
    assert "NCCL_IB_GID_INDEX" not in env
    msg = joined(warnings)
    assert "are not RoCE v2 (types: IB/RoCE v1): RoCE v1 only" in msg
    assert "NCCL_IB_GID_INDEX not set" in msg


def test_device_without_gids(tmp_path):
    (tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "gids").mkdir(parents=True)
    env, warnings = nccl_rdma_env(tmp_path)
    assert "NCCL_IB_GID_INDEX" not in env
    assert "no GID found on mlx5_0" in joined(warnings)


def test_device_without_ports_dir(tmp_path):
    (tmp_path / "class" / "infiniband" / "mlx5_0").mkdir(parents=True)
    env, warnings = nccl_rdma_env(tmp_path)
    assert "NCCL_IB_GID_INDEX" not in env
    assert "mlx5_0: no ports directory" in joined(warnings)


def test_unreadable_and_garbled_files(tmp_path):
    make_device(tmp_path, "mlx5_0", {1: {
        0: ("this is not a gid", "RoCE v2"),                   # garbled GID
        1: (b"\xff\xfe\x00garbage", "RoCE v2"),                # not ASCII
        2: (UNREADABLE, "RoCE v2"),                            # unreadable GID
        3: (v4(), UNREADABLE),                                 # IPv4 GID, unreadable type
        4: (v4(), None),                                       # IPv4 GID, type missing
        5: (v4(), "RoCE v9 ???"),                              # garbled type
        6: (v4(), "RoCE v2"),                                  # the good one
    }})
    gids_dir = tmp_path / "class/infiniband/mlx5_0/ports/1/gids"
    (gids_dir / "README").write_text("junk")                   # non-numeric entry
    res = nccl_rdma_env(tmp_path)
    assert res.env["NCCL_IB_GID_INDEX"] == "6"
    assert res.env["NCCL_IB_HCA"] == "mlx5_0"
    msg = joined(res.warnings)
    assert "garbled GID 0" in msg
    assert "unreadable GID" in msg and "/gids/1" in msg and "/gids/2" in msg
    assert "IPv4 GID 3 has unreadable type" in msg
    assert "IPv4 GID 4 has unreadable type" in msg
    assert "non-numeric name" in msg


def test_all_garbled_no_crash(tmp_path):
    make_device(tmp_path, "mlx5_0", {1: {0: ("zzzz", "RoCE v2"), 1: (v4(), UNREADABLE)}})
    env, warnings = nccl_rdma_env(tmp_path)
    assert "NCCL_IB_GID_INDEX" not in env
    assert "no usable RDMA device: NCCL_IB_HCA not set" in joined(warnings)


def test_infiniband_link_layer(tmp_path):
    make_device(tmp_path, "mlx5_ib0", {1: {0: ("fe80:0000:0000:0000:0002:c903:00f1:2345",
                                               "IB/RoCE v1")}}, link_layer="InfiniBand")
    res = nccl_rdma_env(tmp_path)
    assert "NCCL_IB_GID_INDEX" not in res.env
    assert res.env["NCCL_IB_HCA"] == "mlx5_ib0"
    assert res.warnings == []
    assert any("InfiniBand link layer" in i for i in res.info)


def test_hca_override_restricts_detection(tmp_path):
    make_device(tmp_path, "mlx5_0", {1: {5: (v4(), "RoCE v2")}})
    make_device(tmp_path, "mlx5_bond_0", {1: runai_port()})
    res = nccl_rdma_env(tmp_path, hca="mlx5_bond")
    assert res.env["NCCL_IB_GID_INDEX"] == "3"
    assert res.env["NCCL_IB_HCA"] == "mlx5_bond"  # the override verbatim
    assert res.devices == ["mlx5_bond_0"]
    res = nccl_rdma_env(tmp_path, hca="mlx5")  # RunAI guide style prefix
    assert (res.env["NCCL_IB_GID_INDEX"], res.env["NCCL_IB_HCA"]) == ("5", "mlx5")


def test_hca_override_without_device_is_still_exported(tmp_path):
    env, warnings = nccl_rdma_env(tmp_path, hca="mlx5")
    assert env["NCCL_IB_HCA"] == "mlx5"
    assert "no RDMA device matching NCCL_IB_HCA='mlx5'" in joined(warnings)


def test_socket_defaults_configurable(tmp_path):
    env, _ = nccl_rdma_env(tmp_path, socket_nthreads=2, nsocks_perthread=None)
    assert env == {"NCCL_SOCKET_NTHREADS": "2"}
    env, warnings = nccl_rdma_env(tmp_path, socket_nthreads=16, nsocks_perthread=8)
    assert "caps the product at 64" in joined(warnings)


@pytest.mark.parametrize("name,spec,expected", [
    ("mlx5_0", None, True), ("mlx5_0", "mlx5", True), ("mlx5_10", "mlx5_1", True),
    ("mlx5_10", "=mlx5_1", False), ("mlx5_1", "=mlx5_0,mlx5_1", True),
    ("mlx5_0", "^mlx5_0", False), ("mlx5_1", "^mlx5_0", True), ("mlx5_0", "mlx5_0:1", True),
    ("bnxt_re0", "mlx5", False),
])
def test_hca_matches(name, spec, expected):
    assert _hca_matches(name, spec) is expected


def test_scan_records_everything(tmp_path):
    make_device(tmp_path, "mlx5_0", {1: runai_port()})
    sc = scan(tmp_path)
    port = sc.ports[0]
    assert port.link_layer == "Ethernet"
    assert [g.index for g in port.gids] == [0, 1, 2, 3, 4, 5]  # zero GIDs skipped
    assert [g.index for g in sc.usable()] == [3]


def test_main_in_process(tmp_path, capsys):
    make_device(tmp_path, "mlx5_0", {1: runai_port()})
    assert main(["--sysfs-root", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "export NCCL_IB_GID_INDEX=3\n" in out
    assert all(line.startswith("# ") for line in err.splitlines())


# ----------------------------------------------------------------------------- CLI
def run_nccl_env(*args):
    return run_cli(*args, cwd=REPO, module="ddp_lab.nccl_env", timeout=60)


def test_cli_export_format(tmp_path):
    make_device(tmp_path, "mlx5_0", {1: runai_port()})
    make_device(tmp_path, "mlx5_3", {1: {1: (G6, "RoCE v2")}})
    p = run_nccl_env("--sysfs-root", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == [
        "export NCCL_IB_GID_INDEX=3",
        "export NCCL_IB_HCA=mlx5_0",
        "export NCCL_SOCKET_NTHREADS=4",
        "export NCCL_NSOCKS_PERTHREAD=8",
    ]
    err = p.stderr.splitlines()
    assert err and all(line.startswith("# ") for line in err), p.stderr
    assert any(line.startswith("# WARNING: only IPv6") for line in err), p.stderr


def test_cli_json_format(tmp_path):
    make_device(tmp_path, "mlx5_0", {1: runai_port()})
    p = run_nccl_env("--sysfs-root", str(tmp_path), "--format", "json", "--socket-nthreads", "2")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["env"]["NCCL_IB_GID_INDEX"] == "3"
    assert data["env"]["NCCL_SOCKET_NTHREADS"] == "2"
    assert data["chosen"] == {"device": "mlx5_0", "port": 1, "index": 3, "gid": v4(),
                              "type": "RoCE v2"}


def test_cli_no_device_exit_0(tmp_path):
    p = run_nccl_env("--sysfs-root", str(tmp_path))
    assert p.returncode == 0
    assert "NCCL_IB_GID_INDEX" not in p.stdout
    assert "# WARNING: no RDMA device under" in p.stderr
    assert "RDMA off, NCCL falls back to sockets" in p.stderr


@pytest.mark.parametrize("args", [["--format", "yaml"], ["--bogus"], ["--socket-nthreads", "x"],
                                  ["--nsocks-perthread", "0"], ["--hca", ""]])
def test_cli_bad_args_exit_2(args):
    assert run_nccl_env(*args).returncode == 2


def test_cli_hca_repeatable(tmp_path):
    make_device(tmp_path, "mlx5_0", {1: runai_port()})
    make_device(tmp_path, "mlx5_1", {1: runai_port()})
    p = run_nccl_env("--sysfs-root", str(tmp_path), "--hca", "mlx5_0", "--hca", "mlx5_1")
    assert "export NCCL_IB_HCA=mlx5_0,mlx5_1" in p.stdout.splitlines()


def _eval_in_bash(sysfs: Path, extra: str = "") -> subprocess.CompletedProcess:
    env = child_env()
    env.pop("NCCL_IB_GID_INDEX", None)
    env.pop("NCCL_IB_HCA", None)
    script = (f'eval "$({sys.executable} -m ddp_lab.nccl_env --sysfs-root {sysfs} {extra})"; '
              'echo "GID=$NCCL_IB_GID_INDEX HCA=$NCCL_IB_HCA T=$NCCL_SOCKET_NTHREADS '
              'S=$NCCL_NSOCKS_PERTHREAD"')
    return subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                          timeout=60)


def test_eval_in_bash(tmp_path):
    make_device(tmp_path, "mlx5_bond_0", {1: runai_port()})
    p = _eval_in_bash(tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "GID=3 HCA=mlx5_bond_0 T=4 S=8"


def test_eval_in_bash_no_device(tmp_path):
    p = _eval_in_bash(tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "GID= HCA= T=4 S=8"
    assert "RDMA off" in p.stderr


def test_eval_is_safe_with_odd_hca(tmp_path):
    # a value with shell syntax must come out quoted: eval sets it, runs nothing
    p = _eval_in_bash(tmp_path, extra="--hca 'mlx5; echo PWNED'")
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines() == ["GID= HCA=mlx5; echo PWNED T=4 S=8"]


def test_slingshot_gets_cscss_settings(tmp_path, capsys):
    """CXI NICs under /sys/class/cxi: HPE Slingshot (CSCS Alps), NCCL through the
    aws-ofi-nccl plugin with CSCS's settings, each printed with its reason."""
    for nic in ("cxi0", "cxi1"):
        (tmp_path / "class" / "cxi" / nic).mkdir(parents=True)
    assert network_kind(tmp_path) == ("slingshot", ["cxi0", "cxi1"])
    assert nccl_env.main(["--sysfs-root", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "export NCCL_NET='AWS Libfabric'" in out and "export FI_MR_CACHE_MONITOR=userfaultfd" in out
    assert "# network: slingshot (cxi0, cxi1)" in err and "# NCCL_NET_GDR_LEVEL=PHB: " in err
    assert network_kind(tmp_path / "nothing") == ("sockets", [])
