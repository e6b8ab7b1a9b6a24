"""Timing arithmetic, the step and comm recorders, and the trace file (no processes)."""

from __future__ import annotations

import json
import time

import pytest
import torch

from ddp_lab.timing import (
    PHASES, Clock, CommRecorder, StepTimer, StepTimes, StepWatch, describe,
    epoch_timing, percentile, stragglers, summarise_steps, union_length,
)
from ddp_lab.rank.records import COMM_TID, TraceWriter, epoch_events, kept_steps

CPU = torch.device("cpu")


# ------------------------------------------------------------ statistics
def test_percentile_nearest_rank():
    v = list(range(1, 101))  # 1..100
    assert percentile(v, 0) == 1 and percentile(v, 100) == 100
    assert percentile(v, 50) in (50, 51)
    assert percentile(v, 95) == 95  # index round(0.95 * 99) = 94
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # sorts first
    assert percentile([7.0], 95) == 7.0
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 101)


def test_describe():
    d = describe([1.0, 2.0, 3.0, 10.0])
    assert d == {"mean": 4.0, "median": 2.5, "p95": 10.0, "total": 16.0}
    assert describe([]) == {"mean": 0.0, "median": 0.0, "p95": 0.0, "total": 0.0}


def test_union_length_counts_overlap_once():
    assert union_length([]) == 0.0
    assert union_length([(0, 1), (2, 3)]) == 2.0
    assert union_length([(0, 2), (1, 3)]) == 3.0
    assert union_length([(1, 3), (0, 4), (5, 6)]) == 5.0  # nested and unsorted


def test_stragglers():
    s = stragglers([1.0, 1.5, 0.5])
    assert (s["slowest_rank"], s["slowest_s"], s["fastest_rank"], s["fastest_s"]) == (1, 1.5, 2, 0.5)
    assert s["spread"] == pytest.approx(3.0)
    assert stragglers([]) == {}


# ------------------------------------------------------------ recorders
def test_step_timer_times_each_phase():
    clock = Clock(CPU)
    timer = StepTimer(clock)
    for _ in range(3):
        for p in PHASES:
            with timer.phase(p):
                if p == "sync":
                    time.sleep(0.002)
        timer.end_step()
    steps = timer.collect()
    assert len(steps) == 3 and timer.collect() == []
    for st in steps:
        assert [n for n, _, _ in st.spans] == list(PHASES)
        assert st.durations()["sync"] >= 0.002
        assert all(s <= e for _, s, e in st.spans)
        assert all(a[2] <= b[1] for a, b in zip(st.spans, st.spans[1:]))  # in order
    summary = summarise_steps(steps)
    assert summary["step"]["total"] == pytest.approx(sum(sum(s.durations().values()) for s in steps))


def test_step_timer_disabled_records_nothing():
    timer = StepTimer(Clock(CPU), enabled=False)
    with timer.phase("data"):
        pass
    timer.end_step()
    assert timer.collect() == []


def test_comm_recorder_counts_bytes_and_times_calls():
    clock = Clock(CPU)
    rec = CommRecorder(clock, world_size=4)
    with rec.timed("all_reduce", 1000, 1500, 1500):
        time.sleep(0.001)
    start = rec.begin()  # an async call, finished from a callback
    rec.finish(start, "broadcast", 200, 600, 0)
    stats = rec.collect()
    assert (stats.calls, stats.payload_bytes, stats.bytes_sent, stats.bytes_recv) == (2, 1200, 2100, 1500)
    assert stats.bus_bytes == pytest.approx(1000 * 1.5 + 200 * 1.0)
    assert stats.seconds >= 0.001 and len(stats.timed) == 2
    assert stats.busbw == pytest.approx(stats.bus_bytes / stats.seconds / 1e9)
    assert stats.algbw == pytest.approx(1200 / stats.seconds / 1e9)
    assert rec.collect().calls == 0  # collect resets


def test_comm_recorder_disabled_still_counts_bytes():
    rec = CommRecorder(Clock(CPU), world_size=2, enabled=False)
    with rec.timed("all_reduce", 100, 100, 100):
        pass
    rec.finish(rec.begin(), "all_reduce", 100, 100, 100)
    stats = rec.collect()
    assert stats.calls == 2 and stats.bytes_sent == 200
    assert stats.seconds == 0.0 and stats.timed == [] and stats.busbw == 0.0



