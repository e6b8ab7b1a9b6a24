"""A faster single rank (issue 13, item 5): the timers' bookkeeping leaves the numbers alone,
and `train.compile=true` trains to the eager run's accuracy."""

from __future__ import annotations

import json
import os
import re

import pytest
import torch

from ddp_lab.world import cpu
from helpers import run_cli, run_dir_of, summary


def test_threads_and_their_wait_follow_the_cores_free_at_start(monkeypatch):
    idle, busy = cpu.decide(8, 1, 0.1), cpu.decide(2, 1, 1.9)
    assert (idle.threads, idle.spin) == (8, False) and (busy.threads, busy.spin) == (1, False)
    assert (cpu.decide(8, 1, 1.0).threads, cpu.decide(8, 1, 1.0).spin) == (7, False)
    small = cpu.decide(2, 1, 0.0)  # 2 cores, 1 rank: 2 threads sleep (no core to spare)
    assert (small.threads, small.spin) == (2, False)
    half = cpu.decide(8, 2, 3.2)  # 5 free: 2 threads a rank, each with a core, one to spare
    assert (half.threads, half.spin) == (2, True) and "5 of 8 cores free" in half.why
    four = cpu.decide(2, 4, 0.0)  # 4 > 2 cores
    assert (four.threads, four.spin, four.wait_why) == (1, False, "1 thread: no team to wait")
    # train.threads=2, one rank alone on 2 free cores: its threads spin (a core each); where
    # they would share, they sleep
    alone = cpu.decide(2, 1, 0.1, asked=2)
    assert (alone.threads, alone.spin, alone.wait_why) == (2, True, "2 threads on 2 free cores, "
                                                                    "a core each")
    shared = cpu.decide(2, 1, 1.0, asked=2)
    assert (shared.threads, shared.spin, shared.wait_why) == (2, False, "2 threads share 1 free "
                                                                        "core")
    assert not cpu.decide(4, 2, 0.0, asked=4).spin
    assert "none over for the job's other processes" in small.wait_why
    assert (cpu.decide(4, 2, None).threads, cpu.decide(4, 2, None).spin) == (2, False)
    env: dict = {}
    cpu.apply(busy, env)  # what the launcher hands its ranks
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and env[cpu.THREADS_VAR] == "1"
    env = {"GOMP_SPINCOUNT": "1000"}  # the user's choice stands
    cpu.apply(busy, env)
    assert "OMP_WAIT_POLICY" not in env and cpu.wait_policy(env).startswith("spin 1000")
    env = {}
    cpu.apply(half, env)
    assert "OMP_WAIT_POLICY" not in env and cpu.wait_policy(env) == \
        "spin a moment, then sleep: 2 ranks x 2 threads on 5 free cores, a core each"
    # in a rank: train.threads, then the run's first count, then the launcher's choice
    env = {cpu.THREADS_VAR: "1", cpu.WHY_VAR: "1 of 2 cores free at start, threads sleep"}
    assert cpu.rank_threads(1, 3, 2, env) == cpu.RankThreads(3, "train.threads", False)
    assert cpu.rank_threads(1, 0, 2, env).threads == 2  # kept: no timing at start either
    assert cpu.rank_threads(1, 0, 0, env) == cpu.RankThreads(1, env[cpu.WHY_VAR], True)
    # a core or less a rank: 1 thread whatever the load, so the launcher does not look
    def no_look(*_):
        raise AssertionError("looked at the load for ranks that get 1 thread anyway")
    monkeypatch.setattr(cpu, "busy_cores", no_look)
    assert cpu.look(cpu.cores()).threads == 1
    env = {}  # no launcher looked (mpirun): an equal share, sleeping
    cpu.prepare_rank(env)
    assert env["OMP_WAIT_POLICY"] == "PASSIVE" and cpu.wait_policy(env).startswith(
        "sleep: no launcher looked at the cores")


