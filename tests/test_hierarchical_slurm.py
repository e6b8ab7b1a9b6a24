"""sync=hierarchical on the loopback SLURM cluster (scripts/slurm_cluster.sh): 2 nodes x 2
ranks, the trainer end to end, nodes from the launcher (torchrun's GROUP_RANK), no
sync.node_size. The same training with sync=ddp (4 local ranks, run meanwhile: the
cluster's 2 x 2 CPUs hold one such job at a time) must end with the same weights (rank 0's
checkpoints, within 1e-6), and the bytes rank 0 sent to the other node must be what
ddp_lab.predict.costmodel says. Loopback: both "nodes" are this machine."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from helpers import describe, run_cli, run_dir_of, summary

from ddp_lab.predict import costmodel

pytestmark = [pytest.mark.cluster, pytest.mark.slow, pytest.mark.dist]

STEPS = 12
TRAIN = ["train.epochs=1", f"train.max_steps_per_epoch={STEPS}", "train.eval_batch_size=2000",
         "optim=sgd", "train.lr=0.05", "log.progress=lines"]
SLURM = ["launcher=slurm", "launcher.nodes=2", "launcher.nproc_per_node=2", "launcher.wait=true",
         "launcher.wait_timeout_s=300", "launcher.poll_s=1"]


def _train(tmp_path, data_root, env, *overrides):
    proc = run_cli(*TRAIN, *overrides, f"run.root={tmp_path / 'runs'}", f"data.root={data_root}",
                   cwd=tmp_path, env=env, timeout=300)
    assert proc.returncode == 0, describe(proc)
    return proc, run_dir_of(proc)


def _weights(run_dir):
    (ckpt,) = sorted((run_dir / "checkpoints").glob("*.pt"))
    return torch.load(ckpt, map_location="cpu", weights_only=False)["model"]


def test_two_nodes_hierarchical_equals_ddp_and_cross_node_bytes_are_the_models(
        slurm_cluster, shared_data_root, tmp_path):
    with ThreadPoolExecutor(2) as pool:
        ref = pool.submit(_train, tmp_path, shared_data_root, None, "sync=ddp",
                          "launcher.nproc_per_node=4")
        proc, hier = _train(tmp_path, shared_data_root, slurm_cluster.env, *SLURM,
                            "sync=hierarchical")
        _, ddp = ref.result()
    s = summary(hier)
    assert s["status"] == "completed" and s["sync"] == "hierarchical", s
    assert s["steps_run"] == STEPS and s["comm_calls"] == STEPS, s  # one bucket per step
    assert (s["world_size"], s["nodes"], s["node_ranks"]) == (4, 2, [0, 1]), s
    # the nodes the ranks found are the launcher's, not pretended ones
    assert "[rank 0] hierarchical all-reduce: 2 nodes x 2 ranks, leaders 0,2; inter ring, " \
           "intra library" in proc.stdout, describe(proc)

    a, b = _weights(hier), _weights(ddp)
    assert a.keys() == b.keys()
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert diff <= 1e-6, f"hierarchical vs ddp weights differ by {diff:.3g}"

    # rank 0 leads node 0: per step it sent its ring share of every bucket to node 1
    grad_numel = sum(t.numel() for t in a.values())  # one 25 MB bucket holds the whole MLP
    nodes = ((0, 1), (2, 3))
    per_step = costmodel.cross_node_sent(grad_numel, nodes, 4, intra="torch", inter="ring")
    assert per_step == (grad_numel * 4, 0, grad_numel * 4, 0)  # 2(L-1)/L = 1 buffer, L = 2
    assert s["comm_bytes_cross_node"] == STEPS * per_step[0], s
    (_, red), (_, lead), (_, bcast) = costmodel.hierarchical_calls(grad_numel, nodes, 4)
    assert s["comm_bytes_sent"] == STEPS * (red.sent[0] + lead.sent[0] + bcast.sent[0]), s
    (rec,) = [json.loads(line) for line in (hier / "metrics.jsonl").read_text().splitlines()]
    assert rec["comm"]["bytes_cross_node"] == STEPS * per_step[0]
    assert summary(ddp)["comm_bytes_cross_node"] is None  # ddp does not know the nodes

