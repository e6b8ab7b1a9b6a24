"""A run's state from its folder, the scheduler (`scontrol`, then `sacct`) and the job's processes
alive here: `inspect(run_dir)` -> plain data (what `python -m ddp_lab.status` shows, its --json,
what ddp_lab.command.lock asks). The states: docs/status.md, "What it shows". Shown as a screen
(`render`), a line (`one_line`) and how to go on (`continue_lines`, which --follow and --stop end
with; the command: ddp_lab/status.py).
"""

from __future__ import annotations

import contextlib
import shutil
import socket
from pathlib import Path
from typing import Any, Optional

from omegaconf import OmegaConf

from . import paste
from ..folder.description import describe_run
from ..folder.heartbeat import read_all
from ..folder.records import read_metrics
from ..folder.rundir import STOP_FILE, folder_state, is_dry_run
from ..launch import job_processes, slurm

FINAL = ("completed", "failed", "preempted", "stopped")
# scheduler states of a job that still holds (or waits for) an allocation
SLURM_WAITING = {"PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                 "RESV_DEL_HOLD", "SUSPENDED"}
SLURM_ALIVE = SLURM_WAITING | {"RUNNING", "COMPLETING", "SIGNALING", "STAGE_OUT", "RESIZING"}
# what `last_epoch` shows of the newest metrics.jsonl record
LAST_EPOCH = ("epoch", "train_loss", "train_accuracy", "test_loss", "test_accuracy",
              "epoch_time_s", "samples_per_s")
# launchers whose processes run on the submitting machine (job_processes can see them)
LOCAL_LAUNCHERS = ("local", "mpirun")


def _is_run_dir(path: Path) -> bool:
    return (path / "config.yaml").is_file()


def _subfolders(path: Path) -> list[Path]:
    try:
        return sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
    except OSError:
        return []


def find_runs(path: Path, depth: int = 4) -> list[Path]:
    """Run folders at or below `path` (a sweep folder, run.root), not inside one another; below
    `path`, a dry run's folder is none (`dry_runs` counts those)."""
    if _is_run_dir(path):
        return [path]
    if depth <= 0:
        return []
    return [r for child in _subfolders(path) for r in find_runs(child, depth - 1)
            if not is_dry_run(r)]


def dry_runs(path: Path, depth: int = 4) -> int:
    """How many dry runs' folders lie below `path` (left out of `find_runs`)."""
    if _is_run_dir(path) or depth <= 0:
        return int(is_dry_run(path))
    return sum(dry_runs(p, depth - 1) for p in _subfolders(path))


def run_config(run_dir: Path) -> dict:
    """config.yaml as plain data ({} when unreadable): the newest submission wrote it."""
    try:
        data = OmegaConf.to_container(OmegaConf.load(run_dir / "config.yaml"))
    except Exception:  # noqa: BLE001 -- a half-written or foreign file: show what we can
        return {}
    return data if isinstance(data, dict) else {}


def _read(path: Path) -> Optional[str]:
    """The file's text, stripped; None when it is empty or cannot be read."""
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def _position(summary: dict, record: Optional[dict], ckpt: Optional[tuple[int, int]],
              status: str) -> tuple[int, int]:
    """(epochs done, steps into the next): the summary's, or for a running run the newest of the
    summary's start, the last epoch record and the newest checkpoint."""
    here = (int(summary.get("epochs_done") or 0), int(summary.get("step_in_epoch") or 0))
    if status in FINAL and summary.get("epochs_done") is not None:
        return here
    candidates = [here]
    if record and isinstance(record.get("epoch"), int):
        candidates.append((record["epoch"], 0))
    if ckpt:
        candidates.append(ckpt)
    return max(candidates)


def inspect(run_dir: Path, scheduler: bool = True) -> dict:
    """Everything `status` shows about one run folder, as plain data (the --json output)."""
    run_dir = Path(run_dir)
    fs = folder_state(run_dir)
    summary = fs["summary"]
    cfg = run_config(run_dir)
    launcher = (cfg.get("launcher") or {}).get("name") or summary.get("launcher")
    status = str(summary.get("status") or "")
    word = status.split(":")[0].strip()
    # a torn line is skipped
    records = read_metrics(run_dir / "metrics.jsonl")[0]
    record = records[-1] if records else None
    epochs_done, step = _position(summary, record, fs["checkpoint"], word)
    # the newest submission's (the SLURM launcher writes job_id), else the ranks' record
    job_id = _read(run_dir / "job_id") or (str(summary["job_id"]) if summary.get("job_id")
                                           else None)

    sched = None
    if scheduler and launcher == "slurm" and job_id and shutil.which("scontrol"):
        job = slurm.job_info(job_id)
        sched = {"state": job.get("JobState", "UNKNOWN"), "exit_code": job.get("ExitCode", ""),
                 "reason": job.get("Reason", "")}
    pids = job_processes(run_dir) if launcher in LOCAL_LAUNCHERS or launcher is None else None
    hosts = summary.get("hosts") or []
    here = socket.gethostname()
    sees_ranks = launcher in LOCAL_LAUNCHERS and (not hosts or here in hosts)
    state, detail = _state(word, status, launcher, job_id, sched, pids, sees_ranks)
    if not word and not pids and is_dry_run(run_dir):
        state, detail = "dry run", "rendered by launcher.dry_run=true, never started"
    elif not word and not pids:
        # no rank ever wrote: did the job's python check stop it?
        said = python_check_failure(run_dir)
        if said:
            state, detail = "failed", said

    train = cfg.get("train") or {}
    lc = cfg.get("launcher") or {}
    logs = [run_dir / "logs" / "rank0.log"]
    if launcher == "slurm" and job_id:
        name = slurm.log_name(lc.get("output") or "%x_%j", lc.get("job_name") or "ddp_lab", job_id)
        logs = [run_dir / "logs" / f"{name}.out", run_dir / "logs" / f"{name}.err", *logs]
    info = {
        "run_dir": str(run_dir), "state": state, "detail": detail, "status": status or None,
        "launcher": launcher, "job_id": job_id, "scheduler": sched,
        "processes": pids, "host": here,
        "epochs": summary.get("epochs") or train.get("epochs"),
        "epochs_done": epochs_done, "step_in_epoch": step,
        "checkpoint": fs["checkpoint_name"], "stop_reason": summary.get("stop_reason"),
        "stop_requested": _read(run_dir / STOP_FILE) if state in ("running", "pending") else None,
        "last_epoch": {k: record.get(k) for k in LAST_EPOCH} if record else None,
        "test_accuracy": summary.get("test_accuracy"),
        "segments": summary.get("segments") or [], "ranks": [],
        "logs": [str(p) for p in logs if p.exists()] or [str(logs[0])],
    }
    point = cfg.get("study_point") or summary.get("study") or {}
    # what the run is, named by its description (a study's point by its repeat too)
    try:
        info["label"] = describe_run(cfg, summary).label(repeat=point.get("repeat"))
    except Exception:  # noqa: BLE001 -- a garbled config: the folder's name says enough
        info["label"] = None
    # a run.entry of its own (ddp_lab.rank.one_file)
    if summary.get("records_kept") is False:
        info["records"] = False
        note = f"run.entry={summary.get('entry')} keeps no records: no epochs, no figures"
        info["detail"] = f"{info['detail']}; {note}" if info["detail"] else note
    info["dead"] = dead(info)
    if state not in ("completed", "not started"):
        # progress is a hint, never a reason to fail
        with contextlib.suppress(Exception):
            info["ranks"] = read_all(run_dir)
    return info


def _state(word: str, status: str, launcher: Optional[str], job_id: Optional[str],
           sched: Optional[dict], pids: Optional[list[int]], sees_ranks: bool) -> tuple[str, str]:
    """(one word, what it rests on) from the summary, the scheduler and the processes."""
    why = status.partition(":")[2].strip()
    final_detail = why if word == "failed" else ""
    if sched is not None and sched["state"] not in ("GONE", "UNKNOWN"):
        s, reason = sched["state"], sched["reason"]
        job = f"SLURM job {job_id} {s}"
        if s in SLURM_WAITING:
            because = f" ({reason})" if reason and reason != "None" else ""
            after = f"; the run was {word}" if word in ("preempted", "stopped") else ""
            # a requeued job waits ~2 min before it starts
            if reason == "BeginTime" and word:
                after += f"; `scontrol update JobId={job_id} StartTime=now` starts it at once"
            return "pending", f"{job}{because}{after}"
        if s in SLURM_ALIVE:
            # the ranks have ended; the batch script is finishing (requeue?)
            if word in FINAL:
                return word, f"{job}: its ranks have ended" + (f"; {final_detail}" if final_detail else "")
            if not word:
                return "pending", f"{job}: starting (no summary.json yet)"
            return "running", job
        # the job has ended
        if word in FINAL:
            return word, f"{job}" + (f"; {final_detail}" if final_detail else "")
        if s == "PREEMPTED":
            return "preempted", f"{job} before the run saved a stop checkpoint (it resumes from its last epoch checkpoint)"
        return "failed", (f"{job} (exit code {sched['exit_code'] or '?'}) but summary.json "
                          f"says {word or 'nothing'}: the run did not finish")
    sched_note = ""
    if sched is not None:
        sched_note = (f"; SLURM job {job_id}: the scheduler does not know it any more"
                      if sched["state"] == "GONE" else
                      f"; SLURM job {job_id}: the scheduler did not answer ({sched['reason']})")
    if word in FINAL:
        return word, final_detail + sched_note
    if pids:
        if not word:
            return "pending", f"starting: {len(pids)} process(es) alive, no summary.json yet"
        return "running", f"{len(pids)} process(es) of the job alive here"
    if word == "running":
        if sched is not None and sched["state"] == "UNKNOWN":
            return "running", "per summary.json" + sched_note
        if sched is None and not sees_ranks:
            where = {"runai": "in its pods (runai describe job)",
                     "slurm": "on its nodes (no job id, or no scontrol here)"}.get(
                         launcher or "", "elsewhere")
            return "running", f"per summary.json; its processes run {where}, not visible from here"
        return "running", "no process alive: the job died without a word" + sched_note
    if word:
        return word, status + sched_note
    if sched is not None:
        return "failed", f"no summary.json{sched_note}: the job ended before the ranks started"
    return "not started", "no summary.json and no process of the job (a dry run, or never launched)"


def python_check_failure(run_dir: Path) -> Optional[str]:
    """The line a job script printed when its ranks' python could not import what they run
    (ddp_lab.launch.base.python_check), from the pods' logs or the SLURM job's errors."""
    for log in sorted((run_dir / "logs").glob("pod*.log")) + sorted((run_dir / "logs").glob("*.err")):
        try:
            lines = log.read_text(errors="replace").splitlines()
        except OSError:
            continue
        for line in lines:
            if line.startswith("[ddp_lab] ") and (" cannot import " in line or " did not run: " in line):
                return line.removeprefix("[ddp_lab] ") + f" ({log.name})"
    return None


def dead(info: dict) -> bool:
    """summary.json says running but nothing of the job is alive."""
    return info["state"] == "running" and "died without a word" in info["detail"]


def reached(epochs_done: int, step: int, epochs: Any = None) -> str:
    done = f"{epochs_done}/{epochs} epochs" if epochs else f"{epochs_done} epoch(s)"
    return done + (f" + {step} steps" if step else "")


def run_reached(info: dict) -> str:
    """How far the run of `info` got (`reached`)."""
    return reached(info["epochs_done"], info["step_in_epoch"], info["epochs"])


def _fmt(value: Any, spec: str = ".4f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "?"


def state_said(info: dict) -> str:
    """The state, with what it rests on in brackets."""
    return info["state"] + (f" ({info['detail']})" if info["detail"] else "")


def render(info: dict) -> str:
    lines = [f"run:         {info['run_dir']}", f"state:       {state_said(info)}"]
    if info["stop_requested"]:
        lines.append(f"stop asked:  {info['stop_requested']} (every rank stops at its next check)")
    if info["stop_reason"] and info["state"] in ("preempted", "stopped"):
        lines.append(f"stop reason: {info['stop_reason']}")
    lines.append(f"reached:     {run_reached(info)}"
                 + (f"; checkpoint {info['checkpoint']}" if info["checkpoint"] else "; no checkpoint"))
    m = info["last_epoch"]
    if m:
        lines.append(f"last epoch:  {m['epoch']}: train loss {_fmt(m['train_loss'])}, accuracy "
                     f"{_fmt(m['train_accuracy'])}; test loss {_fmt(m['test_loss'])}, accuracy "
                     f"{_fmt(m['test_accuracy'])}; {_fmt(m['epoch_time_s'], '.2f')} s")
    job = f"launcher {info['launcher'] or '?'}"
    if info["job_id"]:
        job += f", job {info['job_id']}"
    s = info["scheduler"]
    if s:
        job += f": scheduler says {s['state']}"
        if s["exit_code"] and s["state"] not in SLURM_ALIVE:
            job += f", exit code {s['exit_code']}"
        if s["reason"] and s["reason"] != "None":
            job += f" ({s['reason']})"
    if info["processes"] is not None:
        job += f"; {len(info['processes'])} process(es) alive on {info['host']}"
        if info["processes"]:
            job += f" {info['processes'][:8]}"
    lines.append(f"job:         {job}")
    for r in info["ranks"]:
        at = r.get("where") or f"epoch {r.get('epoch', '?')} step {r.get('step', '?')}"
        # 1-based (progress.where)
        lines.append(f"             rank {r.get('rank', '?')} at {at}"
                     + (f" ({r['age_s']:.0f} s ago)" if isinstance(r.get("age_s"), (int, float)) else ""))
    for i, seg in enumerate(info["segments"], 1):
        lines.append(f"allocation {i}: {_segment(seg)}")
    lines.append(f"logs:        {' '.join(info['logs'])}")
    hint = _hint(info)
    if hint:
        lines.append(hint)
    return "\n".join(lines)


def _segment(seg: dict) -> str:
    if not isinstance(seg, dict):
        return str(seg)
    job = f"job {seg['job_id']}" if seg.get("job_id") else "no job id"
    if seg.get("restart"):
        job += f" (restart {seg['restart']})"
    hosts = ",".join(seg.get("hosts") or []) or "?"
    start = (seg.get("start_epoch"), seg.get("start_step") or 0)
    end = (seg.get("end_epoch"), seg.get("end_step") or 0)
    # positions are counts done (epoch_0002.pt: 2 epochs done), never an epoch's number
    span = ("from the start" if not (start[0] or start[1])
            else f"from {reached(start[0] or 0, start[1])} done")
    if end[0] is not None:
        span += f" to {reached(end[0], end[1])} done"
    median = seg.get("epoch_time_s_median")
    per = f", median epoch {median:.2f} s" if isinstance(median, (int, float)) else ""
    return (f"{seg.get('status', '?')}, {job}, {seg.get('launcher', '?')} on {hosts} "
            f"({seg.get('nodes', '?')} node(s), world {seg.get('world_size', '?')}), "
            f"{seg.get('start', '?')} .. {seg.get('end') or 'now'}, {span}{per}")


def _hint(info: dict) -> str:
    run = info["run_dir"]
    if info["state"] in ("running", "pending") and not dead(info):
        return (f"follow:      python -m ddp_lab.status {run} --follow\n"
                f"stop:        python -m ddp_lab.status {run} --stop")
    if to_continue(info):
        return "continue:    " + paste.continue_command(Path(run), info["launcher"]) + (
            f"\nor:          sbatch {run}/job.sbatch" if _resubmits(info) else "")
    return ""


def _resubmits(info: dict) -> bool:
    """A SLURM run whose batch script can be submitted again."""
    return info["launcher"] == "slurm" and (Path(info["run_dir"]) / "job.sbatch").is_file()


def to_continue(info: dict) -> bool:
    """Whether the run ended before its last epoch and can go on."""
    return info["state"] in ("preempted", "stopped", "failed") or dead(info)


def continue_lines(info: dict) -> str:
    """'[status] continue with:' and the command on a line of its own (a SLURM run: or its batch
    script, again)."""
    text = "[status] continue with:\n  " + paste.continue_command(Path(info["run_dir"]),
                                                                   info["launcher"])
    if _resubmits(info):
        text += f"\n[status] or submit its batch script again: sbatch {info['run_dir']}/job.sbatch"
    return text


def one_line(info: dict) -> str:
    m = info["last_epoch"] or {}
    acc = info["test_accuracy"] if info["state"] == "completed" else m.get("test_accuracy")
    state = info["state"] + (" (dead)" if dead(info) else "")
    if info["scheduler"]:
        state += f" [{info['scheduler']['state']}]"
    where = "keeps no records" if info.get("records") is False else run_reached(info)
    name = Path(info["run_dir"]).name
    # a study's `w2_r1`
    if info.get("label") and not name.startswith(info["label"]):
        name = f"{name} ({info['label']})"
    return (f"{name:<48} {state:<22} "
            f"{where:<26} "
            f"acc {_fmt(acc) if acc is not None else '-':<7} job {info['job_id'] or '-'}")
