"""The combinations a student makes, end to end, and every run-level figure checked against
the raw records: a single run, a Hydra sweep, a resume on the same world and on another, a
mid-epoch stop and continue, an mpirun run, two benches of different implementations, a
local study; then the report and TensorBoard over all of them.

Each capability has its own tests; this one tests the joins. The figures are recomputed here
from metrics.jsonl with plain arithmetic (not with ddp_lab's `run_figures`, which would check
the code against itself): epoch medians and means over all epochs, comm totals, the comm
share, start-up from the job's own start, world and hosts as run."""

from __future__ import annotations

import json
import shutil
import signal
import statistics
import subprocess
import time
from pathlib import Path

import pytest
from helpers import PY, child_env, describe, run_cli, run_dir_of, summary, tensorboard

from ddp_lab.folder import heartbeat
from ddp_lab.folder.tensorboard import RUN_METRICS

# the slow tier: minutes of real runs (a sweep, resumes, mpirun, benches, a study), each
# capability already tested on its own in the fast tier; this module tests their joins
pytestmark = [pytest.mark.slow]

TRAIN = ["train.epochs=2", "train.max_steps_per_epoch=15", "train.eval_batch_size=2000",
         "log.progress=lines", "launcher.nproc_per_node=2"]


class Made:
    """The runs the scenario made, and how long each command took (start-up must fit)."""

    def __init__(self, root: Path):
        self.root = root
        self.trainings: dict[str, Path] = {}  # name -> run folder
        self.walls: dict[str, float] = {}  # command -> seconds it took
        self.sweep: list[Path] = []
        self.study: list[Path] = []

    def cli(self, name: str, *args: str, module: str = "ddp_lab") -> subprocess.CompletedProcess:
        t = time.monotonic()
        proc = run_cli(*args, f"run.root={self.root}", cwd=self.root, module=module, timeout=300)
        self.walls[name] = time.monotonic() - t
        assert proc.returncode == 0, describe(proc)
        return proc


