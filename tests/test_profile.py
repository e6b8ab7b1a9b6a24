"""timing.profile: torch.profiler's traces and DDP's own logging data as witnesses of
ddp_lab's figures (ddp_lab/rank/profile.py, ddp_lab/report/witness.py, docs/timing.md).

Three real 2-rank gloo runs (ddp, allreduce, ring; 20 steps, 5 profiled), made once for
the module: their traces are loaded by Holistic Trace Analysis (HTA), the parser the
issue's users reach for, their comm per step is checked against the profiler's own
events, and DDP's logging data against ddp_lab's comm in flight, within the bands
docs/timing.md states (`witness.EXPECTED`, the one place they live)."""

from __future__ import annotations

import json
import os
import statistics
import types
import warnings

import pytest
import torch

from helpers import QUICK, run_cli, run_dir_of, summary

SYNCS = ("ddp", "allreduce", "ring")
# docs/timing.md: the bands hold on a CPU with room; where the cores are oversubscribed
# (load average above their number: a 2-rank job alone holds 2 cores busy) the threads are
# preempted mid-call at points one clock sees and the other does not (measured there:
# 1.25-1.32), and only a wide band, 0.5-2, is asserted
BUSY_BAND = (0.5, 2.0)
LOAD_AT_RUN: dict[str, float] = {}  # each run's 1-minute load average as it ended


def band(figure: str, sync: str) -> tuple[float, float]:
    """The band for `figure` of `sync`'s run: the docs' own, or the wide one where the
    machine was oversubscribed while the run ran (its end) or is now."""
    from ddp_lab.report.witness import EXPECTED

    load = max(LOAD_AT_RUN.get(sync, 0.0), os.getloadavg()[0])
    busy = load > (os.cpu_count() or 1)
    if busy and figure.startswith("comm in flight"):
        # a pass in the wide band is said, with the load that chose it (pytest's warnings
        # summary): a reader sees which passes held the docs' band and which did not
        warnings.warn(WideBand(f"{sync}: {figure} judged in the wide band {BUSY_BAND}: load "
                               f"average {load:.2f} (at the run's end {LOAD_AT_RUN.get(sync, 0.0):.2f}, "
                               f"now {os.getloadavg()[0]:.2f}) above {os.cpu_count()} cores"))
        return BUSY_BAND
    return EXPECTED[figure]


class WideBand(UserWarning):
    """A witness ratio judged in BUSY_BAND, not the docs' band: the load average beside it."""


# ------------------------------------------------------------ the trace, read here
# The profiler's comm per step recomputed from the raw Kineto trace by this test's own code
# (not ddp_lab.rank.witnesses.trace_figures): torch's collective events (c10d:: and gloo:
# ops, never ddp_lab's `ddp_lab:` ranges) that start inside one of ddp_lab's phases within a
# ProfilerStep; a blocking sync's call lasts until the training thread's next operator (its
# caller waits for it); per step the union of those intervals; the median over the steps.
PHASE_NAMES = {f"ddp_lab:{p}" for p in ("data", "forward", "backward", "sync", "optim")}


def comm_per_step_from_trace(path, blocking: bool) -> tuple[int, float, dict]:
    """(steps, median comm seconds per step, collective counts by name) of one trace file."""
    events = [e for e in json.loads(path.read_text())["traceEvents"]
              if e.get("ph") == "X" and "dur" in e]
    steps = [e for e in events if e["name"].startswith("ProfilerStep#")]
    phases = [(e["ts"], e["ts"] + e["dur"]) for e in events if e["name"] in PHASE_NAMES]
    loop = {e.get("tid") for e in steps}  # the training loop's thread
    ops = sorted(e["ts"] for e in events if e.get("tid") in loop and e.get("cat") == "cpu_op"
                 and not e["name"].startswith(("c10d::", "gloo:")))
    per_step, names = [], {}
    for step in steps:
        s0, s1 = step["ts"], step["ts"] + step["dur"]
        spans = []
        for e in events:
            if not e["name"].startswith(("c10d::", "gloo:")) or not s0 <= e["ts"] < s1:
                continue
            if not any(a <= e["ts"] <= b for a, b in phases):
                continue
            end = e["ts"] + e["dur"]
            if blocking:  # the caller resumes at its thread's next operator
                end = next((t for t in ops if t >= end), end)
            spans.append((e["ts"], end))
            names[e["name"]] = names.get(e["name"], 0) + 1
        covered, reach = 0.0, None  # the union of the spans, walked in start order
        for a, b in sorted(spans):
            if reach is None or a > reach:
                covered += b - a
                reach = b
            elif b > reach:
                covered += b - reach
                reach = b
        per_step.append(covered / 1e6)
    return len(steps), statistics.median(per_step), names


