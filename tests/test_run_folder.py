"""The run folder under stress (issue 20): one command per folder (command/lock.py), damaged
checkpoints, torn records, full disks. Real processes, real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import PY, child_env, compose, summary
from omegaconf import OmegaConf

from ddp_lab.command import lock

REPO = Path(__file__).resolve().parent.parent

HOLDER = """
import sys, time
from pathlib import Path
from ddp_lab.command import lock
lock.acquire(Path(sys.argv[1]), "local")
print("held", flush=True)
time.sleep(600)
"""


def _holder(run_dir: Path) -> subprocess.Popen:
    """Another command holding run_dir's lock: a real process on this machine."""
    proc = subprocess.Popen([PY, "-c", HOLDER, str(run_dir)], env=child_env(),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_live_holder_refuses_a_dead_one_is_taken_over(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    proc = _holder(run_dir)
    try:
        with pytest.raises(lock.FolderInUse, match=rf"run.dir={run_dir} is in use by python -m "
                           rf"ddp_lab \(pid {proc.pid} on .*ddp_lab.status {run_dir} --follow"):
            lock.acquire(run_dir, "local")
        assert "is in use" in lock.in_use(compose(f"run.dir={run_dir}"))  # the validation rule
    finally:
        proc.kill()
        proc.wait()
    with lock.hold(run_dir, "local"):  # its holder is dead: taken over, said in one line
        held = json.loads((run_dir / lock.LOCK).read_text())
        assert held["pid"] == os.getpid()
    err = capsys.readouterr().err
    assert f"taking over the lock of python -m ddp_lab (pid {proc.pid} on" in err, err
    assert not (run_dir / lock.LOCK).exists()  # given back
    assert not list(run_dir.glob(".LOCK*"))


def test_a_reused_pid_is_not_the_holder(tmp_path):
    """A lock whose pid is alive but started at another time (a reused pid) is stale."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    me = lock._me("local")
    me["start"] = str(int(me["start"]) - 1)
    (run_dir / lock.LOCK).write_text(json.dumps(me))
    with lock.hold(run_dir, "local"):
        assert json.loads((run_dir / lock.LOCK).read_text())["start"] == lock._me("local")["start"]


# the slow tier: two real trainings racing; the lock's claim is held in the fast tier by
# test_lock_stress (a crowd of takers, and the pause between re-check and unlink) and by
# test_a_live_holder_refuses_a_dead_one_is_taken_over above
@pytest.mark.slow
@pytest.mark.dist
def test_two_commands_one_folder_exactly_one_trains(tmp_path, shared_data_root):
    """Two identical commands started together on one run.dir: one trains, the other is
    refused in one line, exit 2, having written nothing into the folder, and ends while the
    winner still trains (it does not wait for the lock: an order, not a time, so a loaded
    machine cannot fail it)."""
    run_dir = tmp_path / "run"
    cmd = [PY, "-m", "ddp_lab", f"run.dir={run_dir}", "launcher.nproc_per_node=2",
           "train.epochs=2", "train.max_steps_per_epoch=60", "train.eval_batch_size=2000",
           "log.progress=lines", f"data.root={shared_data_root}"]
    start = time.monotonic()
    procs = [subprocess.Popen(cmd, cwd=tmp_path, env=child_env(), stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    ended: dict[int, float] = {}
    try:
        while len(ended) < 2 and time.monotonic() - start < 300:
            for i, p in enumerate(procs):
                if i not in ended and p.poll() is not None:
                    ended[i] = time.monotonic() - start
            time.sleep(0.05)
        outs = [p.communicate(timeout=30) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    codes = sorted((p.returncode, i) for i, p in enumerate(procs))
    assert [c for c, _ in codes] == [0, 2], [(p.returncode, o[1][-2000:]) for p, o in zip(procs, outs)]
    loser, winner = codes[1][1], codes[0][1]
    out, err = outs[loser]
    assert ended[loser] < ended[winner], ended
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"error: run.dir={run_dir} is in use by"), err
    assert "training" not in out.lower() and "epoch" not in out, out
    done = [json.loads(ln)["epoch"] for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert done == [1, 2], done
    s = summary(run_dir)
    assert s["status"] == "completed" and len(s["segments"]) == 1, s
    assert not (run_dir / lock.LOCK).exists()


def _train(run_dir: Path, data_root: Path, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python -m ddp_lab` on 2 local ranks in run_dir: 3 short epochs."""
    cmd = [PY, "-m", "ddp_lab", f"run.dir={run_dir}", "launcher.nproc_per_node=2",
           "train.epochs=3", "train.max_steps_per_epoch=30", "train.eval_batch_size=2000",
           "log.progress=lines", "dist.timeout_s=20", f"data.root={data_root}", *extra]
    return subprocess.run(cmd, cwd=run_dir.parent, env=child_env(env), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=300)


def _weights(path: Path) -> dict:
    import torch

    return torch.load(path, map_location="cpu", weights_only=False)["model"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, shared_data_root) -> Path:
    run_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    res = _train(run_dir, shared_data_root)
    assert res.returncode == 0, res.stderr[-3000:]
    return run_dir


@pytest.mark.slow
@pytest.mark.dist
def test_a_truncated_newest_checkpoint_is_set_aside_and_the_run_continues(
        tmp_path, shared_data_root, uninterrupted):
    """A rank dies after epoch 2 of 3 and the newest checkpoint is cut short (its writer's
    node died with the bytes still on their way), and metrics.jsonl ends with a torn line:
    status reads past it; the same command sets both aside with one line each, continues
    from epoch 1's checkpoint, and ends bit for bit where an uninterrupted run ends, every
    epoch recorded once."""
    run_dir = tmp_path / "run"
    res = _train(run_dir, shared_data_root, env={"DDP_LAB_FAIL_ONCE": "rank=1,epoch=2"})
    assert res.returncode != 0, res.stdout[-2000:]
    ckpts = run_dir / "checkpoints"
    newest = ckpts / "epoch_0002.pt"
    assert (ckpts / "epoch_0002.pt.sha256").is_file()
    size = newest.stat().st_size
    with open(newest, "r+b") as f:  # a real truncation of the real file
        f.truncate(size // 2)
    metrics = run_dir / "metrics.jsonl"
    torn = metrics.read_text().splitlines()[-1][:50]
    with open(metrics, "a") as f:  # and a torn record after the last whole one
        f.write(torn)
    status = subprocess.run([PY, "-m", "ddp_lab.status", str(run_dir)], env=child_env(),
                            capture_output=True, text=True, timeout=60)
    assert "epoch 2" in status.stdout or "2/3" in status.stdout, status.stdout + status.stderr
    res = _train(run_dir, shared_data_root)
    assert res.returncode == 0, res.stderr[-3000:]
    said = [ln for ln in (res.stdout + res.stderr).splitlines() if "damaged" in ln]
    assert len(said) == 1 and "checkpoint epoch_0002.pt is damaged (its SHA-256 differs" in said[0] \
        and "set aside as epoch_0002.pt.damaged" in said[0], said
    assert "resumed from epoch_0001.pt" in res.stdout + res.stderr
    assert (run_dir / "metrics.jsonl.torn").read_text() == torn + "\n"  # moved aside, kept
    assert (ckpts / "epoch_0002.pt.damaged").stat().st_size == size // 2  # kept, not deleted
    s = summary(run_dir)
    assert s["status"] == "completed", s
    done = [json.loads(ln)["epoch"] for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert done == [1, 2, 3], done
    got, want = _weights(ckpts / "epoch_0003.pt"), _weights(uninterrupted / "checkpoints" / "epoch_0003.pt")
    assert all(got[k].equal(want[k]) for k in want), "weights differ from the uninterrupted run's"


def test_checksums_catch_a_flipped_byte_and_old_checkpoints_are_trusted(tmp_path):
    from ddp_lab.folder import checkpoint_file as checkpoint

    state = {"model": {"w": __import__("torch").arange(1000.0)}}
    for epoch in (1, 2, 3):
        checkpoint.save(tmp_path, epoch, 0, state, keep=3)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f"epoch_000{e}.pt{s}" for e in (1, 2, 3) for s in ("", ".sha256")]
    third = tmp_path / "epoch_0003.pt"
    check = subprocess.run(["sha256sum", "-c", "epoch_0003.pt.sha256"], cwd=tmp_path,
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr  # the format sha256sum reads
    data = bytearray(third.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, one byte flipped
    third.write_bytes(bytes(data))
    (tmp_path / "epoch_0002.pt.sha256").unlink()  # as written before checksums were kept
    assert "SHA-256 differs" in checkpoint.damage(third)
    path, said = checkpoint.newest_intact(tmp_path)
    assert path == tmp_path / "epoch_0002.pt" and len(said) == 1, said
    assert (tmp_path / "epoch_0003.pt.damaged").is_file()
    assert (tmp_path / "epoch_0003.pt.damaged.sha256").is_file()
    assert checkpoint.latest(tmp_path) == tmp_path / "epoch_0002.pt"
    checkpoint.save(tmp_path, 4, 0, state, keep=2)  # pruning takes the checksum files too
    assert sorted(p.name for p in tmp_path.glob("epoch_*.pt*") if "damaged" not in p.name) == [
        "epoch_0002.pt", "epoch_0004.pt", "epoch_0004.pt.sha256"]


@pytest.fixture
def small_disk(tmp_path):
    """A real 1 MiB tmpfs (root only): room for one MLP checkpoint, not two."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root (CI runs as root)")
    mnt = tmp_path / "small"
    mnt.mkdir()
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(mnt)],
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


@pytest.mark.dist
def test_a_full_disk_is_named_and_the_run_continues_once_there_is_room(small_disk, shared_data_root):
    """The run folder on a disk that holds one checkpoint: epoch 2's checkpoint cannot be
    written. The status and the console's last line say `no space left on <folder>`, epoch
    1's checkpoint is intact; with room made, the same command continues and completes."""
    run_dir = small_disk / "run"
    res = _train(run_dir, shared_data_root)
    assert res.returncode != 0
    why = f"no space left on {run_dir / 'checkpoints'} (writing epoch_0002.pt)"
    assert summary(run_dir)["status"] == f"failed: {why}", summary(run_dir)["status"]
    last = [ln for ln in res.stdout.splitlines() if ln.strip()][-2]  # before `run dir: ...`
    assert why in last, res.stdout[-2000:]
    from ddp_lab.folder import checkpoint_file as checkpoint

    assert checkpoint.latest(run_dir / "checkpoints").name == "epoch_0001.pt"
    assert checkpoint.damage(run_dir / "checkpoints" / "epoch_0001.pt") is None
    assert not list((run_dir / "checkpoints").glob(".*tmp*"))  # the partial write is gone
    subprocess.run(["mount", "-o", "remount,size=8M", str(small_disk)], check=True)
    res = _train(run_dir, shared_data_root)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resumed from epoch_0001.pt" in res.stdout + res.stderr
    assert summary(run_dir)["status"] == "completed"


# ------------------------------------------------------------------ names (issue 28)
def test_names_start_with_what_differs():
    from ddp_lab.folder.description import describe_run
    from ddp_lab.folder.description import DEFAULT_GROUPS, sweep_name
    from ddp_lab.folder.rundir import describe_config

    # the groups named when not the default: conf/config.yaml's defaults
    defaults = OmegaConf.to_container(OmegaConf.load(REPO / "conf" / "config.yaml").defaults)
    chosen = {k: v for d in defaults if isinstance(d, dict) for k, v in d.items()}
    assert {g: chosen[g] for g in DEFAULT_GROUPS} == DEFAULT_GROUPS

    def label(*overrides, **found):
        return describe_run(OmegaConf.to_container(compose(*overrides)), found).label()

    assert label("sync=ring", world_size=4) == "ring_w4_mlp"
    assert label("optim=sgd", "model=cnn", world_size=8, nodes=2) == "ddp_w8n2_cnn_sgd"
    assert label("sync=ring") == "ring_mlp"  # world not known yet
    # every option of the sync's group that is not its default, in the head
    assert label("sync=ring", "sync.prepost=true", "sync.compress=fp16", world_size=2) == (
        "ring-fp16-prepost_w2_mlp")
    assert label("sync=hierarchical", "sync.prepost=false", world_size=2) == "hierarchical-noprepost_w2_mlp"
    assert label("sync=ddp", "model=mlp_wide", world_size=2) == "ddp_w2_mlp_wide"
    assert label("run.entry=ddp_lab.rank.one_file", "sync=ring", world_size=2) == "ring_w2_mlp_one_file"
    assert sweep_name(["sync=ring", "optim=sgd"]) == "ring_sgd"
    assert sweep_name(["train.lr=0.1", "sync.compress=fp16", "model.hidden=[256,256]"]) == (
        "lr0.1_compress-fp16_hidden256-256")
    # the submitting side's name for the config a command composes
    cfg = compose("optim=sgd", "launcher.nproc_per_node=2", "sync=tree")
    assert describe_config(cfg) == "tree_w2_mlp_sgd"


def test_a_run_folder_is_named_first_by_what_differs_and_stays_unique(tmp_path):
    from ddp_lab.folder.rundir import make_run_dir

    cfg = compose("optim=sgd", "launcher.nproc_per_node=2", f"run.root={tmp_path}")
    a, b = make_run_dir(cfg), make_run_dir(cfg)  # in the same second, most likely
    assert a != b and a.name.startswith("ddp_w2_mlp_sgd_20") and b.name.startswith(a.name)
    cfg.run.name = "ring_sgd"  # a sweep's job (cli sets it from the swept values)
    assert make_run_dir(cfg).name.startswith("ring_sgd_20")
    assert make_run_dir(cfg, label="bench_local").name.startswith("bench_local_ring_sgd_20")


@pytest.mark.dist
def test_a_ddp_run_keeps_ddps_own_timing(uninterrupted):
    # sync=ddp (the default) on 2 ranks, profiler off: DDP's logging data as DDP samples it
    d = summary(uninterrupted)["ddp_timing"]
    assert d["every_iteration"] is False and d["preflight_excluded"] is False, d
    assert d["last_logged_iteration"] >= 10, d  # 1 preflight + 90 steps: 1-10 logged
    for k in ("forward_compute_time_s", "backward_compute_time_s", "backward_comm_time_s",
              "backward_compute_comm_overlap_time_s"):
        assert 0 < d[k] < 1, (k, d)
    assert summary(uninterrupted)["witnesses"] is None  # timing.profile off: no trace
    assert not (uninterrupted / "profile").exists()