def _stop_mid_epoch(made: Made, run_dir: Path, *args: str) -> None:
    """Start a run, SIGTERM it once both ranks are 20 steps in: a mid-epoch checkpoint."""
    cmd = [PY, "-m", "ddp_lab", f"run.dir={run_dir}", *args]
    proc = subprocess.Popen(cmd, cwd=made.root, env=child_env(), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            recs = heartbeat.read_all(run_dir)
            if len(recs) == 2 and all(r["state"] == "running" and r["step"] >= 20 for r in recs):
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    s = summary(run_dir)
    assert s["status"] == "stopped" and 0 < s["step_in_epoch"] < 300, f"{s['status']}\n{out}\n{err}"


@pytest.fixture(scope="module")
def made(tmp_path_factory, shared_data_root) -> Made:
    root = tmp_path_factory.mktemp("scenario")
    m = Made(root)
    data = f"data.root={shared_data_root}"
    # a single run, then continued on the same world, then on another (weak scaling)
    single = run_dir_of(m.cli("single", *TRAIN, data))
    m.cli("resume_same", *TRAIN, data, f"run.dir={single}", "train.resume=true", "train.epochs=3")
    m.cli("resume_other", *TRAIN, data, f"run.dir={single}", "train.resume=true", "train.epochs=4",
          "launcher.nproc_per_node=1", "train.allow_world_change=true")
    m.trainings["resumed"] = single
    # a Hydra sweep of two jobs, one after another (every synchroniser through every
    # consumer: tests/test_every_setting.py)
    proc = m.cli("sweep", "-m", "sync=ddp,ring", *TRAIN, "train.epochs=1", data)
    m.sweep = [Path(ln.removeprefix("run dir: ")) for ln in proc.stdout.splitlines()
               if ln.startswith("run dir: ")]
    assert len(m.sweep) == 2, describe(proc)
    m.trainings.update({f"sweep{i}": d for i, d in enumerate(m.sweep)})
    # a mid-epoch stop and its continuation (slowed so a stop lands mid-epoch)
    stopped = root / "stopped"
    slow = [*TRAIN, data, "train.max_steps_per_epoch=300", "train.stop_check_s=0.2",
            "debug.jitter_ms=8"]
    _stop_mid_epoch(m, stopped, *slow)
    m.cli("continued", *slow, f"run.dir={stopped}")
    m.trainings["stopped"] = stopped
    # an mpirun run
    if shutil.which("mpirun"):
        m.trainings["mpirun"] = run_dir_of(m.cli(
            "mpirun", "launcher=mpirun", "launcher.hosts=[localhost:2]", "dist.init_timeout_s=30",
            *[a for a in TRAIN if not a.startswith("launcher.")], data))
    # two benches of different implementations
    for name, impl in (("bench_torch", "[torch]"), ("bench_ours", "[torch,ring,tree]")):
        m.cli(name, "launcher.nproc_per_node=2", "bench.max_elements=16384", "bench.points=3",
              f"bench.impl={impl}", module="ddp_lab.bench")
    # a local study: one job per point
    proc = m.cli("study", "study=scaling", "study.worlds=[1,2]", "study.repeats=1", "sync=ring",
                 *[a for a in TRAIN if not a.startswith("launcher.")], data)
    study = run_dir_of(proc)  # the study's folder, its points inside
    m.study = sorted(p.parent for p in study.glob("points/*/summary.json"))
    assert len(m.study) == 2, describe(proc)
    m.trainings.update({f"study{i}": d for i, d in enumerate(m.study)})
    return m


def _records(run_dir: Path) -> list[dict]:
    return [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines() if ln.strip()]


def _expected(run_dir: Path) -> dict:
    """The run-level figures, recomputed from the raw records by hand."""
    recs = _records(run_dir)
    s = summary(run_dir)
    times = [r["epoch_time_s"] for r in recs]
    step_s = sum(r["phase_s"]["step"]["total"] for r in recs)
    comm_s = sum(r["comm"]["time_s"] for r in recs)
    hosts = []
    for seg in s["segments"]:
        hosts += [h for h in seg["hosts"] if h not in hosts]
    return {
        "epoch_time_s_median": statistics.median(times), "epoch_time_s_mean": statistics.mean(times),
        "comm_bytes_sent": sum(r["comm"]["bytes_sent"] for r in recs),
        "comm_bytes_recv": sum(r["comm"]["bytes_recv"] for r in recs),
        "comm_calls": sum(r["comm"]["calls"] for r in recs),
        "comm_time_s": comm_s, "comm_fraction": comm_s / step_s,
        "steps_run": sum(r["steps"] - (r.get("resumed_at_step") or 0) for r in recs),
        "world_size": recs[-1]["world_size"], "hosts": hosts,
    }


def test_every_run_level_figure_comes_from_all_its_records(made):
    for name, run_dir in made.trainings.items():
        s, want = summary(run_dir), _expected(run_dir)
        assert s["status"] == "completed", (name, s["status"])
        assert len(_records(run_dir)) == s["epochs"], name  # every epoch, none twice
        for key, value in want.items():
            got = s[key]
            ok = got == pytest.approx(value, rel=1e-9) if isinstance(value, float) else got == value
            assert ok, f"{name}: summary.json {key} = {got}, the records say {value}"
        assert s["world_size"] == s["segments"][-1]["world_size"], name


def test_resumed_runs_keep_each_allocation_apart(made):
    segs = summary(made.trainings["resumed"])["segments"]
    assert [g["world_size"] for g in segs] == [2, 2, 1]
    assert [g["epochs_done"] for g in segs] == [2, 1, 1]
    recs = _records(made.trainings["resumed"])
    assert [r["world_size"] for r in recs] == [2, 2, 2, 1]
    assert segs[-1]["epoch_time_s_median"] == recs[-1]["epoch_time_s"]  # its own, not the run's
    stopped = summary(made.trainings["stopped"])["segments"]
    assert [g["status"] for g in stopped] == ["stopped", "completed"] and stopped[0]["end_step"] > 0


def test_start_up_counts_from_each_jobs_own_start(made):
    for name, run_dir in made.trainings.items():
        for seg in summary(run_dir)["segments"]:
            assert 0 < seg["startup_s"] < 120, (name, seg)
    # a command's jobs run one after another: their start-ups fit in its wall time
    sweep = [summary(d)["segments"][0]["startup_s"] for d in made.sweep]
    assert sum(sweep) < made.walls["sweep"], (sweep, made.walls["sweep"])
    study = [summary(d)["segments"][0]["startup_s"] for d in made.study]
    assert sum(study) < made.walls["study"], (study, made.walls["study"])
    single = summary(made.trainings["resumed"])["segments"]
    for seg, cmd in zip(single, ("single", "resume_same", "resume_other")):
        assert seg["startup_s"] < made.walls[cmd], (cmd, seg["startup_s"], made.walls[cmd])


def test_tensorboard_says_what_summary_json_says(made):
    for name, run_dir in made.trainings.items():
        s, acc = summary(run_dir), tensorboard(run_dir)
        for name_, key in (("epoch_time_s", "epoch_time_s_median"),
                           ("comm_fraction", "comm_fraction"), ("test_accuracy", "test_accuracy")):
            tag = RUN_METRICS[name_]
            last = acc.Scalars(tag)[-1].value
            assert last == pytest.approx(s[key], rel=1e-5), f"{name}: TensorBoard {tag} {last}, summary {s[key]}"


def test_the_report_over_all_of_them(made):
    proc = run_cli(str(made.root), f"--out={made.root / 'report'}", cwd=made.root,
                   module="ddp_lab.report", timeout=300)
    assert proc.returncode == 0, describe(proc)
    doc = json.loads((made.root / "report" / "report.json").read_text())
    by_run = {}
    for group in doc["scaling"]:
        for row in group["rows"]:
            for run in row["runs"]:
                by_run[Path(run)] = row
    for name, run_dir in made.trainings.items():
        row, s = by_run.get(run_dir), summary(run_dir)
        assert row is not None, f"{name}: not in the report"
        if row["runs"] == [str(run_dir)]:  # a row of one run: its figures are the run's
            assert row["world_size"] == s["world_size"], name
            assert row["comm_fraction"] == pytest.approx(s["comm_fraction"]), name
    assert len(doc["bench_runs"]) == 2
