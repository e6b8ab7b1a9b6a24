"""A scaling study in one command: every world size of a ladder,
repeated, one run folder per point under one study folder, then the
report (docs/scaling.md, "A study in one command": the folder, its files
and how a study continues).

    python -m ddp_lab study=scaling study.worlds=[1,2,4] study.repeats=3 sync=ring

Locally every point is one torchrun (`job.launch_job`); with
launcher=slurm ONE allocation whose batch script runs every point as an
srun job step, reporting through `python -m ddp_lab.command.study
done|end STUDY_DIR INDEX`, so study.json has one writer's code.
study_plan.py makes the points, study_folder.py keeps the folder; this
module runs them.
"""

from __future__ import annotations

import shlex
import signal
import sys
import time
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig

from ..config.errors import UserError
from ..folder.files import atomic_write_text
from .job import Outcome, collect, launch_job, make_run
from ..launch import python_exe, setup_block, template
from ..launch.base import pythonpath_line
from ..launch.slurm import launch_block, sbatch_lines, stop_script
from ..launch.slurm_job import submit_and_follow
from ..folder.rundir import read_summary
from ..folder.stop import EXIT_STOPPED
from .study_plan import Point, plan, point_config, resolve_study
from .study_folder import (STUDY_FILE, continue_hint, build_report, finish, load, make_study_dir,
                           new_state, point_line, point_status, record_end, reuse_problem, save,
                           study_dir_of)


# ------------------------------------------------------------------ the command
class _Stop(Exception):
    """SIGTERM between points: no new point starts."""


def _raise_stop(signum, frame):
    raise _Stop(signal.Signals(signum).name)


def run_study(cfg: DictConfig, t0: float | None = None) -> Outcome:
    """`python -m ddp_lab study=...`: check every point, then run them
    in order."""
    # the study's rules, then every point's config (TRAIN rules)
    base = resolve_study(cfg)
    points = plan(base)
    study_dir, sweep_dir = study_dir_of(base)
    state = load(study_dir) if study_dir is not None else {}
    if study_dir is not None:
        problem = reuse_problem(study_dir, state, points, base)
        if problem:
            raise UserError(problem)
    todo = [p for p in points
            if study_dir is None or point_status(study_dir, p.folder) != "completed"]
    # every point to run, checked on its own folder too
    if study_dir is not None:
        for p in todo:
            point_config(base, p, study_dir, study_dir.name)
    if study_dir is None:
        study_dir = make_study_dir(base)
    study_dir.mkdir(parents=True, exist_ok=True)
    if not state:
        state = new_state(base, study_dir, points)
    state["status"] = "running"
    save(study_dir, state)
    kept = len(points) - len(todo)
    print(f"[study] {study_dir.name}: {len(points)} point(s) (worlds {list(base.study.worlds)} x "
          f"{base.study.repeats}, {base.study.order}, launcher={base.launcher.name})"
          + (f"; {kept} completed earlier, kept" if kept else ""), flush=True)
    if base.launcher.name == "slurm":
        rc = _run_slurm(base, study_dir, points)
        stopped = rc != 0 and finish(study_dir)["status"] == "stopped"
    else:
        rc, stopped = _run_here(base, study_dir, points, t0)
    # rendered and printed; nothing ran
    if base.launcher.dry_run:
        print(f"study dir: {study_dir}\nrun dir: {study_dir}")
        return Outcome(0, "ok (dry run)", study_dir)
    final = finish(study_dir, stopped)
    print(f"[study] {final['points_completed']}/{len(points)} point(s) completed; "
          f"study {final['status']}", flush=True)
    if final["status"] == "completed" and base.study.report:
        for path in build_report(study_dir, sweep_dir):
            print(f"report: {path}")
    elif final["status"] == "stopped":
        print(f"Continue with:\n  {continue_hint(study_dir)}")
    print(f"study dir: {study_dir}")
    print(f"run dir: {study_dir}")
    result = (f"{'ok' if final['status'] == 'completed' else final['status']}: "
              f"{final['points_completed']}/{len(points)} point(s) completed")
    if final["status"] == "stopped":
        return Outcome(rc if rc > 128 else EXIT_STOPPED, result, study_dir)
    return Outcome(0 if final["status"] == "completed" else (rc or 1), result, study_dir)


