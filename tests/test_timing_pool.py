"""Timing that costs nothing on a GPU (issue 32), tested on CPU with a fake event: a CUDA
clock's stamps come from a pool and go back to it once read, a step records one event
per phase boundary, and nothing synchronizes inside a step. The same on a real GPU
at the end (skipped without CUDA)."""

from __future__ import annotations

import time

import pytest
import torch

from ddp_lab.timing import PHASES, Clock, CommRecorder, StepTimer, StepWatch

CPU = torch.device("cpu")


class FakeEvent:
    """What the clock needs of a torch.cuda.Event: record, query, elapsed_time (ms)."""

    recorded = 0

    def __init__(self) -> None:
        self.t = None

    def record(self) -> None:
        FakeEvent.recorded += 1
        self.t = time.perf_counter()

    def query(self) -> bool:
        return True

    def elapsed_time(self, end: "FakeEvent") -> float:
        return (end.t - self.t) * 1e3


class SpyClock(Clock):
    """A CUDA-like clock on fake events that counts its synchronizes."""

    def __init__(self) -> None:
        super().__init__(CPU, event=FakeEvent)
        self.syncs = 0

    def synchronize(self) -> None:
        self.syncs += 1


def run_epoch(timer: StepTimer, rec: CommRecorder, steps: int) -> None:
    for _ in range(steps):
        for p in PHASES:
            with timer.phase(p):
                if p == "sync":
                    with rec.timed("all_reduce", 8, 8, 8):
                        pass
        timer.end_step()


def test_a_step_records_one_event_per_phase_boundary():
    clock = SpyClock()
    clock.anchor()
    timer = StepTimer(clock)
    before = FakeEvent.recorded
    run_epoch(timer, CommRecorder(clock, 2, enabled=False), 4)
    assert FakeEvent.recorded - before == 4 * (len(PHASES) + 1)
    steps = timer.collect()
    for st in steps:
        assert [n for n, _, _ in st.spans] == list(PHASES)
        assert all(a[2] == b[1] for a, b in zip(st.spans, st.spans[1:]))  # shared boundaries
        assert all(s <= e for _, s, e in st.spans)


def test_events_go_back_to_the_pool_after_collect():
    clock = SpyClock()
    clock.anchor()
    timer, rec = StepTimer(clock), CommRecorder(clock, 2)
    run_epoch(timer, rec, 5)
    first = clock.made
    assert first == 5 * (len(PHASES) + 1) + 5 * 2  # the boundaries, a call's two (and the
    timer.collect(), rec.collect()                 # anchor, made once, kept)
    assert len(clock._free) == first  # each once
    for _ in range(3):  # later epochs make none
        clock.anchor()
        run_epoch(timer, rec, 5)
        steps, comm = timer.collect(), rec.collect()
        assert len(steps) == 5 and len(comm.timed) == 5
    assert clock.made == first


def test_no_synchronize_inside_a_step():
    """Timing reads the events once per epoch (`collect`); the per-step TensorBoard points
    (StepWatch) only ask whether every tb_every-th step's events fired: no wait."""
    clock = SpyClock()
    clock.anchor()
    timer, rec = StepTimer(clock), CommRecorder(clock, 2)
    got: list = []
    watch = StepWatch(timer, rec, 10, lambda n, st, calls: got.append(n))
    watch.begin(0)
    run_epoch(timer, rec, 50)
    assert clock.syncs == 0
    assert got == [10, 20, 30, 40, 50]
    timer.collect(), rec.collect()
    assert clock.syncs == 2  # one each, at the epoch's end


def test_cpu_clock_is_the_host_clock_as_before():
    clock = Clock(CPU)
    assert not clock.cuda and clock.stamp is time.perf_counter
    timer = StepTimer(clock)
    run_epoch(timer, CommRecorder(clock, 2), 2)
    clock.release([1.0])  # nothing to hand back on CPU
    assert clock.made == 0 and clock._free == []
    steps = timer.collect()
    assert len(steps) == 2 and all(isinstance(s, float) for _, s, _ in steps[0].spans)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_pool_makes_no_event_after_the_first_epoch():
    clock = Clock(torch.device("cuda", torch.cuda.current_device()))
    timer, rec = StepTimer(clock), CommRecorder(clock, 2)
    for _ in range(2):
        torch.cuda.synchronize()
        clock.anchor()
        run_epoch(timer, rec, 20)
        steps = timer.collect()
        rec.collect()
        made = clock.made
        assert len(steps) == 20
    assert clock.made == made == 20 * (len(PHASES) + 1) + 20 * 2


def test_an_unsampled_step_records_two_events_and_hands_them_back():
    """The CUDA path of `StepTimer.sample`: a sampled step one event per boundary (and one for
    its compute end), another its start and end only; every event back in the pool."""
    clock = SpyClock()
    clock.anchor()
    timer = StepTimer(clock)
    model = torch.nn.Linear(3, 2)
    timer.watch_grads(model)
    timer.sample({0})
    before = FakeEvent.recorded
    for i in range(3):
        for p in PHASES:
            with timer.phase(p):
                if p == "backward":
                    model(torch.ones(1, 3)).sum().backward()
        timer.end_step()
        recorded, before = FakeEvent.recorded - before, FakeEvent.recorded
        # the mark re-records its one event per gradient: 2 parameters
        assert recorded == (len(PHASES) + 1 + 2 if i == 0 else 2), i
    steps = timer.collect()
    assert [s.phased for s in steps] == [True, False, False]
    assert steps[0].compute_end is not None and steps[1].compute_end is None
    assert len(clock._free) == clock.made
