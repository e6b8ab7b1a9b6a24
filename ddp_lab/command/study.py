"""A scaling study in one command: every world size of a ladder, repeated, one run folder per point
under one study folder, then the report (docs/scaling.md, "A study in one command").

    python -m ddp_lab study=scaling study.worlds=[1,2,4] study.repeats=3 sync=ring

Locally every point is one torchrun (`job.launch_job`); with launcher=slurm ONE allocation whose
batch script runs every point as an srun job step, reporting through `python -m
ddp_lab.command.study done|end STUDY_DIR INDEX`, so study.json has one writer's code.
"""

from __future__ import annotations

import shlex
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, open_dict

from ..config.errors import UserError
from ..folder.files import atomic_write_text, read_json_or_empty, write_json
from ..folder.records import now_iso
from ..folder.rundir import EXIT_STOPPED, make_run_dir, read_summary
from ..launch.base import python_exe, pythonpath_line, setup_block, template
from ..launch.mpirun import parse_hosts, place
from ..launch.slurm import launch_block, sbatch_lines, stop_script, submit_and_follow
from .job import collect, launch_job, make_run, Outcome
from .paste import job_overrides
from .validate import at_least, check, COMMON, known_sections, one_of, resolve, resolve_train, Rule

# ------------------------------------------------------------------ the command
class _Stop(Exception):
    """SIGTERM between points: no new point starts."""


def _raise_stop(signum, frame):
    raise _Stop(signal.Signals(signum).name)


def run_study(cfg: DictConfig, t0: float | None = None) -> Outcome:
    """`python -m ddp_lab study=...`: check every point, then run them in order."""
    base = resolve_study(cfg)
    points = plan(base)
    study_dir, sweep_dir = study_dir_of(base)
    state, todo = {}, points
    if study_dir is not None:
        state = load(study_dir)
        problem = reuse_problem(study_dir, state, points, base)
        if problem:
            raise UserError(problem)
        todo = [p for p in points if point_status(study_dir, p.folder) != "completed"]
        # every point to run, checked on its own folder too
        for p in todo:
            point_config(base, p, study_dir, study_dir.name)
    else:
        study_dir = make_study_dir(base)
    study_dir.mkdir(parents=True, exist_ok=True)
    if not state:
        st = base.study
        state = {"schema_version": SCHEMA_VERSION, "id": study_dir.name, "status": "running",
                 "launcher": base.launcher.name, "sync": base.sync.name, "model": base.model.name,
                 "worlds": list(st.worlds), "repeats": st.repeats, "order": st.order,
                 "created": now_iso(),
                 "points": [{**asdict(p), "status": "pending"} for p in points]}
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
    print(f"study dir: {study_dir}\nrun dir: {study_dir}")
    result = (f"{'ok' if final['status'] == 'completed' else final['status']}: "
              f"{final['points_completed']}/{len(points)} point(s) completed")
    if final["status"] == "stopped":
        return Outcome(rc if rc > 128 else EXIT_STOPPED, result, study_dir)
    return Outcome(0 if final["status"] == "completed" else (rc or 1), result, study_dir)


