"""launcher=mpirun for real: Open MPI starts 3 ranks on localhost to a complete run; an
unreachable master fails within dist.init_timeout_s instead of hanging; a host mpirun cannot
reach over ssh is one line on the console; torch's c10d hostname warnings are one line."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from helpers import PY, QUICK, child_env, describe, run_cli, run_dir_of, summary

from ddp_lab.world import ports
from ddp_lab.folder import heartbeat

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
    # each rank ended at the bound, its start to its end (torch alone: 2 connects + a backoff),
    # or was ended by mpirun the moment another rank failed, still starting (then the rank
    # that failed wrote the line above)
    records = heartbeat.read_all(run_dir)
    assert any(rec["state"] == "failed" for rec in records), records
    for rec in records:
        if rec["state"] != "failed":
            assert rec["state"] == "starting" and rec["process"] == "dead", rec
            continue
        assert rec["message"] == line[:heartbeat.MESSAGE_MAX], rec  # ASCII: bytes = chars
        assert rec["updated"] - rec["started"] < 10 + 4, rec


# -------------------------------------------------- a host mpirun cannot reach: one line
def failed_start(tmp_path, *overrides: str):
    """A run whose mpirun cannot start its daemon on a host: its exit status, the lines of
    its stderr, its run folder."""
    proc = run_cli("launcher=mpirun", *overrides, *QUICK, f"run.root={tmp_path / 'runs'}",
                   f"data.root={tmp_path / 'data'}", cwd=tmp_path, timeout=120)
    assert proc.returncode != 0, describe(proc)
    assert "ORTE" not in proc.stdout + proc.stderr, describe(proc)  # Open MPI's block: its log
    return [ln for ln in proc.stderr.splitlines() if ln.strip()], run_dir_of(proc)


def test_mpirun_unreachable_host_is_one_line(tmp_path):
    err, run_dir = failed_start(tmp_path, "launcher.hosts=[unreachable-host-xyz:1,localhost:1]")
    assert len(err) == 1, err
    line = err[0]
    assert line.startswith("[ddp_lab] mpirun could not start its daemon on unreachable-host-xyz "
                           "over ssh (ssh: Could not resolve hostname unreachable-host-xyz"), line
    for fix in ("passwordless ssh", "launcher.extra_args=[--mca,plm_rsh_args,", "docs/launchers.md",
                str(run_dir / "logs" / "mpirun.log")):
        assert fix in line, fix
    log = (run_dir / "logs" / "mpirun.log").read_text()
    assert "ORTE was unable to reliably start one or more daemons" in log
    assert "ssh: Could not resolve hostname unreachable-host-xyz" in log
    assert summary(run_dir)["status"].startswith(
        "failed: mpirun could not start its daemon on unreachable-host-xyz over ssh")


def test_mpirun_ssh_options_reach_ssh(tmp_path):
    # docs/launchers.md's way to give ssh its options; a config file that is not there makes
    # ssh say so: the options reached it. 127.0.0.2 is not this machine for Open MPI (no
    # interface has that address), so mpirun goes through ssh to it.
    missing = tmp_path / "no_ssh_config"
    err, run_dir = failed_start(tmp_path, "launcher.hosts=[127.0.0.2:1,localhost:1]",
                                f'launcher.extra_args=[--mca,plm_rsh_args,"-F {missing}"]')
    assert len(err) == 1, err
    assert err[0].startswith("[ddp_lab] mpirun could not start its daemon on 127.0.0.2 over ssh "
                             f"(Can't open user config file {missing}"), err


@pytest.mark.netlab
def test_c10d_hostname_warnings_explained_once(tmp_path, netlab_factory):
    # in a lab node no DNS server answers: torch's store cannot name a peer by its lab
    # address (getnameinfo: EAI_AGAIN, err=-3) and every rank warns once; the console gets
    # one line that says why, the warnings themselves go to logs/mpirun.log
    node = netlab_factory(nodes=1, link="none").nodes[0]
    proc = subprocess.run(
        node.cmd(["env", f"MASTER_ADDR={node.addr}", PY, "-m", "ddp_lab", "launcher=mpirun",
                  "launcher.hosts=[localhost:2]", *QUICK, f"run.root={tmp_path / 'runs'}",
                  f"data.root={tmp_path / 'data'}"]),
        cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=240,
        stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, describe(proc)
    run_dir = run_dir_of(proc)
    warned = (run_dir / "logs" / "mpirun.log").read_text().count(
        "[c10d] The hostname of the client socket cannot be retrieved")
    assert warned >= 1, describe(proc)  # what the lab shows: else this test proves nothing
    assert "[c10d]" not in proc.stdout and proc.stderr.count("[c10d]") == 1, describe(proc)
    assert "no DNS server names the lab's addresses" in proc.stderr


def test_open_mpis_setpgid_race_goes_to_the_log_only(tmp_path):
    """Open MPI's rsh starter warns when its ssh child refuses setpgid (seen in CI beside the
    one line about ssh): its log gets the line, the console nothing."""
    import io

    from ddp_lab.launch.mpirun import MpirunStderr

    out = io.StringIO()
    errors = MpirunStderr(tmp_path / "mpirun.log", ["127.0.0.2"], out=out)
    line = ("[vm:07068] plm:rsh: Warning: setpgid(7073,7073) failed in parent with "
            "errno=Permission denied(13)")
    errors.feed(line + "\n")
    errors.feed("another line of Open MPI's\n")
    assert out.getvalue() == "another line of Open MPI's\n"
    assert line in (tmp_path / "mpirun.log").read_text()
