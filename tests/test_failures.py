"""Dead and hung ranks, and the job's processes under every kind of kill (issue 11, item 5).

Unit part: the per-rank heartbeat record (ddp_lab.folder.heartbeat; what it costs a step is
`python -m ddp_lab.bench.suite stop`), the
diagnosis from records plus /proc (a real frozen process, a real dead pid), the hang
watchdog's stack dump, the nccl flight recorder's variables, the init timeout's key.

Acceptance part (dist, slow): 3 local ranks through `python -m ddp_lab` (launcher=local:
real torchrun, real signals), dist.timeout_s=10. SIGKILL or SIGSTOP of one rank ends the
job within dist.timeout_s + 30 s with one line naming that rank and where it stopped;
SIGKILL of torchrun or of `python -m ddp_lab` stops the ranks gracefully; SIGTERM and
Ctrl-C leave a folder whose resume ends bit-identical to an uninterrupted run. No process
of the job is ever left behind (every test kills what it started in `finally`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest
import torch
from helpers import PY, child_env, compose, describe, summary
from helpers import free_port as _free_port

from ddp_lab.world import hang
from ddp_lab.world import ports
from ddp_lab.folder import failure
from ddp_lab.folder import heartbeat
from ddp_lab.config.errors import UserError
from ddp_lab.launch import job_processes

TIMEOUT_S = 10  # dist.timeout_s of the acceptance runs
WORLD = 3


# ================================================================== unit
def _record(run_dir: Path, rank: int, pid: int, world: int = WORLD) -> heartbeat.Heartbeat:
    """A record as rank `rank` would keep it, claiming process `pid`."""
    rec = heartbeat.Heartbeat(run_dir, rank, rank, world)
    heartbeat._HEAD.pack_into(rec._mm, 0, heartbeat.MAGIC, heartbeat.VERSION, rank, rank, world,
                             pid, time.time(), socket.gethostname().encode())
    return rec


def test_record_round_trip(tmp_path):
    from ddp_lab.timing import Clock, StepTimer

    rec = heartbeat.start(tmp_path, 0, 0, 2)
    timer = StepTimer(Clock(torch.device("cpu")))
    try:
        rec.state("running")
        rec.follow(timer=timer)  # a step ends on the timer; the record reads it
        rec.at(1, 40)  # 1 epoch done, resumed 40 steps into the second
        for name in ("data", "forward", "backward"):
            rec.phase(name)
        timer.end_step()
        rec.phase("data")
        rec.phase("sync")
        rec.collective("all_reduce")
        (r,) = heartbeat.read_all(tmp_path)
        assert (r["rank"], r["world_size"], r["pid"]) == (0, 2, os.getpid())
        assert (r["epoch"], r["step"], r["phase"], r["collective"], r["op"]) == (1, 41, "sync", 1, "all_reduce")
        assert r["state"] == "running" and r["local"]  # (process: see the diagnose tests)
        assert r["where"] == "epoch 2 step 42 phase sync collective #1 (all_reduce)"
        assert r["age_s"] < 5
        timer.end_step()
        rec.snapshot()  # reads the timer now, as its thread would within FOLLOW_S
        assert heartbeat.read_all(tmp_path)[0]["where"].startswith("epoch 2 step 42 phase step end")
        rec.state("failed", "RuntimeError: boom")
        (r,) = heartbeat.read_all(tmp_path)
        assert (r["state"], r["message"]) == ("failed", "RuntimeError: boom")
    finally:
        rec.close()


def test_record_follows_the_timer_and_the_recorder(tmp_path):
    """A training rank's record reads its step timer and its synchroniser's recorder on a
    thread of its own: the step only sets their attributes, and a rank whose main thread
    waits in a collective (here: sleeps) still shows that collective, for status and
    diagnose; a direct write (DistContext's collectives, an epoch's start) adds to it."""
    from ddp_lab.timing import Clock, CommRecorder, StepTimer

    def seen(**want):
        deadline = time.monotonic() + 5 * heartbeat.FOLLOW_S + 2
        while True:
            (r,) = heartbeat.read_all(tmp_path)
            if all(r[k] == v for k, v in want.items()) or time.monotonic() > deadline:
                return r

    rec = heartbeat.start(tmp_path, 0, 0, 2)
    try:
        rec.collective("barrier")  # before the recorder is followed: counted on
        clock = Clock(torch.device("cpu"))
        timer, comm = StepTimer(clock), CommRecorder(clock, 2)
        rec.follow(comm=comm)
        rec.follow(timer=timer)
        rec.at(1, 40)  # resumed 40 steps into the second epoch
        with timer.phase("forward"):
            pass
        timer.end_step()
        with timer.phase("sync"), comm.timed("all_reduce", 8, 8, 8):
            r = seen(phase="sync", collective=2)  # no write of the main thread's meanwhile
            assert r["where"] == "epoch 2 step 42 phase sync collective #2 (all_reduce)", r
            before = r["updated"]
            time.sleep(3 * heartbeat.FOLLOW_S)  # stuck: nothing moves, `updated` stays
            assert heartbeat.read_all(tmp_path)[0]["updated"] == before
        timer.end_step()
        rec.collective("all_gather")  # DistContext's: on top of the recorder's
        r = seen(phase="step end")
        assert r["where"] == "epoch 2 step 42 phase step end collective #3 (all_gather)", r
        comm.finish(comm.begin(), "all_reduce", 8, 8, 8)
        with timer.phase("data"):
            r = seen(phase="data", collective=4)
        assert (r["step"], r["op"]) == (42, ""), r
        assert rec.snapshot()["collective"] == 4  # a snapshot reads them first
    finally:
        rec.close()


def test_records_of_a_larger_earlier_world_are_dropped(tmp_path):
    old = [_record(tmp_path, r, os.getpid(), world=4) for r in range(4)]
    time.sleep(0.01)
    new = [heartbeat.start(tmp_path, r, r, 2) for r in (1, 0)]  # rank 0 last: it prunes
    try:
        assert [r["rank"] for r in heartbeat.read_all(tmp_path)] == [0, 1]
        assert sorted(p.name for p in (tmp_path / "heartbeat").iterdir()) == ["rank0.bin", "rank1.bin"]
    finally:
        for rec in old + new:
            rec.close()


def _sleeper(run_dir: Path) -> subprocess.Popen:
    """A process whose command line names the run folder (as a rank's does), returned once
    it does: between fork and exec the child still shows pytest's command line, which a
    rank's pid never does (a rank records its pid from its own running interpreter)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", str(run_dir)])
    deadline = time.monotonic() + 30
    while str(run_dir).encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0"):
        assert time.monotonic() < deadline, "the sleeper did not start"
        time.sleep(0.01)
    return proc


@contextlib.contextmanager
def _sleeping_ranks(run_dir: Path, world: int = WORLD) -> Iterator[list[heartbeat.Heartbeat]]:
    """`world` sleeping processes, rank r's heartbeat record naming process r; all ended
    after the block."""
    procs = [_sleeper(run_dir) for _ in range(world)]
    recs = [_record(run_dir, r, p.pid, world=world) for r, p in enumerate(procs)]
    try:
        yield recs
    finally:
        for p in procs:
            p.kill()
            p.wait()
        for rec in recs:
            rec.close()


def test_diagnose_names_the_frozen_and_the_dead_rank(tmp_path):
    run_dir = tmp_path.resolve()
    live, frozen, gone = _sleeper(run_dir), _sleeper(run_dir), _sleeper(run_dir)
    gone.kill()
    gone.wait()
    recs = [_record(run_dir, r, p.pid) for r, p in enumerate((live, frozen, gone))]
    try:
        for rec in recs:
            rec.state("running")
        recs[1].at(0, 7)
        recs[1].phase("sync")
        os.kill(frozen.pid, signal.SIGSTOP)
        time.sleep(0.2)
        found = failure.diagnose(run_dir, me=0)
        assert [(r["rank"], r["why"]) for r in found] == [(1, "frozen (SIGSTOP)"), (2, "dead (no process)")]
        line = failure.failure_line(found)
        assert line.startswith(f"rank 1 (pid {frozen.pid} on host {socket.gethostname()}) stopped at "
                               "epoch 1 step 8 phase sync collective #0: frozen (SIGSTOP); rank 2 (pid ")
        # the frozen one is killed (it cannot end itself) and its record says so
        assert failure.end_stuck(found, run_dir, by="rank 0") == [frozen.pid]
        frozen.wait(timeout=10)
        assert frozen.returncode == -signal.SIGKILL
        assert [r["why"] for r in failure.diagnose(run_dir)] == [
            "frozen (SIGSTOP), killed by rank 0", "dead (no process)"]
    finally:
        for p in (live, frozen, gone):
            p.kill()
            p.wait()
        for rec in recs:
            rec.close()


def test_diagnose_a_rank_behind_or_the_first_to_fail(tmp_path):
    run_dir = tmp_path.resolve()
    with _sleeping_ranks(run_dir) as recs:
        for rec in recs:
            rec.state("running")
        for rec in (recs[0], recs[2]):  # 0 and 2 wait in collective #2, 1 never came
            rec.collective("all_reduce")
            rec.collective("all_reduce")
        recs[1].collective("all_reduce")
        found = failure.diagnose(run_dir, me=0)
        assert [(r["rank"], r["why"]) for r in found] == [(1, "no progress for 0 s")]
        assert failure.diagnose(run_dir, me=0, stale_s=60) == []  # not silent long enough
        recs[1].collective("all_reduce")  # all in the same collective: nobody stands out
        assert failure.diagnose(run_dir, me=0) == []
        recs[2].state("failed", "ValueError: bad batch")
        time.sleep(0.01)
        recs[0].state("failed", "RuntimeError: Connection closed by peer")
        found = failure.diagnose(run_dir, me=0)
        assert [(r["rank"], r["why"]) for r in found] == [(2, "failed (ValueError: bad batch)")]
        assert failure.diagnose(run_dir, me=2) == []  # the first to fail explains itself


def test_a_start_that_failed_on_its_own_is_in_the_summary_whichever_rank_failed(tmp_path):
    # mpirun ends the other ranks the moment one fails: rank 1's rendezvous timed out a
    # moment before rank 0's, rank 0 (still starting) was killed, and the job said "rank 0
    # ... dead (no process)" instead of rank 1's line (seen in CI)
    import logging

    from ddp_lab.command import job
    from ddp_lab.rank import main as rank

    run_dir = tmp_path.resolve()
    rec = _record(run_dir, 1, os.getpid(), 2)
    try:
        line = ports.no_answer("192.0.2.1", 20000, 10)
        rank._failed(run_dir, rec, logging.getLogger("t"), line, {"world_size": 2})
        assert summary(run_dir)["status"] == f"failed: {line}"  # the whole line, not 255 bytes
        assert job.collect(run_dir, 1)["status"] == f"failed: {line}"  # kept by the command
    finally:
        rec.close()


def test_diagnose_names_a_node_that_no_longer_answers(tmp_path, monkeypatch):
    """A cut link: every rank waits in the same collective, nothing is dead or frozen; the
    other node's address sends no reply, so its ranks are named, as one node. (Which address
    answers is played here: this machine's network may answer for any address. A real cut
    link: tests/test_netlab_cut.py.)"""
    run_dir = tmp_path.resolve()
    quiet = "198.18.255.254"
    monkeypatch.setattr(failure, "answers", lambda addr: addr != quiet)

    def place(node2_addr: str) -> None:
        for r, rec in enumerate(recs):
            node, addr = ("node1", "127.0.0.1") if r < 2 else ("node2", node2_addr)
            heartbeat._NODE.pack_into(rec._mm, heartbeat._NODE_AT, node.encode(), addr.encode())

    with _sleeping_ranks(run_dir, world=4) as recs:
        for rec in recs:
            rec.state("running")
            rec.collective("all_reduce")
        place(quiet)
        assert failure.diagnose(run_dir, me=0) == []  # without probing: nobody stands out
        found = failure.diagnose(run_dir, me=0, probe=True)
        assert [(r["rank"], r["silent_node"]) for r in found] == [(2, "node2"), (3, "node2")]
        line = failure.failure_line(found)
        assert line.startswith("node node2 (ranks 2-3, last at ") and line.count("node node2") == 1
        assert f"went silent: {quiet} sends no reply (a connection attempt from node1" in line
        place("127.0.0.2")  # a node that answers is not silent
        assert failure.diagnose(run_dir, me=0, probe=True) == []
        assert failure.rank_list([5, 2, 3, 7, 8]) == "2-3, 5, 7-8"
        assert ports.answers("127.0.0.1")  # refused at once: nothing listens on port 9


def test_short_error_drops_source_paths():
    from ddp_lab.rank.main import short_error

    e = RuntimeError("Got the following error when running the callback: RuntimeError: "
                     "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] "
                     "Timed out waiting 15000ms for recv operation to complete\n\nAt:\n  x.py(88): done")
    assert short_error(e) == ("RuntimeError: Timed out waiting 15000ms for recv "
                              "operation to complete")


def test_watchdog_dumps_every_stack_into_the_log(tmp_path):
    """A rank that stops making progress (no re-arm) gets its threads' stacks in its log."""
    log = tmp_path / "rank0.log"
    code = (
        "import threading, time\n"
        "from ddp_lab.world import hang\n"
        f"f = open({str(log)!r}, 'a')\n"
        "w = hang.Watchdog(1.0, f)\n"
        "for _ in range(5):\n"
        "    w.rearm(); time.sleep(0.3)\n"  # progress: no dump
        "def stuck_in_a_collective():\n"
        "    time.sleep(3)\n"
        "threading.Thread(target=time.sleep, args=(3,), daemon=True).start()\n"
        "stuck_in_a_collective()\n"
        "w.cancel()\n")
    proc = subprocess.run([PY, "-c", code], env=child_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, describe(proc)
    text = log.read_text()
    assert text.count("Timeout (0:00:01)!") == 1
    assert "stuck_in_a_collective" in text and text.count("Thread 0x") >= 2


def test_flight_recorder_env(tmp_path):
    prefix = str(tmp_path / "flight_recorder" / "rank_")
    env = hang.flight_recorder_env(tmp_path, torch_version="2.11.0+cu130")
    assert env == {"TORCH_FR_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                   "TORCH_FR_DUMP_TEMP_FILE": prefix}  # the old names warn on torch >= 2.9
    assert (tmp_path / "flight_recorder").is_dir()  # torch writes into it, it does not make it
    assert hang.flight_recorder_env(tmp_path, torch_version="2.4.1") == {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": "2000", "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix}
    environ = {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50"}  # a user's own setting, old name: it stays
    in_effect = hang.enable_flight_recorder(tmp_path, environ, torch_version="2.11.0")
    assert environ == in_effect == {"TORCH_NCCL_TRACE_BUFFER_SIZE": "50",
                                    "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
                                    "TORCH_FR_DUMP_TEMP_FILE": prefix}


def test_distributed_sets_the_flight_recorder_before_nccl_init(tmp_path, monkeypatch):
    """On nccl, the variables are in the environment when init_process_group runs."""
    import torch.distributed as dist

    from ddp_lab.world import distributed as d
    from ddp_lab.world.env import DistEnv

    seen = {}

    def fake_init(backend, **kwargs):  # no GPU here: stop at init, look at the environment
        seen.update(backend=backend, timeout=kwargs["timeout"],
                    env={k: os.environ.get(k) for k in hang.flight_recorder_env(tmp_path)})
        raise RuntimeError("stop here")

    # distributed() writes these into os.environ: restore them after (later tests' children
    # inherit this process's environment)
    for key in (*hang.flight_recorder_env(tmp_path), "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, "")  # records the key's state (delenv of a missing key does not)
        monkeypatch.delenv(key)
    monkeypatch.setattr(d, "choose_device", lambda env, device: torch.device("cuda", 0))
    monkeypatch.setattr(dist, "init_process_group", fake_init)
    env = DistEnv(0, 0, 1, 1, 0, 1, "127.0.0.1", 29500, "single")
    with pytest.raises(RuntimeError, match="stop here"):
        with d.distributed(env, "nccl", "cuda", timeout_s=10, init_timeout_s=99, run_dir=tmp_path):
            pass
    assert seen["backend"] == "nccl" and seen["timeout"].total_seconds() == 99
    assert seen["env"] == hang.flight_recorder_env(tmp_path)


def test_init_timeout_is_its_own_key():
    from ddp_lab.launch import local
    from ddp_lab.command.validate import COMMON, check

    cfg = compose("dist.timeout_s=15", "dist.init_timeout_s=77", "launcher.nproc_per_node=2")
    assert local.render(cfg, Path("/tmp/x")).files["launch.sh"].count("join_timeout=77") == 1
    with pytest.raises(UserError, match=r"^dist.init_timeout_s=0.0: must be >= 5.0 seconds "):
        check(compose("dist.init_timeout_s=0", "launcher.nproc_per_node=2"), COMMON)


def test_a_rank_dies_with_its_launcher_during_init(tmp_path):
    """The death signal is set first thing: a rank waiting in init_process_group for a
    peer that never comes goes as soon as its parent (torchrun) is killed."""
    mk = subprocess.run([PY, "-m", "ddp_lab", "launcher.dry_run=true", "dist.init_timeout_s=120",
                         f"run.root={tmp_path}"], cwd=tmp_path, env=child_env(),
                        capture_output=True, text=True, timeout=120)
    run_dir = Path(mk.stdout.strip().splitlines()[-1].removeprefix("run dir: "))
    env = child_env({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())})
    parent = subprocess.Popen([PY, "-c", "import subprocess, sys; subprocess.Popen(sys.argv[1:]).wait()",
                               PY, "-m", "ddp_lab.worker", str(run_dir)], env=env, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the rank is up and waiting in init
            recs = heartbeat.read_all(run_dir)
            if recs and recs[0]["phase"] == "init" and recs[0]["process"] == "running":
                break
            time.sleep(0.1)
        else:
            raise AssertionError("the rank never started")
        rank = recs[0]["pid"]
        assert _ppid(rank) == parent.pid
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + 10
        while heartbeat.process_state(rank) != "dead" and time.monotonic() < deadline:
            time.sleep(0.1)
        assert heartbeat.process_state(rank) == "dead", "the rank outlived its launcher"
    finally:
        parent.kill()
        parent.wait()
        for pid in job_processes(run_dir, marked=False):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


# ================================================================== acceptance
def _start(run_dir: Path, *overrides: str, world: int = WORLD) -> subprocess.Popen:
    """`python -m ddp_lab` with `world` local ranks in `run_dir`, as a user starts it."""
    cmd = [PY, "-m", "ddp_lab", f"run.dir={run_dir}", f"launcher.nproc_per_node={world}",
           f"dist.timeout_s={TIMEOUT_S}", "log.progress=lines", *overrides]
    return subprocess.Popen(cmd, cwd=run_dir.parent, env=child_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _training(run_dir: Path, proc: subprocess.Popen, steps: int = 5, timeout: float = 120,
              world: int = WORLD) -> list[dict]:
    """The ranks' records once every rank is `steps` steps into training."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        recs = heartbeat.read_all(run_dir)
        if (len(recs) == world and all(r["state"] == "running" for r in recs)
                and all(r["epoch"] * 10_000 + r["step"] >= steps for r in recs)):
            return recs
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    out, err = _finish(proc, 5)
    raise AssertionError(f"the ranks did not get to training (rc {proc.returncode})\n{out[-3000:]}\n{err[-3000:]}")


def _finish(proc: subprocess.Popen, timeout: float) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.communicate()


def _ppid(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rindex(")") + 2:].split()[1])


def _leftovers(run_dir: Path, wait_s: float = 10) -> list[int]:
    """The job's processes still there after up to `wait_s` (ranks, torchrun, launch.sh):
    any process naming the run folder in its command line."""
    deadline = time.monotonic() + wait_s
    while True:
        pids = [p for p in job_processes(run_dir, marked=False) if heartbeat.process_state(p) != "dead"]
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.2)


def _clean_up(proc: subprocess.Popen, run_dir: Path) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.communicate()
    for pid in job_processes(run_dir, marked=False):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _model(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def _assert_same_weights(a: Path, b: Path) -> None:
    ma, mb = _model(a), _model(b)
    assert ma.keys() == mb.keys()
    for key in ma:
        assert torch.equal(ma[key], mb[key]), f"{key} differs between {a} and {b}"


@pytest.mark.dist
@pytest.mark.slow
# a frozen rank 1 is diagnosed as rank 0's is (the same records, the same /proc check): the
# suite freezes rank 0 only, the harder case
@pytest.mark.parametrize("sig, rank, why", [
    (signal.SIGKILL, 1, "dead (no process)"),
    (signal.SIGSTOP, 0, "frozen (SIGSTOP)"),  # rank 0 writes summary.json: the launcher must
], ids=["sigkill-rank1", "sigstop-rank0"])
def test_a_dead_or_frozen_rank_ends_the_job_and_is_named(tmp_path, shared_data_root, sig, rank, why):
    run_dir = tmp_path / "run"
    proc = _start(run_dir, "train.epochs=50", f"data.root={shared_data_root}")
    try:
        recs = _training(run_dir, proc)
        pid = recs[rank]["pid"]
        t0 = time.monotonic()
        os.kill(pid, sig)
        out, err = _finish(proc, TIMEOUT_S + 60)
        took = time.monotonic() - t0
        assert proc.returncode not in (0, None), describe(subprocess.CompletedProcess([], proc.returncode, out, err))
        assert took <= TIMEOUT_S + 30, f"the job took {took:.0f} s to end"
        named = re.compile(rf"rank {rank} \(pid {pid} on host \S+\) stopped at epoch \d+ step \d+ "
                           rf"phase [a-z ]+ collective #\d+( \(\w+\))?: {re.escape(why)}")
        said = [ln for ln in out.splitlines() if named.search(ln)]
        assert said, f"no line names rank {rank} {why}\n{out[-4000:]}\n{err[-2000:]}"
        assert any(ln.startswith("job failed with exit status") for ln in said), out[-3000:]
        status = summary(run_dir)["status"]
        assert status.startswith("failed: ") and named.search(status), status
        assert _leftovers(run_dir, 5) == []
        print(f"{sig.name} of rank {rank}: the job ended after {took:.1f} s "
              f"(dist.timeout_s={TIMEOUT_S}); {said[-1]}")
    finally:
        _clean_up(proc, run_dir)


_HANG = """\
import os
import time

from ddp_lab import timing

end_step, steps = timing.StepTimer.end_step, []


def user_code_that_hangs():
    time.sleep(3600)


def hang_at_step_10(self):  # RANK read here: CPU ranks are forks of torchrun, which loads this
    end_step(self)
    steps.append(1)
    if len(steps) == 10 and os.environ.get("RANK") == os.environ["DDP_LAB_TEST_HANG_RANK"]:
        user_code_that_hangs()


timing.StepTimer.end_step = hang_at_step_10
"""


@pytest.mark.dist
@pytest.mark.slow
def test_a_hung_rank_is_named_and_its_stack_is_in_its_log(tmp_path, shared_data_root):
    """Rank 1 hangs in user code (fault injection: a sitecustomize on the ranks' path) and
    stops taking part: the others name it, its own watchdog dumps its stack into its log,
    and it is killed with the job."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(_HANG)
    env = child_env({"DDP_LAB_TEST_HANG_RANK": "1"})
    env["PYTHONPATH"] += os.pathsep + str(inject)
    run_dir = tmp_path / "run"
    t0 = time.monotonic()
    proc = subprocess.run([PY, "-m", "ddp_lab", f"run.dir={run_dir}", f"launcher.nproc_per_node={WORLD}",
                           f"dist.timeout_s={TIMEOUT_S}", "log.progress=lines", "train.epochs=50",
                           f"data.root={shared_data_root}"], cwd=tmp_path, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    try:
        assert proc.returncode not in (0, None), describe(proc)
        named = re.compile(r"rank 1 \(pid \d+ on host \S+\) stopped at epoch 1 step 10 phase step end "
                           r"collective #\d+( \(\w+\))?: no progress for \d+ s")
        said = [ln for ln in proc.stdout.splitlines() if named.search(ln)]
        assert any(ln.startswith("job failed with exit status") for ln in said), describe(proc)
        log = (run_dir / "logs" / "rank1.log").read_text()
        assert "Timeout (" in log and "in user_code_that_hangs" in log, log[-3000:]
        assert _leftovers(run_dir, 5) == []
        # startup included: the hang itself ended within dist.timeout_s + a few s
        print(f"a hung rank 1: the job took {time.monotonic() - t0:.1f} s in all; {said[-1]}")
    finally:
        for pid in job_processes(run_dir, marked=False):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


_NO_THREADS = """\
import os
import threading

start = threading.Thread.start


def start_unless_rank_1(self):  # RANK read at the call: CPU ranks are forks of torchrun
    if os.environ.get("RANK") == "1":
        raise RuntimeError("can't start new thread")
    start(self)


threading.Thread.start = start_unless_rank_1
"""


@pytest.mark.dist
def test_a_rank_that_dies_at_start_says_why_on_the_console(tmp_path, shared_data_root):
    """Rank 1 cannot start a thread (what `train.threads=100000` did to every rank; fault
    injection: a sitecustomize on the ranks' path): before its first collective it puts its
    cause, with its rank and host, on the console, before the job's line, which names it too."""
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(_NO_THREADS)
    env = child_env()
    env["PYTHONPATH"] += os.pathsep + str(inject)
    run_dir = tmp_path / "run"
    proc = subprocess.run([PY, "-m", "ddp_lab", f"run.dir={run_dir}", "launcher.nproc_per_node=2",
                           "log.progress=lines", "train.epochs=1", f"data.root={shared_data_root}"],
                          cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=300)
    try:
        assert proc.returncode == 1, describe(proc)
        host = socket.gethostname()
        cause = f"rank 1 on host {host} died at start: RuntimeError: can't start new thread"
        lines = proc.stdout.splitlines()
        said = [i for i, ln in enumerate(lines) if cause in ln]
        job = [i for i, ln in enumerate(lines) if ln.startswith("job failed with exit status")]
        assert said and job and said[0] < job[0], describe(proc)
        assert "can't start new thread" in lines[job[0]], lines[job[0]]
        assert "Traceback" not in proc.stdout + proc.stderr, describe(proc)
        assert "can't start new thread" in summary(run_dir)["status"]
        assert _leftovers(run_dir, 5) == []
    finally:
        for pid in job_processes(run_dir, marked=False):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


@pytest.mark.dist
@pytest.mark.slow
def test_sigkill_of_torchrun_stops_the_ranks_gracefully(tmp_path, shared_data_root):
    run_dir = tmp_path / "run"
    proc = _start(run_dir, "train.epochs=50", f"data.root={shared_data_root}")
    try:
        recs = _training(run_dir, proc)
        torchrun = _ppid(recs[0]["pid"])
        assert all(_ppid(r["pid"]) == torchrun for r in recs)
        assert b"ddp_lab.launch.torchrun" in Path(f"/proc/{torchrun}/cmdline").read_bytes()
        # CPU ranks are forks of torchrun (launch/torchrun.py, fork_ranks): its command line;
        # a forked rank that outlived it ends itself (exit_soon), as _leftovers checks
        assert all(Path(f"/proc/{r['pid']}/cmdline").read_bytes()
                   == Path(f"/proc/{torchrun}/cmdline").read_bytes() for r in recs)
        t0 = time.monotonic()
        os.kill(torchrun, signal.SIGKILL)
        out, err = _finish(proc, TIMEOUT_S + 60)
        took = time.monotonic() - t0
        s = summary(run_dir)
        assert s["status"] in ("stopped", "preempted"), f"{s['status']}\n{out[-3000:]}\n{err[-3000:]}"
        assert took <= TIMEOUT_S, f"the ranks took {took:.0f} s to stop"
        assert list((run_dir / "checkpoints").glob("epoch_*.pt"))
        assert "checkpoint saved" in out
        assert _leftovers(run_dir, 5) == []
    finally:
        _clean_up(proc, run_dir)


@pytest.mark.dist
@pytest.mark.slow
def test_sigkill_of_the_launcher_stops_the_job_and_it_resumes(tmp_path, shared_data_root):
    run_dir = tmp_path / "run"
    args = ("train.epochs=2", "train.max_steps_per_epoch=150", f"data.root={shared_data_root}")
    proc = _start(run_dir, *args)
    try:
        _training(run_dir, proc)
        t0 = time.monotonic()
        os.kill(proc.pid, signal.SIGKILL)  # torchrun gets SIGTERM (PR_SET_PDEATHSIG)
        proc.communicate(timeout=30)
        assert _leftovers(run_dir, TIMEOUT_S + 30) == [], "the job outlived python -m ddp_lab"
        took = time.monotonic() - t0
        s = summary(run_dir)
        assert s["status"] in ("stopped", "preempted"), s["status"]
        print(f"SIGKILL of python -m ddp_lab: the job stopped after {took:.1f} s, {s['status']}")
        again = _start(run_dir, *args)
        out, err = _finish(again, 300)
        assert again.returncode == 0, f"{out[-3000:]}\n{err[-3000:]}"
        assert summary(run_dir)["status"] == "completed"
        assert (run_dir / "checkpoints" / "epoch_0002.pt").is_file()
        assert _leftovers(run_dir, 5) == []
    finally:
        _clean_up(proc, run_dir)


_RESUMABLE = ("train.epochs=2", "train.max_steps_per_epoch=200", "train.stop_check_s=0.2")


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, shared_data_root):
    """The reference run of each (world size, synchroniser), without a stop, made once."""
    made: dict[tuple[int, str], Path] = {}

    def get(world: int, sync: str) -> Path:
        if (world, sync) not in made:
            run_dir = tmp_path_factory.mktemp(f"reference-{world}-{sync}") / "run"
            proc = _start(run_dir, *_RESUMABLE, f"sync={sync}", f"data.root={shared_data_root}",
                          world=world)
            try:
                out, err = _finish(proc, 300)
                assert proc.returncode == 0, f"{out[-3000:]}\n{err[-3000:]}"
            finally:
                _clean_up(proc, run_dir)
            made[world, sync] = run_dir
        return made[world, sync]

    return get


# sync=ddp on 3 ranks: DDP lays its buckets out anew after its first iteration, and a
# 3-rank ring sum rounds by position (2 ranks: a + b = b + a), so this is bit-identical
# only thanks to DDPSync.preflight's warm-up step (found here). Both share one reference.
@pytest.mark.dist
@pytest.mark.slow
# Ctrl-C stops as SIGTERM does (the same handler and checkpoint); its resume would repeat
# SIGTERM's, so it stops at the checkpoint
@pytest.mark.parametrize("sig, world, sync, resume", [(signal.SIGTERM, 3, "ddp", True),
                                                      (signal.SIGINT, 3, "ddp", False)],
                         ids=["sigterm-3-ddp", "ctrl-c-3-ddp"])
def test_stop_then_resume_is_bit_identical(tmp_path, shared_data_root, uninterrupted, sig, world,
                                           sync, resume):
    run_dir = tmp_path / "run"
    args = (*_RESUMABLE, f"sync={sync}", f"data.root={shared_data_root}")
    proc = _start(run_dir, *args, world=world)
    try:
        _training(run_dir, proc, steps=20, world=world)
        os.kill(proc.pid, sig)
        out, err = _finish(proc, TIMEOUT_S + 90)
        assert proc.returncode == 128 + sig, f"{proc.returncode}\n{out[-3000:]}\n{err[-3000:]}"
        s = summary(run_dir)
        assert s["status"] == "stopped", s["status"]
        assert _leftovers(run_dir, 5) == []
        mid = sorted(p.name for p in (run_dir / "checkpoints").glob("epoch_*_step_*.pt"))
        assert mid, "no mid-epoch checkpoint"
        if not resume:
            return
        again = _start(run_dir, *args, world=world)
        out, err = _finish(again, 300)
        assert again.returncode == 0, f"{out[-3000:]}\n{err[-3000:]}"
        assert summary(run_dir)["status"] == "completed"
        _assert_same_weights(run_dir / "checkpoints" / "epoch_0002.pt",
                             uninterrupted(world, sync) / "checkpoints" / "epoch_0002.pt")
        assert _leftovers(run_dir, 5) == []
        print(f"{sig.name}: stopped at {mid[-1]}, resumed: bit-identical ({world} ranks, sync={sync})")
    finally:
        _clean_up(proc, run_dir)


# A strong-scaling run stopped mid-epoch and continued on fewer ranks: held by
# tests/test_zero1.py::test_cli_zero1_stopped_on_4_ranks_continues_on_2 (4 ranks -> 2, the
# sharded optimiser state cut again) and, for sync=ddp, by tests/test_slurm_requeue.py::
# test_requeued_onto_one_node_after_two_continues_the_strong_scaling_run (2 -> 1)