def test_where_threads_have_a_core_each_the_launcher_times_each_wait(monkeypatch, tmp_path):
    """train.threads=2 on free cores: the launcher times the run's own step under each of
    cpu.WAITS, one process each (libgomp reads its wait once, as torch loads), and keeps the
    fastest; a gentler wait within 5% of it wins (load that comes later); sharing cores, or
    with your own OpenMP variables, nothing is timed."""
    from omegaconf import OmegaConf

    from ddp_lab.launch import torchrun
    from helpers import compose

    OmegaConf.save(compose("model.hidden=37", "train.batch_size=23", "train.threads=2"),
                   tmp_path / "config.yaml")
    # what torchrun's arguments end with: a training run's folder (its step is what is timed);
    # the bench's folders train no model, so nothing is timed for them
    assert torchrun.training_run(["-m", "ddp_lab.worker", str(tmp_path)]) == (tmp_path, 2)
    bench = tmp_path / "bench"
    bench.mkdir()
    OmegaConf.save(compose(config_name="bench"), bench / "config.yaml")
    assert torchrun.training_run(["-m", "ddp_lab.bench.worker", str(bench)]) == (None, 0)
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    OmegaConf.save(compose("dist.device=cuda", "train.threads=3"), gpu / "config.yaml")
    assert torchrun.training_run(["-m", "ddp_lab.worker", str(gpu)]) == (None, 3)
    calls = []

    def probe(threads):
        calls.append(threads)
        return torchrun.probe_waits(tmp_path, threads, 1)

    for var in cpu.USER_WAIT_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(cpu, "cores", lambda: 2)
    monkeypatch.setattr(cpu, "busy_cores", lambda: 0.0)
    share = cpu.look(1, asked=2, probe=probe)
    assert calls == [2], "a core each: the waits are timed"
    assert share.wait in [wait for _, wait in cpu.WAITS], share
    figures = re.findall(r"([\d.]+) ms (sleeping|spinning [^,(]+)", share.wait_why)
    assert [name.strip() for _, name in figures] == [name for name, _ in cpu.WAITS], share.wait_why
    assert all(float(ms) > 0 for ms, _ in figures)
    env: dict = {}
    cpu.apply(share, env)  # what the ranks inherit
    if share.wait == cpu.SLEEP:
        assert env["OMP_WAIT_POLICY"] == "PASSIVE" and cpu.wait_policy(env).startswith("sleep")
    else:
        assert env["GOMP_SPINCOUNT"] == "30000" and "OMP_WAIT_POLICY" not in env
        assert cpu.wait_policy(env).startswith("spin 30000 times, then sleep: 2 threads on 2 "
                                               "free cores, a core each; a training step took")
    # which wins, from the figures alone: the gentlest within 5% of the fastest
    unit = cpu.decide(2, 1, 0.0, asked=2)
    assert cpu.pick_wait(unit, [1.0, 0.5], 1.0).wait == {"GOMP_SPINCOUNT": "30000"}
    assert cpu.pick_wait(unit, [0.52, 0.5], 1.0).wait == cpu.SLEEP
    failed = cpu.pick_wait(unit, None, 1.0)
    assert failed.wait is None and "the wait probe failed" in failed.wait_why
    # cores shared, or your own variables: no probe
    monkeypatch.setattr(cpu, "busy_cores", lambda: 1.0)
    assert not cpu.look(1, asked=2, probe=probe).spin and calls == [2]
    monkeypatch.setattr(cpu, "busy_cores", lambda: 0.0)
    monkeypatch.setenv("GOMP_SPINCOUNT", "1000")
    assert cpu.look(1, asked=2, probe=probe).wait is None and calls == [2]


def test_a_rank_keeps_the_memory_its_steps_free():
    """`cpu.keep_freed_memory` moves glibc's thresholds, read from the kernel's page-fault count
    (getrusage): a 40 MB block allocated and freed 20 times is mapped afresh each time by
    glibc's own rule (its threshold rises to 32 MB at most) and comes from the heap once the
    rank keeps freed memory; your own malloc variables stand (nothing set, False)."""
    import subprocess
    import sys

    code = ("import resource, sys, torch\n"
            "from ddp_lab.world import cpu\n"
            "kept = cpu.keep_freed_memory() if sys.argv[1] == 'keep' else None\n"
            "before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
            "for i in range(20):\n"
            "    b = torch.ones(10 << 20)\n"
            "    del b\n"
            "print(kept, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)\n")

    def faults(how: str, extra: dict) -> tuple[str, int]:
        env = {k: v for k, v in os.environ.items() if k not in cpu.MALLOC_VARS}
        out = subprocess.run([sys.executable, "-c", code, how], env={**env, **extra},
                             capture_output=True, text=True, check=True).stdout.split()
        return out[0], int(out[1])

    kept, few = faults("keep", {})
    _, many = faults("glibc", {})
    yours, _ = faults("keep", {"MALLOC_TRIM_THRESHOLD_": "131072"})
    assert (kept, yours) == ("True", "False")
    # 10,240 pages a block: every time by glibc's rule
    assert many > 20 * 10_000 and few < 0.6 * many, (few, many)


