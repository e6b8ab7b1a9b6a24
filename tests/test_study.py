"""`python -m ddp_lab study=scaling ...` (ddp_lab/command/study.py): a ladder of world sizes in one
command, with real torchrun per point; continued on its folder; bad worlds refused."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import PY, child_env, describe, run_cli, summary
from test_report_plots import legend_clear_of_axes

from ddp_lab.report import plots

SMALL = ["train.epochs=2", "train.max_steps_per_epoch=15", "train.eval_batch_size=2000",
         "log.progress=lines"]


def study_dir_of(proc: subprocess.CompletedProcess) -> Path:
    lines = proc.stdout.rstrip().splitlines()
    assert lines and lines[-1].startswith("run dir: "), describe(proc)
    assert lines[-2].startswith("study dir: ") and lines[-2][11:] == lines[-1][9:], describe(proc)
    return Path(lines[-1].removeprefix("run dir: "))


def study_json(folder: Path) -> dict:
    return json.loads((folder / "study.json").read_text())


@pytest.mark.slow  # real torchrun jobs, several per test
@pytest.mark.dist
def test_local_study_completes_then_continues_without_rerunning(tmp_path, shared_data_root):
    args = ["study=scaling", "study.worlds=[1,2]", "study.repeats=2", "sync=ring", *SMALL,
            f"run.root={tmp_path / 'runs'}", f"data.root={shared_data_root}"]
    proc = run_cli(*args, cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    folder = study_dir_of(proc)
    assert folder.parent == tmp_path / "runs" / "studies"
    plan = study_json(folder)
    assert plan["status"] == "completed"
    assert [(p["world"], p["repeat"]) for p in plan["points"]] == [(1, 1), (2, 1), (1, 2), (2, 2)]
    assert [p["status"] for p in plan["points"]] == ["completed"] * 4
    started = []
    for p in plan["points"]:
        run = folder / p["folder"]
        s = summary(run)
        assert s["status"] == "completed" and s["world_size"] == p["world"], s
        assert s["study"] == {"id": folder.name, "world": p["world"], "repeat": p["repeat"],
                              "index": p["index"]}
        assert s["sync"] == "ring" and s["nodes"] == 1 and s["nproc_per_node"] == p["world"]
        started.append(s["segments"][0]["start"])
        assert (f"[study] point {p['index']}/4: world {p['world']}, repeat {p['repeat']}: "
                f"completed, median epoch ") in proc.stdout
    assert started == sorted(started)  # run in the plan's (interleaved) order
    report = folder / "report" / "report.md"
    assert f"report: {report}" in proc.stdout
    text = report.read_text()
    assert all(p["folder"].split("/")[-1] in text for p in plan["points"]), text
    # the repeats are one point each: mean with its interval; the speedup and efficiency
    # are world 2's against world 1, never a repeat's against another
    (group,) = json.loads((folder / "report" / "report.json").read_text())["scaling"]
    assert [r["world_size"] for r in group["rows"]] == [1, 2], group
    for row, world in zip(group["rows"], (1, 2)):
        assert row["time_n"] == 2 and len(row["runs"]) == 2, row
        assert {Path(r).name for r in row["runs"]} == {f"w{world}_r1", f"w{world}_r2"}
        assert row["epoch_time_s_ci95"] is None, row  # two repeats: no interval is meaningful
    w2 = group["rows"][1]
    assert w2["speedup"] > 0 and w2["efficiency"] > 0 and w2["speedup_ci95"] is None, w2
    assert "95% CI" in text and "| n |" in text and "n=2: not meaningful" in text, text
    # what a person sees: one screen in the terminal, and plots read through matplotlib
    from matplotlib.container import ErrorbarContainer

    rep = run_cli(str(folder), "-o", str(tmp_path / "screen"), cwd=tmp_path, module="ddp_lab.report")
    assert rep.returncode == 0, describe(rep)
    screen = rep.stdout.splitlines()
    assert len(screen) <= 40, rep.stdout
    rows = [ln.split() for ln in screen if ln.startswith("  ring  ")]
    assert [r[:4] for r in rows] == [["ring", "1", "1x1", "2"], ["ring", "2", "1x2", "2"]], rep.stdout
    assert all(" ".join(r[5:8]) == "n=2: not meaningful" for r in rows), rep.stdout
    assert f"  {tmp_path / 'screen' / 'epoch_time_vs_world.png'}" in screen
    assert screen[-1] == f"Full report: {tmp_path / 'screen' / 'report.md'}"
    fig, info = plots.epoch_time_figure(json.loads((tmp_path / "screen" / "report.json")
                                                   .read_text())["scaling"])
    legend_clear_of_axes(fig)
    assert len(fig.axes) == 2 and all(ax.get_ylim()[0] == 0 for ax in fig.axes)
    assert fig.axes[0].get_title().endswith("n=2 at every point") and not fig.axes[0].texts
    assert not any(isinstance(c, ErrorbarContainer) for ax in fig.axes for c in ax.containers)
    assert "n=2: interval\nnot meaningful (no bar)" in [t.get_text() for t in fig.legends[0].texts]
    phases = json.loads((tmp_path / "screen" / "phases.json").read_text())
    assert phases["bars"] == ["1 rank\n2 runs", "2 ranks\n2 runs"]

    # the same command on the folder: every point is kept, nothing runs again
    before = {p["folder"]: (folder / p["folder"] / "summary.json").read_bytes()
              for p in plan["points"]}
    again = run_cli(*args, f"run.dir={folder}", cwd=tmp_path)
    assert again.returncode == 0, describe(again)
    assert study_dir_of(again) == folder
    kept = [ln for ln in again.stdout.splitlines()
            if ln.startswith("[study] point ") and ln.endswith(": completed earlier, kept")]
    assert len(kept) == 4, describe(again)
    assert "starting" not in again.stdout
    assert {k: (folder / k / "summary.json").read_bytes() for k in before} == before


@pytest.mark.slow  # real torchrun jobs, several per test
@pytest.mark.dist
def test_stopped_study_resumes_with_the_missing_points_only(tmp_path, shared_data_root):
    """Ctrl-C while point 2 trains: it checkpoints and no new point starts; the same command
    on the folder keeps point 1 and resumes point 2."""
    folder = tmp_path / "study"
    # point 2 trains long enough (2 x 100 steps) for a stop check (every 0.2 s) to catch it
    args = ["study=scaling", "study.worlds=[1,2]", "study.repeats=1", "sync=ddp",
            "train.epochs=2", "train.max_steps_per_epoch=100", "train.stop_check_s=0.2",
            "train.eval_batch_size=2000", "log.progress=lines", f"run.dir={folder}",
            f"data.root={shared_data_root}"]
    log = tmp_path / "console.txt"  # a file, not a pipe: nobody reads a pipe while it runs
    with open(log, "w") as console:
        proc = subprocess.Popen([PY, "-m", "ddp_lab", *args], cwd=tmp_path, env=child_env(),
                                stdout=console, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:
            rank0 = folder / "points/w2_r1/logs/rank0.log"
            if rank0.is_file() and " world 2 " in rank0.read_text(errors="replace"):
                break  # point 2 trains
            assert proc.poll() is None, log.read_text()
            time.sleep(0.2)
        else:
            pytest.fail("point 2 did not start training in 300 s")
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = log.read_text()
    assert proc.returncode in (75, 130), out
    assert "no new point starts" in out, out
    plan = study_json(folder)
    assert plan["status"] == "stopped" and plan["points"][0]["status"] == "completed", plan
    assert "Continue with:" in out and f"run.dir={folder}" in out
    assert not (folder / "report").exists()
    first = (folder / "points/w1_r1/summary.json").read_bytes()
    assert summary(folder / "points/w2_r1")["status"] == "stopped"
    assert any((folder / "points/w2_r1/checkpoints").iterdir())

    again = run_cli(*args, cwd=tmp_path)
    assert again.returncode == 0, describe(again)
    assert "[study] point 1/2: world 1, repeat 1: completed earlier, kept" in again.stdout
    assert "[study] point 2/2: world 2, repeat 1: starting" in again.stdout
    assert (folder / "points/w1_r1/summary.json").read_bytes() == first
    assert study_json(folder)["status"] == "completed"
    s = summary(folder / "points/w2_r1")
    assert s["status"] == "completed" and len(s["segments"]) == 2, s["segments"]  # resumed


@pytest.mark.slow  # real torchrun jobs, several per test
@pytest.mark.dist
def test_sweep_runs_one_study_per_job_side_by_side(tmp_path, shared_data_root):
    proc = run_cli("-m", "sync=ddp,ring", "study=scaling", "study.worlds=[1]", "study.repeats=1",
                   "train.epochs=1", "train.max_steps_per_epoch=10", "log.progress=lines",
                   f"run.root={tmp_path / 'runs'}", f"data.root={shared_data_root}",
                   f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    studies = sorted(p.parent for p in (tmp_path / "sweep").glob("*/study.json"))
    assert [s.name for s in studies] == ["0_ddp_mlp_local", "1_ring_mlp_local"]
    for s, sync in zip(studies, ("ddp", "ring")):
        assert study_json(s)["status"] == "completed"
        assert summary(s / "points/w1_r1")["sync"] == sync
    table = proc.stdout.rstrip().splitlines()[-3:]  # a sweep ends with its table of jobs
    assert [row.split()[:3] for row in table[:2]] == [
        ["#0", "sync=ddp", str(studies[0])], ["#1", "sync=ring", str(studies[1])]], describe(proc)
    assert table[-1] == "all 2 job(s) ok", describe(proc)
    # the last study's report covers the whole sweep
    text = (tmp_path / "sweep" / "report" / "report.md").read_text()
    assert "ddp" in text and "ring" in text


@pytest.mark.slow
@pytest.mark.mpi
def test_mpirun_study_runs_each_point_on_a_subset_of_the_slots(tmp_path, shared_data_root):
    proc = run_cli("study=scaling", "study.worlds=[1,2]", "study.repeats=1", "launcher=mpirun",
                   "launcher.hosts=[localhost:2]", "study.report=false", "train.epochs=1",
                   "train.max_steps_per_epoch=10", "log.progress=lines",
                   f"run.root={tmp_path / 'runs'}", f"data.root={shared_data_root}", cwd=tmp_path)
    assert proc.returncode == 0, describe(proc)
    folder = study_dir_of(proc)
    for world in (1, 2):
        point = folder / f"points/w{world}_r1"
        assert (point / "hostfile").read_text() == f"localhost slots={world}\n"
        s = summary(point)
        assert s["status"] == "completed" and s["world_size"] == world and s["launcher"] == "mpirun"


@pytest.mark.parametrize("overrides,message", [
    (["study.worlds=[1,100]"], "error: study.worlds has 100: launcher=local runs"),
    (["study.worlds=[]"], "error: study.worlds is empty"),
    (["study.repeats=0"], "error: study.repeats=0: must be >= 1"),
    (["study.order=random"], "error: study.order=random: choose interleaved or grouped"),
    (["launcher=runai"], "error: launcher=runai: a study is not supported yet"),
    (["launcher=slurm", "launcher.nodes=2", "launcher.nproc_per_node=2", "study.worlds=[1,3]"],
     "error: study.worlds has 3: the allocation is launcher.nodes=2 x launcher.nproc_per_node=2"),
    (["launcher=mpirun", "launcher.hosts=[localhost:2]", "study.worlds=[1,4]"],
     "error: study.worlds has 4: the hosts give 2 slot(s)"),
])
def test_bad_study_exits_2_with_one_line(tmp_path, overrides, message):
    proc = run_cli("study=scaling", *overrides, f"run.root={tmp_path / 'runs'}", cwd=tmp_path,
                   timeout=120)
    assert proc.returncode == 2, describe(proc)
    assert proc.stderr.startswith(message) and proc.stderr.count("\n") == 1, proc.stderr
    assert not (tmp_path / "runs").exists()  # nothing made


def test_study_folder_holding_another_plan_is_refused(tmp_path):
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "study.json").write_text(json.dumps({
        "worlds": [1, 2], "repeats": 1, "order": "interleaved", "launcher": "local",
        "points": [{"world": 1, "repeat": 1}, {"world": 2, "repeat": 1}]}))
    proc = run_cli("study=scaling", "study.worlds=[1,2,4]", f"run.dir={folder}", cwd=tmp_path,
                   timeout=120)
    assert proc.returncode == 2, describe(proc)
    assert "holds a study of worlds [1, 2] x 1 repeat(s)" in proc.stderr
    assert not (folder / "points").exists()


# ------------------------------------------------------------------ the plan, no processes
def test_plan_orders_and_fits_each_launcher(tmp_path):
    from ddp_lab.config import load_run_config
    from ddp_lab.folder.rundir import write_config
    from ddp_lab.command.study import plan, point_config, resolve_study
    from helpers import compose

    base = resolve_study(compose("study=scaling", "study.worlds=[1,2]", "study.repeats=2",
                                 f"run.root={tmp_path}"))
    assert [(p.world, p.repeat) for p in plan(base)] == [(1, 1), (2, 1), (1, 2), (2, 2)]
    grouped = resolve_study(compose("study=scaling", "study.worlds=[1,2]", "study.repeats=2",
                                    "study.order=grouped", f"run.root={tmp_path}"))
    assert [(p.world, p.repeat) for p in plan(grouped)] == [(1, 1), (1, 2), (2, 1), (2, 2)]

    slurm = resolve_study(compose("study=scaling", "study.worlds=[1,2,4]", "launcher=slurm",
                                  "launcher.nodes=2", "launcher.nproc_per_node=2",
                                  f"run.root={tmp_path}"))
    assert [(p.nodes, p.nproc_per_node) for p in plan(slurm)][:3] == [(1, 1), (1, 2), (2, 2)]
    mpi = resolve_study(compose("study=scaling", "study.worlds=[1,3]", "launcher=mpirun",
                                "launcher.hosts=[red01:2,orange07:2]",
                                "launcher.master_addr=10.0.0.1", f"run.root={tmp_path}"))
    assert [p.hosts for p in plan(mpi)][:2] == [["red01:1"], ["red01:2", "orange07:1"]]

    # a point's config is an ordinary run's: the worker reads it back, study_point included
    point = plan(base)[1]
    cfg = point_config(base, point, tmp_path, "s1")
    write_config(cfg, tmp_path)
    back = load_run_config(tmp_path)
    assert back.study is None and back.launcher.nproc_per_node == 2
    assert dict(back.study_point) == {"id": "s1", "world": 2, "repeat": 1, "index": 2}


def test_slurm_study_script_renders_one_allocation(tmp_path):
    proc = run_cli("study=scaling", "study.worlds=[1,2,4]", "study.repeats=1", "launcher=slurm",
                   "launcher.nodes=2", "launcher.nproc_per_node=2", "launcher.dry_run=true",
                   f"run.root={tmp_path / 'runs'}", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, describe(proc)
    folder = study_dir_of(proc)
    script = (folder / "study.sbatch").read_text()
    assert "#SBATCH --nodes=2" in script and script.count("\nrun_point ") == 3
    assert "run_point 3 2 2 points/w4_r1" in script and "--ntasks=$NODES" in script
    assert subprocess.run(["bash", "-n", str(folder / "study.sbatch")]).returncode == 0
    assert all((folder / f"points/w{w}_r1/config.yaml").is_file() for w in (1, 2, 4))


def test_slurm_study_picks_the_first_nodes_without_a_pipe_into_head(tmp_path):
    """A point on fewer nodes than the allocation takes the first ones. The script runs under
    `set -euo pipefail`: `echo "$ALL" | head -n 1` died of SIGPIPE when head exited between
    echo's line-buffered writes (CI: job FAILED, exit code 141, at the first 1-node point)."""
    proc = run_cli("study=scaling", "study.worlds=[1,2,4]", "study.repeats=1", "launcher=slurm",
                   "launcher.nodes=2", "launcher.nproc_per_node=2", "launcher.dry_run=true",
                   f"run.root={tmp_path / 'runs'}", cwd=tmp_path, timeout=120)
    assert proc.returncode == 0, describe(proc)
    script = (study_dir_of(proc) / "study.sbatch").read_text()
    assert not [ln for ln in script.splitlines() if "| head" in ln.split("#")[0]]
    lines = [ln.strip() for ln in script.splitlines()
             if ln.strip().startswith(("ALL_NODES=", "printf -v NODELIST", "NODELIST=",
                                       "export MASTER_ADDR="))]
    assert len(lines) == 4, lines
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text('#!/bin/sh\nfor h in node1 node2 node3; do echo "$h"; done\n')
    (bin_dir / "scontrol").chmod(0o755)
    for nodes, want in ((1, "node1"), (2, "node1,node2"), (3, "node1,node2,node3")):
        body = "set -euo pipefail\nSLURM_JOB_NODELIST=x NODES=%d\n%s\necho \"$NODELIST $MASTER_ADDR\"\n" % (
            nodes, "\n".join(lines))
        out = subprocess.run(["bash", "-c", body], capture_output=True, text=True,
                             env={**child_env(), "PATH": f"{bin_dir}:/usr/bin:/bin"})
        assert out.returncode == 0 and out.stdout.split() == [want, "node1"], (out, body)
