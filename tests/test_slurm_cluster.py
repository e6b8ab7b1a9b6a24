"""Proof that scripts/slurm_cluster.sh gives a working 2-node SLURM cluster.

* sbatch of a per-task job (srun --ntasks-per-node=2, ranks from SLURM_PROCID), 4 ranks
  doing a gloo all_reduce (a job whose srun starts one torchrun per node, c10d rendezvous:
  ddp_lab's own, tests/test_launch_slurm.py::test_two_nodes_one_torchrun_each);
* up is idempotent, down is a no-op when nothing is up.
"""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
import time

import pytest
from ddp_lab.world.ports import free_port

from slurm_fixture import CLUSTER_SCRIPT, submit_and_wait

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

PY = sys.executable

ALLREDUCE_PY = textwrap.dedent(
    """
    import os, sys, datetime
    import torch
    import torch.distributed as dist

    # a plain srun task: SLURM's ids mapped to torch's
    os.environ["RANK"] = os.environ["SLURM_PROCID"]
    os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
    os.environ["LOCAL_RANK"] = os.environ["SLURM_LOCALID"]
    dist.init_process_group("gloo", init_method="env://",
                            timeout=datetime.timedelta(seconds=60))
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t)
    node_rank = os.environ["SLURM_NODEID"]
    print(f"RESULT rank={rank} world={world} node_rank={node_rank} "
          f"local_rank={os.environ['LOCAL_RANK']} slurm_node={os.environ.get('SLURMD_NODENAME')} "
          f"sum={t.item():g}", flush=True)
    dist.destroy_process_group()
    """
)

RESULT_RE = re.compile(
    r"RESULT rank=(\d+) world=(\d+) node_rank=(\d+) local_rank=(\d+) slurm_node=(\S+) sum=([0-9.]+)"
)




def parse_results(output: str):
    return [
        dict(rank=int(m[0]), world=int(m[1]), node_rank=int(m[2]), local_rank=int(m[3]),
             slurm_node=m[4], sum=float(m[5]))
        for m in RESULT_RE.findall(output)
    ]


def check_four_ranks_two_nodes(results, output):
    assert len(results) == 4, output
    assert sorted(r["rank"] for r in results) == [0, 1, 2, 3], output
    assert {r["world"] for r in results} == {4}, output
    assert {r["sum"] for r in results} == {10.0}, output  # 1+2+3+4
    assert sorted(r["node_rank"] for r in results) == [0, 0, 1, 1], output
    assert {r["slurm_node"] for r in results} == {"node1", "node2"}, output
    # each node (node_rank) hosts 2 ranks with local ranks 0,1, all on the same slurmd
    for nr in (0, 1):
        on_node = [r for r in results if r["node_rank"] == nr]
        assert sorted(r["local_rank"] for r in on_node) == [0, 1], output
        assert len({r["slurm_node"] for r in on_node}) == 1, output


def test_sinfo_two_idle_nodes(slurm_cluster):
    print(f"cluster up in {slurm_cluster.up_seconds:.1f} s (started here: {slurm_cluster.started_here})")
    # the session's cluster may have just run other modules' jobs: nodes stay "comp"
    # (completing) for a few seconds after a job ends, then go back to idle
    deadline = time.monotonic() + 30
    while True:
        res = slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N %t %c")
        lines = sorted(set(res.stdout.split("\n")) - {""})
        if lines == ["node1 idle 2", "node2 idle 2"] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert lines == ["node1 idle 2", "node2 idle 2"], res.stdout


def test_per_task_srun_job(slurm_cluster, tmp_path):
    (tmp_path / "allreduce.py").write_text(ALLREDUCE_PY)
    script = textwrap.dedent(
        f"""\
        #!/bin/bash
        #SBATCH --job-name=pertask2x2
        #SBATCH --nodes=2
        #SBATCH --ntasks-per-node=2
        #SBATCH --time=5
        set -e
        export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
        srun --ntasks-per-node=2 --kill-on-bad-exit=1 {PY} {tmp_path}/allreduce.py
        """
    )
    job = submit_and_wait(slurm_cluster, script, tmp_path, timeout=240,
                          extra_env={"MASTER_PORT": str(free_port())})
    print(f"per-task job: {job.elapsed_s:.1f} s")
    assert not job.timed_out, job.describe()
    assert job.state == "COMPLETED" and job.exit_code == "0:0", job.describe()
    results = parse_results(job.output)
    check_four_ranks_two_nodes(results, job.describe())
    # block distribution: SLURM_NODEID 0 (node1) holds ranks 0,1
    assert {r["rank"] for r in results if r["slurm_node"] == "node1"} == {0, 1}, job.describe()


def test_up_is_idempotent(slurm_cluster):
    t0 = time.monotonic()
    res = subprocess.run(["bash", str(CLUSTER_SCRIPT), "up", str(slurm_cluster.state_dir)],
                         env=slurm_cluster.env, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert f"export SLURM_CONF={slurm_cluster.conf}" in res.stdout
    assert "already up" in res.stderr
    assert time.monotonic() - t0 < 30
    st = subprocess.run(["bash", str(CLUSTER_SCRIPT), "status", str(slurm_cluster.state_dir)],
                        env=slurm_cluster.env, capture_output=True, text=True, timeout=60)
    assert st.returncode == 0, st.stderr


def test_down_when_not_up_is_noop(tmp_path):
    state = tmp_path / "never-up"
    res = subprocess.run(["bash", str(CLUSTER_SCRIPT), "down", str(state)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    st = subprocess.run(["bash", str(CLUSTER_SCRIPT), "status", str(state)],
                        capture_output=True, text=True, timeout=60)
    assert st.returncode == 1, st.stderr
