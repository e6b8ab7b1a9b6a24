"""The loopback SLURM cluster of the tests (scripts/slurm_cluster.sh): start, stop, submit.

conftest.py's session fixture ``slurm_cluster`` starts one per test session through
:func:`start_cluster`, on free ports and in a state folder under pytest's tmp, so two test
sessions on one machine (or anything on the script's default port 16817) never collide::

    @pytest.mark.cluster
    def test_x(slurm_cluster, tmp_path):
        job = submit_and_wait(slurm_cluster, "#!/bin/bash\\nsrun hostname\\n",
                              tmp_path, sbatch_args=["--nodes=2"], timeout=120)
        assert job.state == "COMPLETED", job.describe()

A :class:`SlurmCluster` has ``env`` (a copy of ``os.environ`` with ``SLURM_CONF`` set: pass it
to every subprocess that calls a slurm command), ``state_dir``, ``conf`` and ``ports``;
``os.environ`` itself is not modified.

The session's cluster runs on a network lab when it can (:func:`session_cluster`): its two
slurmd in the namespaces of an unshaped 2-node lab (scripts/netlab.sh), so every job's
traffic between node1 and node2 crosses a real link; ``cluster.netlab`` is that lab (a
test may shape it for its own duration: :func:`shaped`). Without root or ip/tc, or with
``DDP_LAB_SLURM_LOOPBACK=1``, it runs on loopback as before (``cluster.netlab`` is None,
``cluster.loopback_why`` says why, and a warning too).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import subprocess
import time
import warnings
from pathlib import Path
from typing import Iterator, Mapping, Optional, Sequence

import pytest

from netlab_fixture import Lab, lab_down, lab_status, lab_up, unique_name
from netlab_fixture import skip_reason as netlab_skip_reason

from ddp_lab.world.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[1]
CLUSTER_SCRIPT = REPO_ROOT / "scripts" / "slurm_cluster.sh"
UP_TIMEOUT_S = 120  # the script itself gives up after 60 s of waiting for idle nodes
DOWN_TIMEOUT_S = 90
UP_TRIES = 3  # a free port can be taken between free_port() and the daemon's bind: new ports
LOOPBACK_ENV = "DDP_LAB_SLURM_LOOPBACK"  # =1: the session's cluster on loopback, no lab


@dataclasses.dataclass
class SlurmCluster:
    env: dict
    state_dir: Path
    conf: Path
    up_seconds: float
    started_here: bool
    ports: tuple[int, int, int] | None  # slurmctld, slurmd node1, node2 (None: reused as found)
    netlab: Optional[Lab] = None  # the lab whose nodes run the slurmd; None: loopback
    loopback_why: Optional[str] = None  # why not on a lab (None when on one)

    def lab_or_skip(self) -> Lab:
        """The lab whose nodes run the slurmd, for a test that shapes or cuts its links;
        the test skips when the session's cluster runs on loopback."""
        if self.netlab is None:
            pytest.skip(f"the session's cluster runs on loopback: {self.loopback_why}")
        return self.netlab

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


def free_ports(n: int) -> tuple[int, ...]:
    """n distinct ports nothing listens on (on any address: the daemons bind 0.0.0.0)."""
    ports: set[int] = set()
    while len(ports) < n:
        ports.add(free_port("0.0.0.0"))
    return tuple(ports)


def start_cluster(state_dir: Path, ports: tuple[int, int, int] | None = None,
                  netlab: Lab | None = None) -> SlurmCluster:
    """Bring the cluster of `state_dir` up on `ports` (slurmctld, node1, node2; default: free
    ones, new ones if one was taken meanwhile) and return it, its slurmd in `netlab`'s first
    two nodes if given (else on loopback); a cluster already up there is reused as it is.
    Raises RuntimeError on failure, with nothing left running."""
    state_dir = Path(state_dir).resolve()
    env = dict(os.environ)
    for key in ("SLURM_CONF", "SLURM_CLUSTER_NETLAB"):
        env.pop(key, None)
    if _cluster_cmd("status", state_dir, env, 30).returncode == 0:
        cluster = _started(state_dir, _cluster_cmd("up", state_dir, env, UP_TIMEOUT_S), env, 0.0,
                           started_here=False, ports=None)
        cluster.netlab = lab_of(cluster.conf)
        return cluster
    for attempt in range(1, UP_TRIES + 1):
        use = ports or free_ports(3)
        run_env = dict(env, SLURM_CLUSTER_CTLD_PORT=str(use[0]),
                       SLURM_CLUSTER_NODE_PORTS=f"{use[1]},{use[2]}")
        if netlab is not None:
            run_env["SLURM_CLUSTER_NETLAB"] = netlab.name
        t0 = time.monotonic()
        try:
            res = _cluster_cmd("up", state_dir, run_env, UP_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            # the daemons it started outlive the killed script: stop them
            _cluster_cmd("down", state_dir, env, DOWN_TIMEOUT_S)
            raise RuntimeError(f"slurm_cluster.sh up did not finish in {UP_TIMEOUT_S} s: {e}") from e
        if res.returncode == 0:
            cluster = _started(state_dir, res, env, time.monotonic() - t0, started_here=True,
                               ports=tuple(use))
            cluster.netlab = netlab
            return cluster
        if ports is not None or "already in use" not in res.stderr or attempt == UP_TRIES:
            break
    # the script stops what it started on each of its failures; `down` is idempotent
    _cluster_cmd("down", state_dir, dict(env, SLURM_CLUSTER_KEEP_STATE="1"), DOWN_TIMEOUT_S)
    raise RuntimeError(f"slurm_cluster.sh up failed (rc={res.returncode}):\n{res.stdout}\n{res.stderr}")


def _started(state_dir: Path, res: subprocess.CompletedProcess, env: dict, up_s: float,
             started_here: bool, ports) -> SlurmCluster:
    conf = next((line.split("=", 1)[1].strip() for line in res.stdout.splitlines()
                 if line.startswith("export SLURM_CONF=")), None)
    if res.returncode != 0 or not conf:
        raise RuntimeError(f"slurm_cluster.sh up printed no SLURM_CONF (rc={res.returncode}):\n"
                           f"{res.stdout}\n{res.stderr}")
    return SlurmCluster(env=dict(env, SLURM_CONF=conf), state_dir=state_dir, conf=Path(conf),
                        up_seconds=up_s, started_here=started_here, ports=ports)


def stop_cluster(cluster: SlurmCluster) -> None:
    """Stop the daemons, the jobs' leftover processes and (if this was its last user and a
    cluster started it) munged; remove the state folder."""
    env = {k: v for k, v in cluster.env.items() if k != "SLURM_CONF"}
    res = _cluster_cmd("down", cluster.state_dir, env, DOWN_TIMEOUT_S)
    if res.returncode != 0:
        raise RuntimeError(f"slurm_cluster.sh down failed:\n{res.stdout}\n{res.stderr}")


def lab_of(conf: Path) -> Lab | None:
    """The lab a running cluster's slurmd live in (slurm.conf's first line names it), if up."""
    try:
        first = Path(conf).read_text().split("\n", 1)[0]
    except OSError:
        return None
    m = re.search(r"in netlab (\S+)'s namespaces", first)
    return lab_status(m[1]) if m else None


def loopback_reason() -> str | None:
    """Why the session's cluster cannot run on a network lab, or None."""
    if os.environ.get(LOOPBACK_ENV) == "1":
        return f"{LOOPBACK_ENV}=1"
    return netlab_skip_reason()


@contextlib.contextmanager
def session_cluster(state_dir: Path) -> Iterator[SlurmCluster]:
    """The test session's one cluster: on an unshaped 2-node lab when root, ip and tc are
    there (else on loopback, with a warning saying why); cluster then lab stopped at the end.
    A cluster already up in `state_dir` ($SLURM_CLUSTER_STATE_DIR) is used and left as it is."""
    state_dir = Path(state_dir).resolve()
    if (state_dir / "slurm.conf").exists() and \
            _cluster_cmd("status", state_dir, os.environ, 30).returncode == 0:
        yield start_cluster(state_dir)
        return
    why, lab = loopback_reason(), None
    if why is None:
        try:
            lab = lab_up(unique_name(), nodes=2, link="none")
        except RuntimeError as e:
            why = f"scripts/netlab.sh up failed: {e}"
    if why:
        warnings.warn(f"the session's SLURM cluster runs on loopback, not on a network lab: {why}")
    try:
        cluster = start_cluster(state_dir, netlab=lab)
        cluster.loopback_why = why
        try:
            yield cluster
        finally:
            if cluster.started_here:
                stop_cluster(cluster)
    finally:
        if lab is not None:
            lab_down(lab.name)


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
