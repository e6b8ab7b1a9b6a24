"""The allocations of a training run that used several: one row per
segment of its summary.json (a SLURM requeue, a re-created pod or a
resume starts a new one)."""

from __future__ import annotations

import datetime
from typing import Any

from .run import Run


def segment_rows(runs: list[Run], short) -> list[dict[str, Any]]:
    """One row per allocation of every training run that used several
    (summary.json `segments`: a requeued SLURM job, a re-created pod, a
    resumed run)."""
    rows: list[dict[str, Any]] = []
    for r in runs:
        segs = r.summary.get("segments") if r.kind == "train" else None
        if not isinstance(segs, list) or len(segs) < 2:
            continue
        for i, seg in enumerate(s for s in segs if isinstance(s, dict)):
            wall = None
            try:
                wall = (datetime.datetime.fromisoformat(seg["end"])
                        - datetime.datetime.fromisoformat(seg["start"])).total_seconds()
            except (KeyError, TypeError, ValueError):
                pass
            rows.append({
                "run": short(str(r.path)), "segment": i + 1, "job_id": seg.get("job_id"),
                "restart": seg.get("restart"), "nodes": seg.get("nodes"),
                "hosts": ",".join(seg.get("hosts") or []), "start": seg.get("start"),
                "wall_s": wall, "from": _position(seg, "start"), "to": _position(seg, "end"),
                "steps_done": seg.get("steps_done"), "epochs_done": seg.get("epochs_done"),
                "epoch_time_s_median": seg.get("epoch_time_s_median"),
                "status": seg.get("status")})
    return rows


def _position(seg: dict, which: str) -> str:
    epoch, step = seg.get(f"{which}_epoch"), seg.get(f"{which}_step")
    if epoch is None:
        return "?"
    return f"epoch {epoch}" + (f" + {step} steps" if step else "")


def segments_markdown(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    def num(x, fmt):
        return "-" if x is None else format(x, fmt)
    lines = ["## Allocations of runs that used several", "",
             "One row per segment of summary.json: a SLURM requeue, a re-created pod or a "
             "resume starts a new one. Epoch time: the median of the epochs the segment "
             "finished (\"-\": it finished none).", "",
             "| run | # | job | restart | nodes | hosts | start | wall s | from | to | steps "
             "| epochs | epoch s | status |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for row in rows:
        lines.append(
            f"| `{row['run']}` | {row['segment']} | {row['job_id'] or '-'} | "
            f"{num(row['restart'], 'd')} | {num(row['nodes'], 'd')} | {row['hosts'] or '-'} | "
            f"{row['start'] or '-'} | {num(row['wall_s'], '.0f')} | {row['from']} | {row['to']} | "
            f"{num(row['steps_done'], 'd')} | {num(row['epochs_done'], 'd')} | "
            f"{num(row['epoch_time_s_median'], '.2f')} | {row['status'] or '-'} |")
    return lines + [""]