@pytest.mark.parametrize("enabled", [True, False])
def test_timers_say_where_the_rank_is_timed_or_not(enabled):
    """The heartbeat record reads the timers (ddp_lab/folder/heartbeat.py `follow`): the phase
    running and the steps ended, the calls entered and the last one's op."""
    timer = StepTimer(Clock(CPU), enabled)
    assert (timer.now, timer.ended) == ("", 0)
    with timer.phase("data"):
        assert (timer.now, timer.ended) == ("data", 0)
    timer.end_step()
    assert (timer.now, timer.ended) == ("step end", 1)
    rec = CommRecorder(Clock(CPU), 2, enabled)
    with rec.timed("all_reduce", 8, 8, 8):
        assert (rec.entered, rec.op) == (1, "all_reduce")
    rec.finish(rec.begin(), "all_reduce", 8, 8, 8)  # async: its op is known only at the end
    assert (rec.entered, rec.op) == (2, "")


def test_step_watch_hands_over_every_nth_step_as_it_ends():
    """The live TensorBoard points: global steps 5..11 watched every 3 hand over steps 6
    and 9 as they end, with the times and calls `collect` reads, after the listener the
    timer had."""
    clock = Clock(CPU)
    heard: list = []
    timer = StepTimer(clock, on_step_end=lambda: heard.append("step end"))
    rec = CommRecorder(clock, world_size=2)
    got: list = []
    watch = StepWatch(timer, rec, 3, lambda n, st, calls: heard.append(n) or got.append((n, st, calls)))
    watch.begin(4)
    for _ in range(7):
        for p in PHASES:
            with timer.phase(p):
                if p == "sync":
                    with rec.timed("all_reduce", 8, 8, 8):
                        time.sleep(0.001)
        timer.end_step()
    assert heard == ["step end"] * 2 + [6] + ["step end"] * 3 + [9] + ["step end"] * 2
    steps, comm = timer.collect(), rec.collect()
    for n, st, calls in got:
        assert st == steps[n - 5]
        assert [(c.start, c.end) for c in calls] == [(comm.timed[n - 5].start, comm.timed[n - 5].end)]


@pytest.mark.parametrize("every, calls", [(1, [1, 2, 0, 1]), (2, [2, 1])])
def test_step_watch_hands_each_step_its_own_calls(every, calls):
    """The watch reads the recorder only around the steps it hands over: each step handed
    over carries the calls made in it (steps of 1, 2, 0 and 1 calls), none of its
    neighbours'."""
    clock = Clock(CPU)
    timer = StepTimer(clock)
    rec = CommRecorder(clock, world_size=2)
    got: dict = {}
    watch = StepWatch(timer, rec, every, lambda n, st, c: got.__setitem__(n, len(c)))
    watch.begin(0)
    for k in (1, 2, 0, 1):
        with timer.phase("sync"):
            for _ in range(k):
                with rec.timed("all_reduce", 8, 8, 8):
                    pass
        timer.end_step()
    assert list(got.values()) == calls and list(got) == list(range(every, 5, every))


