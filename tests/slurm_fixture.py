"""Session-scoped pytest fixture for a real 2-node SLURM cluster on loopback.

Usage from any test module::

    from slurm_fixture import slurm_cluster, submit_and_wait   # noqa: F401  (tests/ on sys.path)
    # or, if tests/ is a package:  from tests.slurm_fixture import slurm_cluster, submit_and_wait

    @pytest.mark.cluster
    def test_x(slurm_cluster, tmp_path):
        job = submit_and_wait(slurm_cluster, "#!/bin/bash\\nsrun hostname\\n",
                              tmp_path, sbatch_args=["--nodes=2"], timeout=120)
        assert job.state == "COMPLETED", job.describe()

The fixture runs ``scripts/slurm_cluster.sh up <state_dir>`` once per session and
``down`` at teardown.  It yields a :class:`SlurmCluster` with ``env`` (a copy of
``os.environ`` with ``SLURM_CONF`` set: pass it to every subprocess that calls a slurm
command) and ``state_dir``.  ``os.environ`` itself is not modified.

* state dir: ``$SLURM_CLUSTER_STATE_DIR`` or ``<repo>/.slurm-cluster`` (git-ignored).
* if a cluster was already up there before the session, it is reused and left up.
* skipped (with a reason) only when ``sbatch`` is not installed; any other failure to
  bring the cluster up is an error, not a skip.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Mapping, Sequence

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
CLUSTER_SCRIPT = REPO_ROOT / "scripts" / "slurm_cluster.sh"
UP_TIMEOUT_S = 120  # the script itself gives up after 60 s of waiting for idle nodes
DOWN_TIMEOUT_S = 90


@dataclasses.dataclass
class SlurmCluster:
    env: dict
    state_dir: Path
    conf: Path
    up_seconds: float
    started_here: bool

    def __getitem__(self, key):  # allow dict-style access: cluster["env"]
        return getattr(self, key)

    def run(self, *args: str, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
        """Run a slurm client command (sinfo, squeue, scontrol ...) against this cluster."""
        return subprocess.run(list(args), env=self.env, capture_output=True, text=True,
                              timeout=timeout, check=check)


@dataclasses.dataclass
class SlurmJob:
    job_id: str
    state: str
    exit_code: str
    output: str
    elapsed_s: float
    timed_out: bool

    def describe(self) -> str:
        return (f"job {self.job_id}: state={self.state} exit={self.exit_code} "
                f"elapsed={self.elapsed_s:.1f}s timed_out={self.timed_out}\n--- output ---\n"
                f"{self.output}")


def _cluster_cmd(cmd: str, state_dir: Path, env: Mapping[str, str], timeout: float):
    return subprocess.run(["bash", str(CLUSTER_SCRIPT), cmd, str(state_dir)],
                          env=dict(env), capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def start_cluster(state_dir: Path | None = None) -> SlurmCluster:
    """Bring the cluster up (idempotent); raises RuntimeError on failure."""
    if state_dir is None:
        state_dir = Path(os.environ.get("SLURM_CLUSTER_STATE_DIR") or REPO_ROOT / ".slurm-cluster")
    state_dir = Path(state_dir).resolve()
    env = dict(os.environ)
    env.pop("SLURM_CONF", None)
    was_up = _cluster_cmd("status", state_dir, env, 30).returncode == 0
    t0 = time.monotonic()
    try:
        res = _cluster_cmd("up", state_dir, env, UP_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        _cluster_cmd("down", state_dir, env, DOWN_TIMEOUT_S)
        raise RuntimeError(f"slurm_cluster.sh up did not finish in {UP_TIMEOUT_S} s: {e}") from e
    up_s = time.monotonic() - t0
    if res.returncode != 0:
        raise RuntimeError(f"slurm_cluster.sh up failed (rc={res.returncode}):\n"
                           f"{res.stdout}\n{res.stderr}")
    conf = None
    for line in res.stdout.splitlines():
        if line.startswith("export SLURM_CONF="):
            conf = line.split("=", 1)[1].strip()
    if not conf:
        raise RuntimeError(f"slurm_cluster.sh up printed no SLURM_CONF:\n{res.stdout}\n{res.stderr}")
    env["SLURM_CONF"] = conf
    return SlurmCluster(env=env, state_dir=state_dir, conf=Path(conf), up_seconds=up_s,
                        started_here=not was_up)


def stop_cluster(cluster: SlurmCluster) -> None:
    env = {k: v for k, v in cluster.env.items() if k != "SLURM_CONF"}
    res = _cluster_cmd("down", cluster.state_dir, env, DOWN_TIMEOUT_S)
    if res.returncode != 0:
        raise RuntimeError(f"slurm_cluster.sh down failed:\n{res.stdout}\n{res.stderr}")


@pytest.fixture(scope="session")
def slurm_cluster():
    if shutil.which("sbatch") is None:
        pytest.skip("sbatch not installed (run scripts/install_system_deps.sh): "
                    "no SLURM cluster tests")
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        if cluster.started_here:
            stop_cluster(cluster)


def _job_state(cluster: SlurmCluster, job_id: str) -> tuple[str, str]:
    """(JobState, ExitCode) from scontrol (kept MinJobAge=300 s after the end)."""
    try:
        res = cluster.run("scontrol", "show", "job", "-o", job_id, timeout=15, check=False)
    except subprocess.TimeoutExpired:
        return "UNKNOWN", ""
    fields = dict(tok.split("=", 1) for tok in res.stdout.split() if "=" in tok)
    return fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", "")


TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
            "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def submit_and_wait(cluster: SlurmCluster, script: str, workdir: Path,
                    sbatch_args: Sequence[str] = (), timeout: float = 180,
                    extra_env: Mapping[str, str] | None = None) -> SlurmJob:
    """Write *script* to workdir, ``sbatch --parsable`` it, poll until it ends.

    On timeout the job is ``scancel``-ed and returned with ``timed_out=True``.
    The job's stdout+stderr (``--output``) is returned in ``output``.
    """
    workdir = Path(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    script_path = workdir / "job.sbatch"
    script_path.write_text(script)
    out_path = workdir / "slurm-%j.out"
    env = dict(cluster.env)
    if extra_env:
        env.update(extra_env)
    cmd = ["sbatch", "--parsable", f"--chdir={workdir}", f"--output={out_path}",
           *sbatch_args, str(script_path)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise RuntimeError(f"sbatch failed: {res.stderr}")
    job_id = res.stdout.strip().split(";")[0]
    t0 = time.monotonic()
    state, exit_code, timed_out = "PENDING", "", False
    while True:
        state, exit_code = _job_state(cluster, job_id)
        if state in TERMINAL:
            break
        if time.monotonic() - t0 > timeout:
            timed_out = True
            cluster.run("scancel", job_id, timeout=15, check=False)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                state, exit_code = _job_state(cluster, job_id)
                if state in TERMINAL:
                    break
                time.sleep(0.5)
            break
        time.sleep(0.5)
    elapsed = time.monotonic() - t0
    out_file = workdir / f"slurm-{job_id}.out"
    # the output file is written by slurmd; give it a moment to be flushed
    for _ in range(10):
        if out_file.exists():
            break
        time.sleep(0.2)
    output = out_file.read_text(errors="replace") if out_file.exists() else "<no output file>"
    return SlurmJob(job_id=job_id, state=state, exit_code=exit_code, output=output,
                    elapsed_s=elapsed, timed_out=timed_out)