def _run_here(base: DictConfig, study_dir: Path, points: list[Point],
              t0: float | None) -> tuple[int, bool]:
    """local / mpirun: one job per point from this process, in order (the first begun at `t0`):
    (rc, stopped)."""
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
            # a stop that came as the job was ending (rc 128+N is our signal, not the job's): the
            # ranks had finished and said so; the point is complete
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
    """ONE allocation (launcher.nodes x nproc_per_node) whose batch script runs every point as an
    srun job step of its size on the first k nodes (slurm.launch_block renders the step)."""
    lc = base.launcher
    py = shlex.quote(python_exe(lc))
    step = launch_block(base, nnodes="$NODES", rdzv_id="$SLURM_JOB_ID-$INDEX",
                        # --ntasks too: srun inherits the allocation's SLURM_NTASKS otherwise
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
    """`python -m ddp_lab.command.study done|end STUDY_DIR INDEX [RC]` (the study's batch script):
    done: exit 0 if the point completed earlier (kept), else 1; end: the point's job step ended
    with exit status RC (record_end)."""
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


# ------------------------------------------------------------------ the plan
ORDERS = ("interleaved", "grouped")
# processes one machine is asked to run for one point
MAX_LOCAL_WORLD = 64


@dataclass
class Point:
    index: int  # 1-based, run order
    world: int
    repeat: int  # 1-based
    nodes: int
    nproc_per_node: int
    folder: str  # relative to the study folder
    # mpirun: the `name:slots` subset this point uses
    hosts: Optional[list] = None


def layout(world: int, lc) -> tuple[int, int, Optional[list]] | str:
    """How `world` ranks fit the launcher: (nodes, processes per node, mpirun hosts), or one line
    saying why they do not."""
    name = lc.name
    if name == "local":
        if world > MAX_LOCAL_WORLD:
            return (f"study.worlds has {world}: launcher=local runs one machine's processes, "
                    f"at most {MAX_LOCAL_WORLD}; use launcher=slurm or mpirun for more")
        return 1, world, None
    if name == "slurm":
        nodes, nproc = lc.nodes, lc.nproc_per_node
        # the fewest nodes: intra-node first, as users expect
        for k in range(1, nodes + 1):
            if world % k == 0 and world // k <= nproc:
                return k, world // k, None
        return (f"study.worlds has {world}: the allocation is launcher.nodes={nodes} x "
                f"launcher.nproc_per_node={nproc}; a world must be k nodes x p processes with "
                f"k <= {nodes} and p <= {nproc}: drop {world} or raise launcher.nodes")
    if name == "mpirun":
        hosts = parse_hosts(lc.hosts, 1)
        total = sum(s for _, s in hosts)
        if world > total:
            return (f"study.worlds has {world}: the hosts give {total} slot(s) "
                    f"({', '.join(map(str, lc.hosts))}); drop {world} or add hosts/slots")
        # the first `world` slots, as mpirun's -np fills them
        placed = place(hosts, world)
        return len(placed), max(s for _, s in placed), [f"{n}:{s}" for n, s in placed]
    return f"launcher={name}: a study is not supported yet; use launcher=local, slurm or mpirun"


def plan(cfg: DictConfig) -> list[Point]:
    """Every point in run order: interleaved (1,2,4,1,2,4,...) or grouped (1,1,2,2,...)."""
    st = cfg.study
    pairs = ([(w, r) for r in range(1, st.repeats + 1) for w in st.worlds]
             if st.order == "interleaved" else
             [(w, r) for w in st.worlds for r in range(1, st.repeats + 1)])
    points = []
    for i, (w, r) in enumerate(pairs, 1):
        fit = layout(w, cfg.launcher)
        if isinstance(fit, str):
            raise UserError(fit)
        nodes, nproc, hosts = fit
        points.append(Point(i, w, r, nodes, nproc, f"points/w{w}_r{r}", hosts))
    return points


def point_config(base: DictConfig, point: Point, study_dir: Optional[Path],
                 study_id: str) -> DictConfig:
    """The ordinary run config of one point, resolved and checked by the trainer's rules."""
    cfg = base.copy()
    with open_dict(cfg):
        cfg.study = None
        cfg.study_point = {"id": study_id, "world": point.world, "repeat": point.repeat,
                           "index": point.index}
        cfg.launcher.nodes = point.nodes
        cfg.launcher.nproc_per_node = point.nproc_per_node
        if point.hosts is not None:
            cfg.launcher.hosts = list(point.hosts)
            cfg.launcher.hostfile = None
            # every slot of the point's hosts
            cfg.launcher.np = None
        cfg.run.dir = str(study_dir / point.folder) if study_dir is not None else None
    return resolve_train(cfg)


# ------------------------------------------------------------------ the study's rules
def _launcher(cfg: DictConfig) -> Optional[str]:
    if cfg.launcher.name == "runai":
        return ("launcher=runai: a study is not supported yet; use launcher=local, slurm or "
                "mpirun (or run each world size as its own runai job)")
    return None


def _worlds(cfg: DictConfig) -> Optional[str]:
    worlds = list(cfg.study.worlds)
    if not worlds:
        return "study.worlds is empty: give the world sizes, e.g. study.worlds=[1,2,4]"
    bad = [w for w in worlds if w < 1]
    if bad:
        return f"study.worlds has {bad[0]}: every world size must be >= 1"
    if len(set(worlds)) != len(worlds):
        return (f"study.worlds={worlds} lists a world twice: give each once "
                "(study.repeats repeats them)")
    return None


def _fits(cfg: DictConfig) -> Optional[str]:
    """Every world fits the (resolved) launcher: slurm k nodes x p, mpirun the hosts' slots."""
    fits = (layout(world, cfg.launcher) for world in cfg.study.worlds)
    return next((fit for fit in fits if isinstance(fit, str)), None)


# on the composed config, before the launcher resolves it
STUDY_PLAN: list[Rule] = [
    _launcher,
    _worlds,
    at_least("study.repeats", 1),
    one_of("study.order", ORDERS),
]

# on the resolved base config; each point then passes TRAIN
STUDY: list[Rule] = [
    known_sections,
    _fits,
    *COMMON,
]


def resolve_study(cfg: DictConfig) -> DictConfig:
    """The study's base config, resolved and checked, every point's config checked by TRAIN (in a
    fresh folder: run_study checks the points' own folders once the study folder is known)."""
    check(cfg, STUDY_PLAN)
    base = resolve(cfg, STUDY)
    for point in plan(base):
        point_config(base, point, None, "")
    return base


# ------------------------------------------------------------------ the folder
STUDY_FILE = "study.json"
SCHEMA_VERSION = 1


def label_of(cfg: DictConfig) -> str:
    return f"{cfg.sync.name}_{cfg.model.name}_{cfg.launcher.name}"


def study_dir_of(cfg: DictConfig) -> tuple[Optional[Path], Optional[Path]]:
    """(the study folder if it is already named, the sweep folder it sits in). In a sweep the
    studies sit side by side in run.dir or the sweep's folder, named by job number, so the same
    sweep command continues them."""
    try:
        hc = HydraConfig.get()
    except ValueError:  # not inside a Hydra job
        hc = None
    if hc is not None and hc.mode == RunMode.MULTIRUN:
        parent = Path(cfg.run.dir or hc.sweep.dir).expanduser().resolve()
        return parent / f"{int(hc.job.num)}_{label_of(cfg)}", parent
    if cfg.run.dir:
        return Path(cfg.run.dir).expanduser().resolve(), None
    return None, None


def make_study_dir(cfg: DictConfig) -> Path:
    """A new `run.root/studies/<label>_<date>_<time>` (`make_run_dir`: unique, as run folders are;
    `<label>`: `label_of`, run.name after it where set)."""
    c = cfg.copy()
    with open_dict(c):
        c.run.root = str(Path(cfg.run.root).expanduser() / "studies")
    return make_run_dir(c, label=label_of(cfg))


def load(study_dir: Path) -> dict:
    return read_json_or_empty(study_dir / STUDY_FILE)


def save(study_dir: Path, state: dict) -> None:
    state["updated"] = now_iso()
    write_json(study_dir / STUDY_FILE, state)


def point_status(study_dir: Path, folder: str) -> str:
    """The status word of a point's summary.json (`pending` when it has none)."""
    summary = read_summary(study_dir / folder)
    return str(summary.get("status") or "pending").split(":")[0]


def reuse_problem(study_dir: Path, state: dict, points: list[Point], cfg: DictConfig) -> Optional[str]:
    """Why this command may not continue the study in `study_dir` (None: it may)."""
    if not state:
        if (study_dir / "config.yaml").is_file() or (study_dir / "summary.json").is_file():
            return (f"run.dir={study_dir} holds a run, not a study: give a new run.dir for "
                    "the study (or none, for a fresh folder under run.root/studies)")
        return None
    old = [(p["world"], p["repeat"]) for p in state.get("points", [])]
    new = [(p.world, p.repeat) for p in points]
    if old != new or state.get("launcher") != cfg.launcher.name:
        return (f"run.dir={study_dir} holds a study of worlds {state.get('worlds')} x "
                f"{state.get('repeats')} repeat(s) ({state.get('order')}, launcher="
                f"{state.get('launcher')}): continue it with the same study.* and launcher, "
                "or give a new run.dir")
    return None


# ------------------------------------------------------------------ console
def point_line(state: dict, index: int, what: str) -> str:
    p = state["points"][index - 1]
    return (f"[study] point {index}/{len(state['points'])}: world {p['world']}, "
            f"repeat {p['repeat']}: {what}")


def record_end(study_dir: Path, index: int, rc: Optional[int] = None) -> dict:
    """Point `index` has ended (its job step with exit status `rc`, when the batch script says):
    its status and median epoch into study.json, its line printed; its summary."""
    state = load(study_dir)
    p = state["points"][index - 1]
    if rc is None:
        summary = read_summary(study_dir / p["folder"])
    else:
        # a step that failed without saying so (srun refused it, a rank died) is marked
        summary = collect(study_dir / p["folder"], rc, launcher=state.get("launcher"),
                          sync=state.get("sync"), world_size=p["world"])
    p["status"] = str(summary.get("status") or "failed: no summary.json").split(":")[0]
    median = p["epoch_time_s_median"] = summary.get("epoch_time_s_median")
    save(study_dir, state)
    end = str(summary.get("status") or "no summary").split(":")[0] + (
        f", median epoch {median:.2f} s" if isinstance(median, (int, float)) else "")
    print(point_line(state, index, end), flush=True)
    return summary


def finish(study_dir: Path, stopped: bool = False) -> dict:
    """The study's own status from its points': completed | stopped | failed."""
    state = load(study_dir)
    words = [point_status(study_dir, p["folder"]) for p in state["points"]]
    for p, w in zip(state["points"], words):
        p["status"] = w
    done = sum(w == "completed" for w in words)
    state["status"] = ("completed" if done == len(words) else
                       "stopped" if stopped or any(w in ("stopped", "preempted") for w in words)
                       else "failed")
    state["points_completed"] = done
    save(study_dir, state)
    return state


def build_report(study_dir: Path, sweep_dir: Optional[Path]) -> list[Path]:
    """`python -m ddp_lab.report` on the study folder, and in a sweep on the sweep's folder too
    (the last study's covers them all)."""
    out = []
    for folder in [study_dir] + ([sweep_dir] if sweep_dir is not None else []):
        res = subprocess.run([sys.executable, "-m", "ddp_lab.report", str(folder),
                              "-o", str(folder / "report")], capture_output=True, text=True)
        if res.returncode != 0:
            why = (res.stderr.strip() or res.stdout.strip()).splitlines()[-1:] or ["?"]
            print(f"[study] the report of {folder} failed: {why[0]}", file=sys.stderr)
        else:
            out.append(folder / "report" / "report.md")
    return out


def continue_hint(study_dir: Path) -> str:
    """The command that continues the study: this one's overrides, with run.dir the study's."""
    args = [a for a in job_overrides() or [] if not a.startswith("run.dir=")]
    return "python -m ddp_lab " + " ".join([*map(shlex.quote, args), f"run.dir={study_dir}"])


if __name__ == "__main__":
    sys.exit(main())