def test_timing_imports_nothing_of_progress():
    """Timing knows nothing of who reads it: no module of ddp_lab/timing/ imports progress."""
    import ast
    from pathlib import Path

    import ddp_lab.timing

    for path in Path(ddp_lab.timing.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""] + [a.name for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            assert not any("heartbeat" in n for n in names), path.name

def _fake_epoch(n_steps: int, overlap: bool = False):
    """Steps of 10 ms (5 phases of 2 ms) and one 3 ms collective per step, in the sync
    phase; with `overlap` a second collective overlaps the first by 1 ms."""
    from ddp_lab.timing import CommCall, CommStats

    steps, calls = [], []
    for i in range(n_steps):
        t = i * 0.010
        steps.append(StepTimes([(p, t + 0.002 * k, t + 0.002 * (k + 1)) for k, p in enumerate(PHASES)]))
        calls.append(CommCall("all_reduce", 100, 150, 150, t + 0.006, t + 0.009))
        if overlap:
            calls.append(CommCall("all_reduce", 100, 150, 150, t + 0.008, t + 0.0095))
    comm = CommStats(calls=len(calls), timed=calls,
                     seconds=union_length([(c.start, c.end) for c in calls]))
    return steps, comm


def test_epoch_timing_comm_fraction_is_in_flight_over_step_time():
    steps, comm = _fake_epoch(20)
    t = epoch_timing(steps, comm)
    assert t["comm_fraction"] == pytest.approx(0.3)
    assert t["comm_step"]["mean"] == pytest.approx(0.003)
    assert t["phases"]["sync"]["mean"] == pytest.approx(0.002)
    steps, comm = _fake_epoch(20, overlap=True)
    assert comm.per_step_seconds(steps) == pytest.approx([0.0035] * 20)  # overlap counted once
    assert epoch_timing(steps, comm)["comm_fraction"] == pytest.approx(0.35)
    assert epoch_timing([], comm)["comm_fraction"] is None


# ------------------------------------------------------------ trace
def test_kept_steps_are_first_and_last_n():
    assert kept_steps(100, 3) == [0, 1, 2, 97, 98, 99]
    assert kept_steps(4, 3) == [0, 1, 2, 3]
    assert kept_steps(10, 0) == []


def test_trace_file_is_valid_chrome_trace_with_expected_slices(tmp_path):
    steps, comm = _fake_epoch(50)
    writer = TraceWriter(tmp_path, rank=1, keep=4)
    writer.add_epoch(1, steps, comm, first_step=0)
    writer.add_epoch(2, steps, comm, first_step=50)
    doc = json.loads((tmp_path / "trace" / "rank1.json").read_text())
    events = doc["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    assert {e["name"] for e in meta} >= {"process_name", "thread_name"}
    slices = [e for e in events if e["ph"] == "X"]
    for e in slices:
        assert {"name", "ph", "ts", "dur", "pid", "tid"} <= set(e)
        assert e["pid"] == 1 and e["dur"] >= 0
    phases = [e for e in slices if e["cat"] == "phase"]
    comms = [e for e in slices if e["cat"] == "comm"]
    assert all(e["tid"] == 1 for e in phases) and all(e["tid"] == COMM_TID + 1 for e in comms)
    assert len(phases) == 2 * 8 * len(PHASES)  # 2 epochs x (first 4 + last 4) x phases
    assert len(comms) == 2 * 8
    kept = sorted({e["args"]["step"] for e in phases})
    assert kept == [0, 1, 2, 3, 46, 47, 48, 49, 50, 51, 52, 53, 96, 97, 98, 99]  # global steps
    assert {e["name"] for e in phases} == set(PHASES)
    first = [e for e in phases if e["args"]["step"] == 0]
    assert first[0]["ts"] == 0.0 and first[0]["dur"] == pytest.approx(2000.0)  # microseconds
    assert comms[0]["args"]["bytes_sent"] == 150


def test_trace_size_is_bounded_however_long_the_epoch():
    short, comm_s = _fake_epoch(20)
    long, comm_l = _fake_epoch(2000)
    assert len(epoch_events(0, 1, short, comm_s, keep=5)) == len(epoch_events(0, 1, long, comm_l, keep=5))


def test_trace_disabled_writes_nothing(tmp_path):
    steps, comm = _fake_epoch(5)
    TraceWriter(tmp_path, rank=0, keep=4, enabled=False).add_epoch(1, steps, comm)
    assert not (tmp_path / "trace").exists()


def _record(epoch, time_s, comm_s=0.03, step_s=0.1, steps=10, resumed_at=None, timing=True):
    comm = {"calls": 20, "payload_bytes": 1000, "bytes_sent": 1500, "bytes_recv": 1500,
            "bus_bytes": 1500.0, "time_s": comm_s, "bytes_exact": True, "bytes_cross_node": None}
    return {"epoch": epoch, "epoch_time_s": time_s, "steps": steps, "timing": timing,
            "resumed_at_step": resumed_at, "step_time_s": step_s, "comm": comm,
            "comm_exposed_s": comm_s / 2, "compute_s": step_s - comm_s}


def test_run_figures_sum_every_epoch_of_every_allocation():
    from ddp_lab.folder.records import run_figures

    # epochs 1-2 in one allocation, 3 split by a stop at step 4 and continued, 4 after it
    recs = [_record(1, 2.0), _record(2, 1.0), _record(3, 1.5, step_s=0.06, resumed_at=4),
            _record(4, 4.0)]
    f = run_figures(recs)
    assert f["epoch_time_s_median"] == pytest.approx(1.75)  # every epoch, not the last
    assert f["epoch_time_s_mean"] == pytest.approx(2.125)
    assert f["steps_run"] == 36  # the split epoch timed its second part only
    assert f["comm_fraction"] == pytest.approx(0.12 / 0.36)
    assert f["comm_bytes_sent"] == 6000 and f["comm_calls"] == 80
    assert f["comm_busbw_GBps"] == pytest.approx(6000 / 0.12 / 1e9)
    assert f["comm_algbw_GBps"] == pytest.approx(4000 / 0.12 / 1e9)
    assert f["step_time_ms_mean"] == pytest.approx(1e3 * 0.36 / 36)
    assert f["comm_bytes_cross_node"] is None  # no record knew the nodes
    # the order of the lines does not matter, an old record without bus_bytes still counts
    old = _record(5, 1.0)
    old["comm"].pop("bus_bytes")
    old["comm"]["busbw_GBps"] = 1500 / 0.03 / 1e9
    assert run_figures([old, *reversed(recs)])["comm_busbw_GBps"] == pytest.approx(7500 / 0.15 / 1e9)


def test_run_figures_timing_off_keeps_bytes():
    from ddp_lab.folder.records import run_figures

    off = run_figures([_record(1, 1.0, timing=False), _record(2, 1.0, timing=False)])
    assert off["comm_fraction"] is None and off["comm_busbw_GBps"] is None
    assert off["comm_bytes_sent"] == 3000  # bytes are counted with the timers off too
    assert run_figures([])["epoch_time_s_median"] is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_timer_times_the_kernels_not_the_launch():
    dev = torch.device("cuda", torch.cuda.current_device())
    clock = Clock(dev)
    torch.cuda.synchronize()
    clock.anchor()
    timer = StepTimer(clock)
    rec = CommRecorder(clock, world_size=2)
    t0 = time.perf_counter()
    with timer.phase("forward"):
        torch.cuda._sleep(50_000_000)  # tens of ms of GPU time, microseconds to launch
    with timer.phase("sync"), rec.timed("all_reduce", 4, 4, 4):
        torch.cuda._sleep(10_000_000)
    timer.end_step()
    launch = time.perf_counter() - t0
    steps, comm = timer.collect(), rec.collect()
    d = steps[0].durations()
    assert d["forward"] > 5 * launch  # the events saw the kernel run; the host clock would not
    assert 0 < comm.seconds <= d["sync"] + 1e-4
    assert steps[0].spans[0][1] >= 0  # on the host time base, after the anchor


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_step_watch_never_waits_for_the_gpu():
    """A step whose kernels are still running is handed over at a later step's end, after
    its events fired; the loop never waits for it."""
    dev = torch.device("cuda", torch.cuda.current_device())
    clock = Clock(dev)
    torch.cuda.synchronize()
    clock.anchor()
    timer, rec = StepTimer(clock), CommRecorder(clock, world_size=2)
    got: list = []
    watch = StepWatch(timer, rec, 1, lambda n, st, calls: got.append(n))
    watch.begin(0)
    seen = []
    for i in range(3):
        seen.append(list(got))
        with timer.phase("forward"):
            torch.cuda._sleep(200_000_000 if i == 0 else 1000)  # step 1: ~0.1 s of GPU time
        with timer.phase("sync"), rec.timed("all_reduce", 4, 4, 4):
            pass
        timer.end_step()
    assert seen[1] == []  # step 1's kernels were still running when step 2 started
    torch.cuda.synchronize()
    assert timer.ready(0) is not None and rec.ready(0, 1) is not None


# ------------------------------------------------------------ sampled steps
def _noisy_epoch(n_steps: int, seed: int = 0):
    """`n_steps` steps of five phases with lognormal noise (and a rare slow step), one
    collective a step that runs past its compute end, the compute end marked in backward."""
    import random

    from ddp_lab.timing import CommCall, CommStats

    rng = random.Random(seed)
    steps, calls, t = [], [], 0.0
    for i in range(n_steps):
        spans = []
        for k, p in enumerate(PHASES):
            d = 0.001 * (k + 1) * rng.lognormvariate(0, 0.25) * (4 if rng.random() < 0.01 else 1)
            spans.append((p, t, t + d))
            t += d
        back = spans[2]
        mark = back[1] + 0.8 * (back[2] - back[1])
        steps.append(StepTimes(spans, mark))
        calls.append(CommCall("all_reduce", 100, 150, 150, mark - 0.0005, spans[3][2]))
    comm = CommStats(calls=len(calls), timed=calls,
                     seconds=union_length([(c.start, c.end) for c in calls]))
    return steps, comm


def _as_sampled(steps, picked):
    """`steps` as the timer leaves them when only `picked` are sampled: the others one span."""
    return [st if i in picked else StepTimes([("step", st.start, st.end)], None, phased=False)
            for i, st in enumerate(steps)]


def test_sampled_phases_agree_with_every_step_phases():
    """One epoch of 938 noisy steps, figured from every step and from the sampled ones the
    records pick (a TensorBoard point every 50, the trace's first and last 10): the step's
    time, comm in flight and the stragglers' per-step comm are the same to the bit; the
    phases' medians and totals, compute and exposed comm agree within 10% (the sampling
    error of ~100 steps under this noise: a few percent), and the phases add up to the step."""
    from ddp_lab.rank.records import sampled_steps

    picked = sampled_steps(0, 938, every=50, keep=10)
    for seed in range(3):
        _agree(*_noisy_epoch(938, seed), picked)


def _agree(steps, comm, picked):
    assert 64 <= len(picked) < 938 / 5
    assert all(i in picked for i in range(49, 938, 50)) and {0, 9, 928, 937} <= picked
    every, some = epoch_timing(steps, comm), epoch_timing(_as_sampled(steps, picked), comm)
    assert every["sampled"] == 938 and some["sampled"] == len(picked)
    assert some["phases"]["step"] == every["phases"]["step"]
    assert some["comm_step"] == every["comm_step"] and some["comm_fraction"] == every["comm_fraction"]
    assert (comm.per_step_seconds(_as_sampled(steps, picked))
            == comm.per_step_seconds(steps))
    for p in PHASES:
        for stat in ("median", "total"):
            assert some["phases"][p][stat] == pytest.approx(every["phases"][p][stat], rel=0.1), (p, stat)
    for key in ("compute_s", "exposed_s"):
        assert some[key] == pytest.approx(every[key], rel=0.1), key
    # the scaled totals add up to the step's time, measured on every step
    assert sum(some["phases"][p]["total"] for p in PHASES) == pytest.approx(
        some["phases"]["step"]["total"], rel=1e-9)
    assert sum(some["phases"][p]["mean"] for p in PHASES) == pytest.approx(
        some["phases"]["step"]["mean"], rel=1e-9)


def test_a_short_epoch_is_sampled_whole_and_a_resumed_part_keeps_the_global_points():
    from ddp_lab.rank.records import MIN_SAMPLED, SAMPLE_ALL, sampled_steps

    assert sampled_steps(0, SAMPLE_ALL, every=7, keep=3) is None
    # a part resumed 123 steps into the run: its points are at the global multiples of 50
    picked = sampled_steps(123, 500, every=50, keep=0)
    assert {i for i in range(500) if (123 + i + 1) % 50 == 0} <= picked
    assert len(picked) >= MIN_SAMPLED


def test_an_unsampled_step_is_one_span_and_its_gradients_stamp_nothing():
    model = torch.nn.Linear(3, 2)
    timer = StepTimer(Clock(CPU))
    timer.watch_grads(model)
    timer.sample({0, 2})
    hooked = []
    for _ in range(4):
        # an unsampled step's backward calls no hook of ours: none is attached
        hooked.append(sum(len(p._post_accumulate_grad_hooks or {}) for p in model.parameters()))
        for p in PHASES:
            with timer.phase(p):
                if p == "backward":
                    model(torch.ones(1, 3)).sum().backward()
        assert timer.now == "optim"  # where the rank is: said on every step
        timer.end_step()
    steps = timer.collect()
    assert [s.phased for s in steps] == [True, False, True, False]
    assert hooked == [2, 0, 2, 0]
    assert [n for n, _, _ in steps[1].spans] == ["step"] and steps[1].compute_end is None
    assert [n for n, _, _ in steps[0].spans] == list(PHASES) and steps[0].compute_end is not None
    assert steps[0].end <= steps[1].start < steps[1].end <= steps[2].start
    # the next epoch's steps count from 0 again, under the set given
    with timer.phase("data"):
        pass
    timer.end_step()
    assert timer.collect()[0].phased
