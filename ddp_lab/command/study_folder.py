"""A study's folder: where it is, study.json (the plan and each point's
status; one writer's code whichever side runs the points) and the report
at its end.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Optional

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, open_dict

from ..folder.files import read_json_or_empty, write_json
from ..folder.records import now_iso
from .job import collect
from ..folder.rundir import make_run_dir, read_summary
from .study_plan import Point


STUDY_FILE = "study.json"
SCHEMA_VERSION = 1


# ------------------------------------------------------------------ the folder
def _sweep_job() -> Optional[tuple[Path, int]]:
    """(the sweep's folder, this job's number) inside a Hydra -m sweep,
    else None."""
    try:
        hc = HydraConfig.get()
    except ValueError:  # not inside a Hydra job
        return None
    if hc.mode != RunMode.MULTIRUN:
        return None
    return Path(hc.sweep.dir).expanduser().resolve(), int(hc.job.num)


def label_of(cfg: DictConfig) -> str:
    return f"{cfg.sync.name}_{cfg.model.name}_{cfg.launcher.name}"


def study_dir_of(cfg: DictConfig) -> tuple[Optional[Path], Optional[Path]]:
    """(the study folder if it is already named, the sweep folder it
    sits in). In a sweep the studies sit side by side in run.dir (if
    given) or the sweep's folder, named by job number, so the same sweep
    command (with hydra.sweep.dir or run.dir) continues them."""
    sweep = _sweep_job()
    if sweep is not None:
        parent = Path(cfg.run.dir).expanduser().resolve() if cfg.run.dir else sweep[0]
        return parent / f"{sweep[1]}_{label_of(cfg)}", parent
    if cfg.run.dir:
        return Path(cfg.run.dir).expanduser().resolve(), None
    return None, None


def make_study_dir(cfg: DictConfig) -> Path:
    """A new `run.root/studies/<label>_<date>_<time>` (`make_run_dir`:
    unique, as run folders are; `<label>`: `label_of`, run.name after it
    where set)."""
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
    """The status word of a point's summary.json (`pending` when it has
    none)."""
    summary = read_summary(study_dir / folder)
    return str(summary.get("status") or "pending").split(":")[0]


def reuse_problem(study_dir: Path, state: dict, points: list[Point], cfg: DictConfig) -> Optional[str]:
    """Why this command may not continue the study in `study_dir` (None:
    it may)."""
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


def new_state(cfg: DictConfig, study_dir: Path, points: list[Point]) -> dict:
    st = cfg.study
    return {"schema_version": SCHEMA_VERSION, "id": study_dir.name, "status": "running",
            "launcher": cfg.launcher.name, "sync": cfg.sync.name, "model": cfg.model.name,
            "worlds": list(st.worlds), "repeats": st.repeats, "order": st.order,
            "created": now_iso(),
            "points": [{**asdict(p), "status": "pending"} for p in points]}


# ------------------------------------------------------------------ console
def point_line(state: dict, index: int, what: str) -> str:
    p = state["points"][index - 1]
    return (f"[study] point {index}/{len(state['points'])}: world {p['world']}, "
            f"repeat {p['repeat']}: {what}")


def end_note(summary: dict) -> str:
    status = str(summary.get("status") or "no summary").split(":")[0]
    median = summary.get("epoch_time_s_median")
    return status + (f", median epoch {median:.2f} s" if isinstance(median, (int, float)) else "")


def record_end(study_dir: Path, index: int, rc: Optional[int] = None) -> dict:
    """Point `index` has ended (its job step with exit status `rc`, when
    the batch script says): copy its status (and median epoch) into
    study.json; its summary. Prints the point's end line."""
    state = load(study_dir)
    p = state["points"][index - 1]
    if rc is None:
        summary = read_summary(study_dir / p["folder"])
    else:
        # a step that failed without saying so (srun refused it, a rank
        # died) is marked
        summary = collect(study_dir / p["folder"], rc, launcher=state.get("launcher"),
                          sync=state.get("sync"), world_size=p["world"])
    p["status"] = str(summary.get("status") or "failed: no summary.json").split(":")[0]
    p["epoch_time_s_median"] = summary.get("epoch_time_s_median")
    save(study_dir, state)
    print(point_line(state, index, end_note(summary)), flush=True)
    return summary


def finish(study_dir: Path, stopped: bool = False) -> dict:
    """The study's own status from its points': completed | stopped |
    failed."""
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
    """`python -m ddp_lab.report` on the study folder (->
    study/report/), and in a sweep on the sweep's folder too (->
    sweep/report/: the last study's covers them all)."""
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
    try:
        args = [a for a in HydraConfig.get().overrides.task if not a.startswith("run.dir=")]
    except ValueError:  # not inside a Hydra job
        args = []
    return "python -m ddp_lab " + " ".join([*map(shlex.quote, args), f"run.dir={study_dir}"])
