"""Issue 22's acceptance: the session's SLURM cluster runs in a network lab's namespaces
(tests/slurm_fixture.py, session_cluster), and `python -m ddp_lab launcher=slurm
launcher.nodes=2 launcher.nproc_per_node=2 sync=hierarchical` trains across its link shaped
to 200 Mbit/s (`scripts/netlab.sh shape`, for this test only), with a communication time the
link can explain: the bytes that cross it per step, at its rate, take no longer than the
comm time measured per step."""

from __future__ import annotations

import subprocess

import pytest
from helpers import describe, run_cli, run_dir_of, summary
from netlab_fixture import shaped

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.dist, pytest.mark.netlab]

STEPS = 24
# 784-1024-10: 814k parameters, 3.26 MB of gradients a step: 130 ms at 25 MB/s, over 13 times
# the tbf burst (250 kB) a link passes at full speed after an idle moment
TRAIN = ["train.epochs=1", f"train.max_steps_per_epoch={STEPS}", "train.eval_batch_size=2000",
         "model=mlp", "model.hidden=[1024]", "optim=sgd", "train.lr=0.05", "log.progress=lines"]
SLURM = ["launcher=slurm", "launcher.nodes=2", "launcher.nproc_per_node=2", "launcher.wait=true",
         "launcher.wait_timeout_s=300", "launcher.poll_s=1"]
BURST = 250_000  # netlab.sh's tbf burst at 200mbit: 10 ms of the rate


def qdisc(node, dev="eth0") -> str:
    return subprocess.run(["tc", "-n", node.netns, "qdisc", "show", "dev", dev],
                          capture_output=True, text=True, timeout=30, check=True).stdout


def test_hierarchical_trains_across_a_200mbit_link(slurm_cluster, shared_data_root, tmp_path):
    lab = slurm_cluster.lab_or_skip()
    n1, n2 = lab.nodes[:2]
    assert "tbf" not in qdisc(n1)  # the session's lab is unshaped
    with shaped(lab, "200mbit") as rate:
        assert rate == 25e6 and "rate 200Mbit" in qdisc(n1) and "rate 200Mbit" in qdisc(n2)
        proc = run_cli(*TRAIN, *SLURM, "sync=hierarchical", f"run.root={tmp_path / 'runs'}",
                       f"data.root={shared_data_root}", cwd=tmp_path, env=slurm_cluster.env,
                       timeout=400)
    assert "tbf" not in qdisc(n1) and "tbf" not in qdisc(n2)  # restored for the other tests
    assert proc.returncode == 0, describe(proc)
    s = summary(run_dir_of(proc))
    assert s["status"] == "completed" and s["sync"] == "hierarchical", s
    assert (s["world_size"], s["nodes"], s["node_ranks"]) == (4, 2, [0, 1]), s
    assert "[rank 0] hierarchical all-reduce: 2 nodes x 2 ranks" in proc.stdout, describe(proc)
    assert s["steps_run"] == STEPS and s["comm_calls"] == STEPS, s  # one bucket a step

    # rank 0 leads node1: a step's ring between the leaders sends one gradient buffer out of
    # node1 and takes one in, each way on its own tbf; what tbf lets through in t seconds is
    # at most burst + rate * t
    cross = s["comm_bytes_cross_node"] / STEPS
    comm = s["comm_time_s"] / STEPS
    assert cross > 10 * BURST, s
    print(f"cross-node {cross / 1e6:.2f} MB a step, comm {comm * 1e3:.1f} ms a step: "
          f"{cross / comm / 1e6:.1f} MB/s of the link's {rate / 1e6:.0f} MB/s "
          f"(bytes / rate = {cross / rate * 1e3:.1f} ms)")
    assert cross / rate <= comm, (cross, comm, s)  # no faster than the link
    # and the link, not something else, sets the pace: over a third of its rate (measured
    # 0.87 under load; unshaped, the same run's comm is ~6 times shorter)
    assert cross / comm >= rate / 3, (cross, comm, s)
