"""Stop 0 (ddp_lab/one_file.py, the whole lesson in one file) and the framework agree: the same
seed, shards, shuffles and sums give the same final weights, bit for bit, for the naive
per-parameter all-reduce and for the ring; on 2 ranks, and on 3 and 7, where the ring's sums
run in another order and its buffer is padded (3) and the shards are padded (7)."""

from __future__ import annotations

import subprocess

import pytest
import torch

from helpers import PY, child_env, describe, run_cli, run_dir_of

# two epochs: the second one's shuffle (seed + epoch) is checked too; a step cap keeps it short
SETTINGS = ["train.epochs=2", "train.max_steps_per_epoch=25", "launcher.nproc_per_node=2"]


def framework_weights(run_dir) -> dict:
    """The model state of the run's last checkpoint (ddp_lab/folder/checkpoint_file.py)."""
    state = torch.load(run_dir / "checkpoints" / "epoch_0002.pt", weights_only=False)
    return state["model"]


def assert_same_bits(ours: dict, theirs: dict, what: str) -> None:
    assert list(ours) == list(theirs), what  # fc1.weight, fc1.bias, fc2.weight, fc2.bias
    for name in ours:
        assert torch.equal(ours[name], theirs[name]), (
            f"{what}: {name} differs by up to {(ours[name] - theirs[name]).abs().max():.3g}")


@pytest.mark.slow
@pytest.mark.dist
def test_one_file_trains_to_the_framework_weights_bit_for_bit(tmp_path, shared_data_root):
    # the framework, both synchronisers in one sweep; one thread per rank, as torchrun
    # gives stop 0 (OMP_NUM_THREADS=1), so no kernel splits its work differently
    common = [*SETTINGS, f"data.root={shared_data_root}", f"run.root={tmp_path}",
              "log.progress=lines"]
    proc = run_cli("-m", "sync=naive,ring", "train.threads=1", *common, cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    naive, = tmp_path.glob("naive_*")  # a sweep names each job by its value
    ring, = tmp_path.glob("ring_*")

    # stop 0 as the tutorial runs it: plain torchrun, the ring
    saved = tmp_path / "one_file_ring.pt"
    proc = subprocess.run(
        [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "ddp_lab.one_file", "--sync", "ring", "--epochs", "2", "--max-steps", "25",
         "--save", str(saved)],
        cwd=tmp_path, env=child_env({"OMP_NUM_THREADS": "1"}), capture_output=True,
        text=True, timeout=300)
    assert proc.returncode == 0, describe(proc)
    assert "sync (ring)" in proc.stdout and "ms/step" in proc.stdout  # the sync's timing
    assert_same_bits(torch.load(saved), framework_weights(ring), "one_file ring vs sync=ring")

    # stop 0 launched by ddp_lab (run.entry): the run folder's config.yaml decides, naive
    proc = run_cli("run.entry=ddp_lab.one_file", "sync=naive", *common, cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    one_file_naive = torch.load(run_dir_of(proc) / "model.pt")
    assert_same_bits(one_file_naive, framework_weights(naive), "one_file naive vs sync=naive")

    # and the weights did move: the comparison is of trained models, not of two inits
    torch.manual_seed(0)
    first = torch.nn.Linear(784, 50).weight
    assert not torch.equal(one_file_naive["fc1.weight"], first)


def job_folders(root, world: int, entry: str) -> list:
    """The sweep's run folders of one world size and entry, found by their config.yaml
    (what the run is), not by how folders are named."""
    from omegaconf import OmegaConf

    found = []
    for config in root.glob("*/config.yaml"):
        cfg = OmegaConf.load(config)
        if cfg.launcher.nproc_per_node == world and cfg.run.entry == entry:
            found.append(config.parent)
    return found


# a whole epoch in a few steps: 4096 samples per rank a step reach the shard's padded tail
# (at 7 ranks 60000 samples deal 8572 a rank: 4 of them repeated, in the third, last step)
@pytest.mark.slow
@pytest.mark.dist
def test_one_file_matches_the_ring_at_3_and_7_ranks(tmp_path, shared_data_root):
    assert 60_000 % 7 and 39_760 % 3  # the shards pad at 7 ranks, the ring's buffer at 3
    # one sweep, four jobs: the framework and stop 0 (run.entry), at 3 and at 7 ranks
    proc = run_cli("-m", "launcher.nproc_per_node=3,7",
                   "run.entry=ddp_lab.worker,ddp_lab.one_file", "sync=ring", "train.threads=1",
                   "train.epochs=1", "train.batch_size=4096", "train.eval_batch_size=10000",
                   f"data.root={shared_data_root}", f"run.root={tmp_path}",
                   "log.progress=lines", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, describe(proc)
    for world in (3, 7):
        framework, = job_folders(tmp_path, world, "ddp_lab.worker")
        one_file, = job_folders(tmp_path, world, "ddp_lab.one_file")
        state = torch.load(framework / "checkpoints" / "epoch_0001.pt", weights_only=False)
        assert_same_bits(torch.load(one_file / "model.pt"), state["model"],
                         f"one_file ring vs sync=ring at {world} ranks")