STEPS, SKIP, WINDOW = 20, 5, 5

pytestmark = [pytest.mark.dist]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, shared_data_root):
    """One profiled 2-rank run per sync, one after another (no two compete for the cores)."""
    out = {}
    for sync in SYNCS:
        tmp = tmp_path_factory.mktemp(sync)
        proc = run_cli("launcher.nproc_per_node=2", f"sync={sync}", *QUICK,
                       f"train.max_steps_per_epoch={STEPS}", "train.checkpoint=false",
                       "timing.profile=true", f"timing.profile_skip={SKIP}",
                       f"timing.profile_steps={WINDOW}", f"data.root={shared_data_root}",
                       f"run.root={tmp}", cwd=tmp, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        LOAD_AT_RUN[sync] = os.getloadavg()[0]
        out[sync] = run_dir_of(proc)
    return out


def test_traces_one_per_rank_parse_in_hta(runs):
    from hta.trace_analysis import TraceAnalysis

    folder = runs["ddp"] / "profile"
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.pt.trace.json",
                                                        "rank1.pt.trace.json"]
    t = TraceAnalysis(trace_dir=str(folder))
    assert sorted(t.t.traces) == [0, 1]
    names = set(t.t.symbol_table.get_sym_table())
    # ddp_lab's phases as ranges, the profiler's steps, torch's own collective events
    for name in ("ddp_lab:data", "ddp_lab:forward", "ddp_lab:backward", "ddp_lab:sync",
                 "ddp_lab:optim", "c10d::allreduce_", "gloo:all_reduce"):
        assert name in names, name
    steps = {n for n in names if n.startswith("ProfilerStep#")}
    assert len(steps) == WINDOW, steps
    # the blocking syncs' collectives by name, inside their sync phase
    ring = json.loads((runs["ring"] / "profile" / "rank1.pt.trace.json").read_text())
    ring_names = {e.get("name") for e in ring["traceEvents"]}
    assert {"ddp_lab:all_reduce", "gloo:send", "gloo:recv"} <= ring_names


@pytest.mark.parametrize("sync", SYNCS)
def test_comm_per_step_agrees_with_the_profilers_events(runs, sync):
    from ddp_lab.report.runs import load_run
    from ddp_lab.report.witness import witness_rows

    run = load_run(runs[sync])
    rows = {r["figure"]: r for r in witness_rows(run, str)}
    row = rows["comm in flight per step (profiler)"]
    lo, hi = band(row["figure"], sync)
    assert lo <= row["ratio"] <= hi, (row, LOAD_AT_RUN, os.getloadavg())
    w = summary(runs[sync])["witnesses"]
    for r in w["ranks"]:  # every rank's window: the profiler's steps are ddp_lab's
        assert r["ddp_lab"]["steps"] == r["profiler"]["steps"] == WINDOW, r
        assert r["ddp_lab"]["calls"] == WINDOW, r  # one bucket a step (the MLP)


@pytest.mark.parametrize("sync", SYNCS)
def test_the_witness_is_the_trace_recomputed_here(runs, sync):
    """The profiler's figure in summary.json is what the raw trace files say (recomputed
    by this test), and the witness table's ratio is ddp_lab's figure over that one: a ratio
    of exactly 1.0 is refused (a witness that is ddp_lab's own figure again)."""
    from ddp_lab.report.runs import load_run
    from ddp_lab.report.witness import witness_rows

    blocking = sync != "ddp"  # every sync but ddp (and sync.overlap) waits for its calls
    ranks = summary(runs[sync])["witnesses"]["ranks"]
    theirs = []
    for r in ranks:
        steps, comm, names = comm_per_step_from_trace(runs[sync] / r["trace"], blocking)
        assert steps == WINDOW and comm > 0, (sync, r)
        assert r["profiler"]["comm_per_step_s"] == pytest.approx(comm, rel=1e-9, abs=1e-9), (r, comm)
        assert r["profiler"]["events"] == names, (r, names)
        assert r["ddp_lab"]["comm_per_step_s"] != pytest.approx(comm, rel=1e-9), \
            f"ddp_lab's figure is the trace's to the last digit: {r}"
        theirs.append(comm)
    ours = statistics.mean(r["ddp_lab"]["comm_per_step_s"] for r in ranks)
    row = {r["figure"]: r for r in witness_rows(load_run(runs[sync]), str)}[
        "comm in flight per step (profiler)"]
    assert row["ratio"] != 1.0, f"a ratio of exactly 1.0: the witness is ddp_lab's own figure: {row}"
    assert row["witness"] == pytest.approx(statistics.mean(theirs), rel=1e-9), (row, theirs)
    assert row["ratio"] == pytest.approx(ours / statistics.mean(theirs), rel=1e-9), (row, ours, theirs)