def _run_here(base: DictConfig, study_dir: Path, points: list[Point],
              t0: float | None) -> tuple[int, bool]:
    """local / mpirun: one job per point from this process, in order,
    each begun when the one before it ended (the first at `t0`).
    (rc, stopped)"""
    state = load(study_dir)
    failed = 0
    previous = signal.signal(signal.SIGTERM, _raise_stop)
    try:
        for p in points:
            if point_status(study_dir, p.folder) == "completed":
                print(point_line(state, p.index, "completed earlier, kept"), flush=True)
                continue
            cfg = point_config(base, p, study_dir, study_dir.name)
            print(point_line(state, p.index, f"starting ({p.nodes} node(s) x "
                             f"{p.nproc_per_node}) in {study_dir / p.folder}"), flush=True)
            try:
                run_dir, rc = launch_job(cfg, t0=t0)
            finally:
                t0 = time.time()
            # launcher.dry_run: rendered, nothing started
            if rc is None:
                continue
            done = read_summary(run_dir).get("status") == "completed"
            # a stop that came as the job was ending (rc 128+N is our
            # signal, not the job's): the ranks had finished and said
            # so; the point is complete
            summary = collect(run_dir, 0 if rc > 128 and done else rc,
                              launcher=cfg.launcher.name, sync=cfg.sync.name)
            record_end(study_dir, p.index)
            status = str(summary.get("status", "")).split(":")[0]
            if rc > 128 or status in ("stopped", "preempted"):
                print(f"[study] stopped at point {p.index}/{len(points)}: no new point starts",
                      flush=True)
                return rc, True
            if status != "completed":
                failed = rc or 1
    except (KeyboardInterrupt, _Stop) as e:
        what = "Ctrl-C" if isinstance(e, KeyboardInterrupt) else str(e)
        print(f"\n[study] {what} between points: no new point starts", flush=True)
        return 128 + (signal.SIGINT if isinstance(e, KeyboardInterrupt) else signal.SIGTERM), True
    finally:
        signal.signal(signal.SIGTERM, previous)
    return failed, False


# ------------------------------------------------------------------ SLURM
def render_sbatch(base: DictConfig, study_dir: Path, points: list[Point]) -> str:
    """ONE allocation (launcher.nodes x nproc_per_node) whose batch
    script runs every point as an srun job step of its size on the first
    k nodes (slurm.launch_block renders the step's srun/torchrun line,
    as for a single run)."""
    lc = base.launcher
    py = shlex.quote(python_exe(lc))
    step = launch_block(base, nnodes="$NODES", rdzv_id="$SLURM_JOB_ID-$INDEX",
                        # --ntasks too: srun inherits the allocation's
                        # SLURM_NTASKS otherwise
                        step=["--nodes=$NODES", "--nodelist=$NODELIST",
                              "--ntasks=$((NODES * NPROC_PER_NODE))" if lc.per_task
                              else "--ntasks=$NODES"])
    calls = "\n".join(f"run_point {p.index} {p.nodes} {p.nproc_per_node} {shlex.quote(p.folder)}"
                      f"  # world {p.world}, repeat {p.repeat}" for p in points)
    return template("study.sbatch").format(
        summary=f"{len(points)} point(s), worlds {list(base.study.worlds)} x {base.study.repeats}",
        study_dir_q=shlex.quote(str(study_dir)), job_name=lc.job_name,
        sbatch_lines="\n".join(sbatch_lines(base, study_dir)), setup=setup_block(lc.setup),
        pythonpath=pythonpath_line(), py=py, step=step, calls=calls,
        master_port=(lc.master_port if lc.master_port is not None
                     else "$(( 20000 + SLURM_JOB_ID % 20000 ))"))


def _run_slurm(base: DictConfig, study_dir: Path, points: list[Point]) -> int:
    # every point's folder and config.yaml, as for a single run
    for p in points:
        if point_status(study_dir, p.folder) != "completed":
            cfg = point_config(base, p, study_dir, study_dir.name)
            make_run(cfg)
            (study_dir / p.folder / "logs").mkdir(exist_ok=True)
    (study_dir / "logs").mkdir(exist_ok=True)
    script = study_dir / "study.sbatch"
    # it sources
    atomic_write_text(study_dir / "slurm_stop.sh", stop_script(base.launcher))
    atomic_write_text(script, render_sbatch(base, study_dir, points))
    script.chmod(0o755)
    if base.launcher.dry_run:
        print(script.read_text().rstrip())
        return 0
    lc = base.launcher
    return submit_and_follow(base, study_dir, script,
                             f"study of {len(points)} point(s) in one allocation of "
                             f"{lc.nodes} node(s) x {lc.nproc_per_node}")


# ------------------------------------------------------------------ batch-script side
def main(argv: Optional[list[str]] = None) -> int:
    """`python -m ddp_lab.command.study done|end STUDY_DIR INDEX [RC]`
    (the study's batch script): done: exit 0 if the point completed
    earlier (it is kept; prints so), else 1; end: the point's job step
    ended with exit status RC: study.json records it (a step that failed
    without a summary is marked failed), its line is printed."""
    argv = sys.argv[1:] if argv is None else argv
    if (len(argv) not in (3, 4) or argv[0] not in ("done", "end")
            or not all(a.isdigit() for a in argv[2:])):
        print("usage: python -m ddp_lab.command.study done STUDY_DIR INDEX | end STUDY_DIR INDEX RC",
              file=sys.stderr)
        return 2
    study_dir, index = Path(argv[1]), int(argv[2])
    state = load(study_dir)
    if not state or not 1 <= index <= len(state.get("points", [])):
        print(f"error: {study_dir}/{STUDY_FILE} has no point {index}", file=sys.stderr)
        return 2
    if argv[0] == "done":
        if point_status(study_dir, state["points"][index - 1]["folder"]) == "completed":
            print(point_line(state, index, "completed earlier, kept"), flush=True)
            return 0
        p = state["points"][index - 1]
        print(point_line(state, index, f"starting ({p['nodes']} node(s) x {p['nproc_per_node']})"),
              flush=True)
        return 1
    record_end(study_dir, index, int(argv[3]) if len(argv) == 4 else None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
