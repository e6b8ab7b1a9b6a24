"""How `python -m ddp_lab.status` shows a run: its screen (`render`) and
its line (`one_line`).

The state comes from `inspect` (status.py); the lines that say how to go
on with a run (`continue_command`) are also what --follow and --stop end
with.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .status import SLURM_ALIVE, dead
from . import paste


def reached(epochs_done: int, step: int, epochs: Any = None) -> str:
    done = f"{epochs_done}/{epochs} epochs" if epochs else f"{epochs_done} epoch(s)"
    return done + (f" + {step} steps" if step else "")


def run_reached(info: dict) -> str:
    """How far the run of `info` got (`reached`)."""
    return reached(info["epochs_done"], info["step_in_epoch"], info["epochs"])


def _fmt(value: Any, spec: str = ".4f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "?"


def render(info: dict) -> str:
    lines = [f"run:         {info['run_dir']}"]
    state = info["state"] + (f" ({info['detail']})" if info["detail"] else "")
    lines.append(f"state:       {state}")
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
    # positions are counts done (epoch_0002.pt: 2 epochs done), never an
    # epoch's number
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
        text = "continue:    " + continue_command(info)
        if info["launcher"] == "slurm" and (Path(run) / "job.sbatch").is_file():
            text += f"\nor:          sbatch {run}/job.sbatch"
        return text
    return ""


def to_continue(info: dict) -> bool:
    """Whether the run ended before its last epoch and can go on."""
    return info["state"] in ("preempted", "stopped", "failed") or dead(info)


def continue_command(info: dict) -> str:
    """The command that continues the run (paste.continue_command: every
    override it started with), alone: it pastes as printed."""
    return paste.continue_command(Path(info["run_dir"]), info["launcher"])


def continue_lines(info: dict) -> str:
    """'[status] continue with:' and the command on a line of its own (a
    SLURM run: or its batch script, again)."""
    text = "[status] continue with:\n  " + continue_command(info)
    run = info["run_dir"]
    if info["launcher"] == "slurm" and (Path(run) / "job.sbatch").is_file():
        text += f"\n[status] or submit its batch script again: sbatch {run}/job.sbatch"
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
