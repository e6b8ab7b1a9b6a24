"""launcher=mpirun for real: Open MPI starts 3 ranks on localhost to a complete run; an
unreachable master fails within dist.init_timeout_s instead of hanging."""

from __future__ import annotations

import shutil

import pytest
from helpers import QUICK, describe, run_cli, run_dir_of, summary

from ddp_lab.launch import ports
from ddp_lab.run import progress

pytestmark = [pytest.mark.mpi, pytest.mark.dist, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("mpirun") is None,
                                 reason="mpirun not installed (scripts/install_system_deps.sh)")]


def test_mpirun_three_ranks_on_localhost(tmp_path):
    # the notebook's hostfile form (max_slots), fewer ranks than slots (its `-np`)
    hostfile = tmp_path / "hosts"
    hostfile.write_text("localhost max_slots = 4\n")
    proc = run_cli("launcher=mpirun", f"launcher.hostfile={hostfile}", "launcher.np=3", *QUICK,
                   f"run.root={tmp_path / 'runs'}", f"data.root={tmp_path / 'data'}",
                   cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, describe(proc)
    run_dir = run_dir_of(proc)
    s = summary(run_dir)
    assert s["status"] == "completed" and s["launcher"] == "mpirun", s
    assert s["world_size"] == 3 and s["env_source"] == "mpi" and s["node_ranks"] == [0]
    assert s["nproc_per_node"] == 3 and 0 < s["test_accuracy"] <= 1
    assert sorted(p.name for p in (run_dir / "logs").glob("rank*.log")) == [
        "rank0.log", "rank1.log", "rank2.log"]
    assert (run_dir / "hostfile").read_text() == "localhost slots=3\n"


def test_mpirun_unreachable_master_fails_in_bounded_time(tmp_path):
    # 192.0.2.1 is TEST-NET-1 (RFC 5737): never routed, so the connect can only time out
    # (launcher.master_addr=192.0.2.1 is refused before the start: not the first host; the
    # script's MASTER_ADDR knob is what a firewall between the hosts amounts to)
    proc = run_cli("launcher=mpirun", "launcher.hosts=[localhost:2]", "dist.init_timeout_s=10",
                   *QUICK, f"run.root={tmp_path / 'runs'}", f"data.root={tmp_path / 'data'}",
                   cwd=tmp_path, timeout=240, env={"MASTER_ADDR": "192.0.2.1"})
    assert proc.returncode != 0, describe(proc)
    run_dir = run_dir_of(proc)
    port = int((run_dir / "launch.sh").read_text().split("MASTER_PORT:-")[1].split("}")[0])
    line = ports.no_answer("192.0.2.1", port, 10)
    assert summary(run_dir)["status"] == f"failed: {line}", describe(proc)
    assert proc.stdout.splitlines()[-2].startswith(f"job failed with exit status 1: {line}")
    # each rank ended at the bound, its start to its end (torch alone: 2 connects + a backoff)
    for rec in progress.read_all(run_dir):
        assert rec["state"] == "failed" and rec["message"] == line[:255], rec
        assert rec["updated"] - rec["started"] < 10 + 4, rec