def test_ddp_logging_data_beside_ours(runs):
    from ddp_lab.report.runs import load_run
    from ddp_lab.report.witness import witness_rows

    d = summary(runs["ddp"])["ddp_timing"]
    # every iteration logged; the preflight's taken out; the last is logged by no forward
    assert d["every_iteration"] and d["preflight_excluded"], d
    assert d["iterations"] == STEPS - 1, d
    assert d["ddp_lab"]["steps"] == STEPS
    for k in ("forward_compute_time_s", "backward_compute_time_s", "backward_comm_time_s",
              "backward_compute_comm_overlap_time_s"):
        assert 0 <= d[k] < 1, (k, d)
    rows = {r["figure"]: r for r in witness_rows(load_run(runs["ddp"]), str)}
    row = rows["backward comm per step (DDP)"]
    lo, hi = band(row["figure"], "ddp")
    assert lo <= row["ratio"] <= hi, (row, LOAD_AT_RUN, os.getloadavg())
    # no DDP, no DDP figures
    assert summary(runs["allreduce"])["ddp_timing"] is None


def test_the_report_sets_them_side_by_side(runs, tmp_path):
    proc = run_cli(*(str(p) for p in runs.values()), "--out", str(tmp_path / "rep"),
                   "--no-plots", cwd=tmp_path, module="ddp_lab.report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    md = (tmp_path / "rep" / "report.md").read_text()
    section = md[md.index("## Independent witnesses"):]
    assert section.count("| comm in flight per step (profiler) |") == 3, section
    assert "backward comm per step (DDP)" in section
    # a line under the table for each ratio outside its band, and only for those
    outside = [r for r in doc_rows(tmp_path) if r["agrees"] is False]
    assert section.count("outside the expected") == len(outside), section
    assert {r["sync"] for r in doc_rows(tmp_path)} == set(SYNCS)


def doc_rows(tmp_path) -> list[dict]:
    return json.loads((tmp_path / "rep" / "report.json").read_text())["witnesses"]


def test_the_window_unwraps_and_off_wraps_nothing(tmp_path):
    """The phases are labelled for the window only: after it, the timer's and recorder's
    methods are the classes' own again; with the key off nothing is made at all."""
    from ddp_lab.rank.profile import make_profiler
    from ddp_lab.timing import Clock, CommRecorder, StepTimer

    clock = Clock(torch.device("cpu"))
    timer, comm = StepTimer(clock), CommRecorder(clock, 1)
    syncer = types.SimpleNamespace(comm=comm, wrapped=torch.nn.Linear(2, 2))
    off = types.SimpleNamespace(profile=False, profile_skip=1, profile_steps=2)
    assert make_profiler(off, 0, clock.device, tmp_path, timer, syncer) is None
    assert "phase" not in vars(timer) and "timed" not in vars(comm)
    on = types.SimpleNamespace(profile=True, profile_skip=1, profile_steps=2)
    prof = make_profiler(on, 0, clock.device, tmp_path, timer, syncer)
    assert "phase" in vars(timer) and "timed" in vars(comm)
    for _ in range(3):
        with timer.phase("forward"):
            with comm.timed("all_reduce", 4, 4, 4):
                torch.ones(3).sum()
        timer.end_step()
    assert "phase" not in vars(timer) and "timed" not in vars(comm)
    assert timer.on_step_end is None
    trace = json.loads((tmp_path / "profile" / "rank0.pt.trace.json").read_text())
    names = [e.get("name") for e in trace["traceEvents"]]
    assert names.count("ddp_lab:forward") == 2 and names.count("ddp_lab:all_reduce") == 2
    assert prof.written


def test_a_bad_window_is_one_line(tmp_path):
    proc = run_cli("timing.profile=true", "timing.profile_steps=0", "launcher.dry_run=true",
                   cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "timing.profile_steps" in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr
