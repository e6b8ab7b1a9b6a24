"""How `python -m ddp_lab.status` shows a run (`inspect`'s data, ddp_lab/command/status.py):
`render` for one run folder, `one_line` per run of a folder of runs, and the command that
continues a run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .status import SLURM_ALIVE, dead


def reached(epochs_done: int, step: int, epochs: Any = None) -> str:
    done = f"{epochs_done}/{epochs} epochs" if epochs else f"{epochs_done} epoch(s)"
    return done + (f" + {step} steps" if step else "")


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
    lines.append(f"reached:     {reached(info['epochs_done'], info['step_in_epoch'], info['epochs'])}"
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
        lines.append(f"             rank {r.get('rank', '?')} at epoch {r.get('epoch', '?')} step "
                     f"{r.get('step', '?')} phase {r.get('phase', '?')}"
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
    span = f"from {reached(start[0] or 0, start[1])}"
    if end[0] is not None:
        span += f" to {reached(end[0], end[1])}"
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
    if info["state"] in ("preempted", "stopped", "failed") or dead(info):
        return "continue:    " + continue_command(info)
    return ""


def continue_command(info: dict) -> str:
    run = info["run_dir"]
    cmd = f"python -m ddp_lab run.dir={run}"
    if info["launcher"] and info["launcher"] != "local":
        cmd += f" launcher={info['launcher']}"
    cmd += "   (the same overrides; train.resume=auto continues from its newest checkpoint)"
    if info["launcher"] == "slurm" and (Path(run) / "job.sbatch").is_file():
        cmd += f", or: sbatch {run}/job.sbatch"
    return cmd


def one_line(info: dict) -> str:
    m = info["last_epoch"] or {}
    acc = info["test_accuracy"] if info["state"] == "completed" else m.get("test_accuracy")
    state = info["state"] + (" (dead)" if dead(info) else "")
    if info["scheduler"]:
        state += f" [{info['scheduler']['state']}]"
    where = ("keeps no records" if info.get("records") is False
             else reached(info['epochs_done'], info['step_in_epoch'], info['epochs']))
    name = Path(info["run_dir"]).name
    if info.get("label") and not name.startswith(info["label"]):  # a study's `w2_r1`
        name = f"{name} ({info['label']})"
    return (f"{name:<48} {state:<22} "
            f"{where:<26} "
            f"acc {_fmt(acc) if acc is not None else '-':<7} job {info['job_id'] or '-'}")