def test_busy_cores_sees_a_busy_process():
    import subprocess
    import sys

    one = next(iter(os.sched_getaffinity(0)))
    hog = subprocess.Popen([sys.executable, "-c", "import os\nos.sched_setaffinity(0, {%d})\n"
                            "while True: pass" % one])
    try:
        import time
        time.sleep(0.3)
        assert cpu.busy_cores(0.3) >= 0.8  # that core, at least
    finally:
        hog.kill()
        hog.wait()


def _run(tmp_path, data_root, *extra: str, env=None, threads: int = 1):
    proc = run_cli("launcher.nproc_per_node=1", "dist.device=cpu", "train.epochs=1",
                   "train.eval_batch_size=2000", f"train.threads={threads}", f"data.root={data_root}",
                   f"run.root={tmp_path}", "log.progress=lines", *extra, cwd=tmp_path,
                   env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return run_dir_of(proc), proc


def _weights(run_dir) -> dict:
    return torch.load(run_dir / "checkpoints" / "epoch_0001.pt")["model"]


@pytest.fixture(scope="module")
def eager(tmp_path_factory, shared_data_root):
    """One rank, 30 steps, timers on, sleeping OpenMP threads (asked for: a pinned count
    with free cores would spin): the reference of both tests below."""
    tmp = tmp_path_factory.mktemp("eager")
    return _run(tmp, shared_data_root, "train.max_steps_per_epoch=30", "timing.enabled=true",
                env={"OMP_WAIT_POLICY": "PASSIVE"}, threads=2)[0]


@pytest.mark.slow
@pytest.mark.dist
def test_bookkeeping_does_not_change_the_weights(tmp_path, shared_data_root, eager):
    # the StepTimer's stamps and records, and the OpenMP wait policy, are bookkeeping and
    # scheduling only: timers on with sleeping threads, or off with spinning ones, same bits
    bare, _ = _run(tmp_path, shared_data_root, "train.max_steps_per_epoch=30",
                   "timing.enabled=false", env={"OMP_WAIT_POLICY": "ACTIVE"}, threads=2)
    a, b = _weights(eager), _weights(bare)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert summary(eager)["train_loss"] == summary(bare)["train_loss"]
    assert summary(eager)["compiled"] is False and summary(eager)["compile_s"] is None


@pytest.mark.dist
@pytest.mark.slow
def test_compile_trains_like_eager(tmp_path, shared_data_root, eager):
    compiled, proc = _run(tmp_path, shared_data_root, "train.max_steps_per_epoch=30",
                          "timing.enabled=true", "train.compile=true", threads=2)
    s, e = summary(compiled), summary(eager)
    assert s["status"] == "completed" and s["compiled"] is True
    assert s["compile_s"] > 0  # measured apart: before the first epoch's clock starts
    assert "train.compile: model compiled in" in proc.stdout + proc.stderr
    # inductor's kernels may round differently from eager's: close, not bit-identical
    assert s["test_accuracy"] == pytest.approx(e["test_accuracy"], abs=0.02)
    assert s["train_loss"] == pytest.approx(e["train_loss"], rel=0.02)
    a, b = _weights(compiled), _weights(eager)
    for k in a:  # the checkpoint holds the bare module's keys, not the compiled wrapper's
        assert torch.allclose(a[k], b[k], atol=1e-4), k
    rec = [json.loads(x) for x in (compiled / "metrics.jsonl").read_text().splitlines()]
    assert len(rec) == 1 and rec[0]["steps"] == 30


@pytest.mark.dist
def test_ddp_in_a_world_of_one_skips_the_reducer_same_weights():
    # sync=ddp on one rank runs the bare model: DDP's reducer only copied gradients there
    import torch.distributed as dist
    import torch.nn.functional as F
    from omegaconf import OmegaConf
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ddp_lab.world.distributed import local_gloo_world
    from ddp_lab.world.ports import free_port
    from ddp_lab.sync import build_sync

    local_gloo_world(0, 1, free_port())
    try:
        cfg = OmegaConf.create({"name": "ddp", "bucket_cap_mb": 25.0, "static_graph": False,
                                "gradient_as_bucket_view": False, "find_unused_parameters": False})
        # the MLP, and the CNN (parameter sizes multiples of nothing) under the fused Adam
        # (ddp_lab's default on CPU) with DDP's buckets of 0.1 MB (three)
        from ddp_lab.models import CNN

        mlp = lambda: torch.nn.Sequential(torch.nn.Linear(784, 50), torch.nn.ReLU(),  # noqa: E731
                                          torch.nn.Linear(50, 10))
        for make, shape, fused, mb in ((mlp, (784,), None, 25.0), (CNN, (1, 28, 28), True, 0.1)):
            x, y = torch.randn(5 * 64, *shape), torch.randint(0, 10, (5 * 64,))
            finals = []
            for wrapped in (True, False):
                torch.manual_seed(0)
                m = make()
                if wrapped:  # what sync=ddp ran before: DDP over the one-rank group
                    model = DDP(m, bucket_cap_mb=mb)
                else:
                    syncer = build_sync(cfg, m, torch.device("cpu"), 1)
                    assert syncer.wrapped is m  # no reducer
                    model = syncer.wrapped
                opt = torch.optim.Adam(m.parameters(), lr=1e-3, fused=fused)
                for i in range(5):
                    opt.zero_grad(set_to_none=True)
                    F.cross_entropy(model(x[i * 64:(i + 1) * 64]), y[i * 64:(i + 1) * 64]).backward()
                    opt.step()
                finals.append([p.detach().clone() for p in m.parameters()])
            assert all(torch.equal(a, b) for a, b in zip(*finals)), make
    finally:
        dist.destroy_process_group()


def test_a_resumed_run_keeps_the_thread_count_it_started_with(tmp_path, monkeypatch):
    from ddp_lab.world.env import DistEnv
    from ddp_lab.rank.main import _threads

    env = DistEnv(rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0,
                  num_nodes=1, master_addr="127.0.0.1", master_port=1, source="single")
    monkeypatch.setenv(cpu.THREADS_VAR, "1")  # this start's launcher saw a busy machine
    assert _threads(tmp_path, env, 0).threads == 1  # a fresh run: the launcher's choice
    (tmp_path / "summary.json").write_text(json.dumps(
        {"segments": [{"world_size": 1, "cpu": {"threads": 2}}]}))
    share = _threads(tmp_path, env, 0)
    assert share.threads == 2 and "started" in share.why
    assert _threads(tmp_path, env, 3).threads == 3  # train.threads stands
    (tmp_path / "summary.json").write_text(json.dumps(
        {"segments": [{"world_size": 2, "cpu": {"threads": 2}}]}))
    assert _threads(tmp_path, env, 0).threads == 1  # another world: its bits differ anyway


def test_start_up_times_one_thread_against_the_ceiling_and_keeps_the_faster(monkeypatch):
    from types import SimpleNamespace

    from ddp_lab.config import compose
    from ddp_lab.fast_step import tune_threads
    from ddp_lab.timing import Clock
    from ddp_lab.train import build_parts

    env = SimpleNamespace(world_size=1)
    ctx = SimpleNamespace(device=torch.device("cpu"), env=env, reduce_floats=lambda v: list(v))
    module, syncer, optimizer = build_parts(compose(["launcher.nproc_per_node=1"]), ctx,
                                            Clock(ctx.device))
    before = {k: v.clone() for k, v in module.state_dict().items()}
    splits = SimpleNamespace(test_x=torch.randn(64, 784), test_y=torch.randint(0, 10, (64,)))
    share = cpu.RankThreads(2, "2 of 2 cores free at start", True)
    threads, rng = torch.get_num_threads(), torch.random.get_rng_state()
    try:
        tune_threads(ctx, share, syncer, optimizer, splits, 64)
        kept = torch.get_num_threads()
    finally:
        torch.set_num_threads(threads)
    assert kept in (1, 2) and share.threads == kept and not share.tunable
    assert "a training step took" in share.why and "ms on 1 thread" in share.why
    # the trial steps trained: the weights, Adam's state and the RNG are as before them
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert all(p.grad is None for p in module.parameters()) and not optimizer.state
    assert torch.equal(rng, torch.random.get_rng_state())
    # asked for (train.threads), or one thread already: nothing is timed
    share = cpu.RankThreads(2, "train.threads", False)
    tune_threads(ctx, share, syncer, optimizer, splits, 64)
    assert share.why == "train.threads" and share.threads == 2
