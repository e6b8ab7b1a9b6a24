"""The loopback SLURM cluster takes its ports from its caller: a busy default port (16817)
or a second cluster on the same machine (another test session) does not get in the way."""

from __future__ import annotations

import errno
import socket
import subprocess
from pathlib import Path

import pytest
from slurm_fixture import CLUSTER_SCRIPT, start_cluster, stop_cluster, submit_and_wait

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

DEFAULT_CTLD_PORT = 16817  # the script's default: what a fixed-port fixture used to take


@pytest.fixture
def busy_default_port():
    """Something listens on 16817 for the test (or already did: busy either way)."""
    sock = socket.socket()
    try:
        sock.bind(("0.0.0.0", DEFAULT_CTLD_PORT))
        sock.listen()
    except OSError as e:
        assert e.errno == errno.EADDRINUSE, e
    yield DEFAULT_CTLD_PORT
    sock.close()


def hostname_job(cluster, workdir: Path) -> set[str]:
    job = submit_and_wait(cluster, "#!/bin/bash\nsrun printenv SLURMD_NODENAME\n", workdir,
                          sbatch_args=["--nodes=2", "--ntasks-per-node=1"], timeout=120)
    assert job.state == "COMPLETED" and job.exit_code == "0:0", job.describe()
    return set(job.output.split())


def daemon_pids(state_dir: Path) -> list[int]:
    return [int(p.read_text()) for p in (state_dir / "run").glob("*.pid")]


def alive(pid: int) -> bool:
    """Running, not a zombie (PID 1 here reaps a moment late)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_busy_port_is_refused_with_the_knob_to_turn(busy_default_port, tmp_path):
    res = subprocess.run(["bash", str(CLUSTER_SCRIPT), "up", str(tmp_path / "c")],
                         env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                              "SLURM_CLUSTER_CTLD_PORT": str(busy_default_port)},
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 1 and res.stdout == "", res.stderr
    assert f"port {busy_default_port} already in use" in res.stderr
    assert "SLURM_CLUSTER_CTLD_PORT" in res.stderr
    assert not (tmp_path / "c").exists()  # refused before touching anything


def test_a_second_cluster_beside_the_session_one_with_16817_busy(slurm_cluster, busy_default_port,
                                                                  tmp_path, tmp_path_factory):
    """The session's cluster and a second one, started by the same function while 16817 is
    taken, run jobs side by side on the shared node names and munged; stopping the second
    leaves none of its processes and does not disturb the first."""
    # a short state path: slurmstepd's unix sockets live under it (107 bytes at most)
    second = start_cluster(tmp_path_factory.mktemp("slurm-second") / "c")
    try:
        assert second.started_here and busy_default_port not in second.ports
        if slurm_cluster.ports:  # None when reused from $SLURM_CLUSTER_STATE_DIR
            assert busy_default_port not in slurm_cluster.ports
            assert not set(second.ports) & set(slurm_cluster.ports)
        assert second.conf != slurm_cluster.conf
        assert hostname_job(second, tmp_path / "job2") == {"node1", "node2"}
        assert hostname_job(slurm_cluster, tmp_path / "job1") == {"node1", "node2"}
        pids = daemon_pids(second.state_dir)
        assert len(pids) == 3 and all(alive(p) for p in pids)  # slurmctld, 2 slurmd
    finally:
        stop_cluster(second)
    assert not any(alive(p) for p in pids)
    assert not second.state_dir.exists()
    for port in second.ports:  # nothing of it listens any more
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0
    # munged is shared: the session's cluster still authenticates and runs jobs
    assert hostname_job(slurm_cluster, tmp_path / "job3") == {"node1", "node2"}

