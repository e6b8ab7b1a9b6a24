"""Stop 0 (ddp_lab/one_file.py, the whole lesson in one file) and the framework agree: the same
seed, shards, shuffles and sums give the same final weights, bit for bit, for the naive
per-parameter all-reduce and for the ring; on 2 ranks, and on 3 and 7, where the ring's sums
run in another order and its buffer is padded (3) and the shards are padded (7). The lesson
stands on its own (its size, no import of ddp_lab), and ddp_lab launches it through
ddp_lab/rank/one_file.py, which turns a run folder's config into the lesson's flags."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

import ddp_lab.one_file as lesson
from ddp_lab.rank.one_file import flags
from ddp_lab.world import torch_support
from helpers import PY, child_env, compose, describe, run_cli, run_dir_of

ENTRY = "ddp_lab.rank.one_file"  # the run.entry that runs stop 0

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

    # stop 0 as the tutorial runs it: plain torchrun, the ring; a torch without a fused
    # Adam on CPU (< 2.4) is told so, as optim.fused=null tells the framework
    saved = tmp_path / "one_file_ring.pt"
    fused = [] if torch_support.has_fused("adam", "cpu") else ["--no-fused"]
    proc = subprocess.run(
        [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
         "-m", "ddp_lab.one_file", "--sync", "ring", "--epochs", "2", "--max-steps", "25",
         *fused, "--save", str(saved)],
        cwd=tmp_path, env=child_env({"OMP_NUM_THREADS": "1"}), capture_output=True,
        text=True, timeout=300)
    assert proc.returncode == 0, describe(proc)
    assert "sync (ring)" in proc.stdout and "ms/step" in proc.stdout  # the sync's timing
    assert_same_bits(torch.load(saved), framework_weights(ring), "one_file ring vs sync=ring")

    # stop 0 launched by ddp_lab (run.entry): the run folder's config.yaml decides, naive
    proc = run_cli(f"run.entry={ENTRY}", "sync=naive", *common, cwd=tmp_path)
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
                   f"run.entry=ddp_lab.worker,{ENTRY}", "sync=ring", "train.threads=1",
                   "train.epochs=1", "train.batch_size=4096", "train.eval_batch_size=10000",
                   f"data.root={shared_data_root}", f"run.root={tmp_path}",
                   "log.progress=lines", cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, describe(proc)
    for world in (3, 7):
        framework, = job_folders(tmp_path, world, "ddp_lab.worker")
        one_file, = job_folders(tmp_path, world, ENTRY)
        state = torch.load(framework / "checkpoints" / "epoch_0001.pt", weights_only=False)
        assert_same_bits(torch.load(one_file / "model.pt"), state["model"],
                         f"one_file ring vs sync=ring at {world} ranks")


def test_the_lesson_stands_on_its_own():
    """At most 130 lines, a non-blank line 48 characters on average at most, and nothing
    of ddp_lab imported or pointed at: one pointer, to the tour, in its docstring."""
    source = Path(lesson.__file__).read_text()
    lines = source.splitlines()
    written = [line for line in lines if line.strip()]
    assert len(lines) <= 130, len(lines)
    mean = sum(map(len, written)) / len(written)
    assert mean <= 48, f"mean non-blank line {mean:.1f} characters"
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0 and not node.module.startswith("ddp_lab"), node.module
        if isinstance(node, ast.Import):
            assert not any(a.name.startswith("ddp_lab") for a in node.names)
    pointers = [line for line in lines
                if any(p in line for p in ("ddp_lab/", "ddp_lab'", "docs/", "tests/", ".py"))]
    assert pointers == [lines[0]] and "docs/tour.md" in lines[0], pointers
    assert "yaml" not in source and "except" not in source  # no run folder, no fallback


def test_a_run_folder_becomes_the_lessons_flags(tmp_path):
    """ddp_lab/rank/one_file.py: the settings stop 0 has, from the run's config.yaml, as
    the flags the lesson parses (its own parser, so a flag it lacks fails here)."""
    cfg = compose(f"run.entry={ENTRY}", "sync=naive", "train.seed=3", "train.lr=0.01",
                  "train.batch_size=32", "train.epochs=2", "train.max_steps_per_epoch=5",
                  "optim.fused=false")
    OmegaConf.save(cfg, tmp_path / "config.yaml")
    args = lesson.parse(flags(tmp_path))
    assert vars(args) == dict(sync="naive", seed=3, lr=0.01, batch_size=32, epochs=2,
                              max_steps=5, fused=False, save=str(tmp_path / "model.pt"))
    # the defaults: no step cap (0, the whole epoch); optim.fused=null, what this torch
    # has on CPU
    cfg = compose(f"run.entry={ENTRY}", "sync=ring")
    OmegaConf.save(cfg, tmp_path / "config.yaml")
    args = lesson.parse(flags(tmp_path))
    assert args.max_steps == 0 and args.sync == "ring"
    assert args.fused == torch_support.has_fused("adam", "cpu")
    # a sync stop 0 does not have is refused in one line, not trained as another
    OmegaConf.save(compose("sync=tree"), tmp_path / "config.yaml")
    with pytest.raises(SystemExit, match="stop 0 has sync=naive and sync=ring"):
        flags(tmp_path)


def test_the_command_knows_the_lessons_syncs():
    """The submitting command refuses another sync for stop 0 without
    loading torch: its list is the lesson's own."""
    from ddp_lab import one_file
    from ddp_lab.command.validate import ONE_FILE_SYNCS

    assert set(ONE_FILE_SYNCS) == set(one_file.SYNCS)
