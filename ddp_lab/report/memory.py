"""What one rank holds, per run: parameters, gradients and optimiser
state (summary.json's memory_* fields). sync=zero1 shards the optimiser
state, so its column falls as 1/world while the others stay: the table
puts runs of one model side by side to show it."""

from __future__ import annotations

from typing import Any

from .run import Run

KINDS = ("param", "grad", "optimizer_state")


def memory_rows(runs: list[Run], short) -> list[dict[str, Any]]:
    """One row per completed training run that recorded its memory, by
    model, world, sync."""
    rows = []
    for r in runs:
        s = r.summary
        if r.kind != "train" or not r.ok or s.get("memory_optimizer_state_bytes") is None:
            continue
        rows.append({"run": short(str(r.path)), "model": s.get("model"), "sync": s.get("sync"),
                     "world_size": r.world_size,
                     **{f"{k}_MB": s[f"memory_{k}_bytes"] / 1e6 for k in KINDS}})
    return sorted(rows, key=lambda x: (str(x["model"]), x["world_size"] or 0, str(x["sync"])))


def memory_markdown(rows: list[dict[str, Any]]) -> list[str]:
    if not rows:
        return []
    lines = ["## Memory per rank", "",
             "What one rank holds (summary.json `memory_*_bytes`): sync=zero1 keeps "
             "1/world of the optimiser state, every other sync all of it.", "",
             "| model | ranks | sync | parameters MB | gradients MB | optimiser state MB | run |",
             "| --- | ---: | --- | ---: | ---: | ---: | --- |"]
    lines += [f"| {r['model']} | {r['world_size']} | {r['sync']} | {r['param_MB']:.1f} | "
              f"{r['grad_MB']:.1f} | {r['optimizer_state_MB']:.1f} | `{r['run']}` |" for r in rows]
    return lines + [""]
