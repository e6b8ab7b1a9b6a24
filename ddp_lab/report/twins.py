"""Library twins side by side: per idea (a sharded optimiser, the ring,
...), ddp_lab's synchroniser beside torch's, each against DDP on the
same workload, seed, length, world and device: the weights' largest
difference from DDP's (equal `weights_sha256` read as 0 without
loading), each rank's optimiser state, the bytes sent and the time per
step. One table and twins.png (docs/twins.md); `section` is the
report's one call into this module."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from .run import Run, usable
from .tables import md_row

#: the synchronisers whose runs the table shows, by idea (a ddp run with sync.hook: `_idea`)
IDEAS = {"zero1": "sharded optimiser", "torch_zero": "sharded optimiser",
         "fsdp2": "sharded optimiser", "ring": "ring", "reduce_broadcast": "reduce + broadcast"}
HOOK_IDEAS = {"ring": "ring", "ring_prepost": "ring", "reduce_broadcast": "reduce + broadcast",
              "allreduce": "torch's comm hooks", "fp16": "torch's comm hooks",
              "bf16": "torch's comm hooks", "powersgd": "torch's comm hooks"}
# torch's synchronisers: a table needs one of them, or a hook
TWINS = ("torch_zero", "fsdp2")


def _idea(run: Run) -> Optional[str]:
    d = run.description
    if d.sync == "ddp":
        return HOOK_IDEAS.get(str(d.options.get("hook", "none")))
    return IDEAS.get(d.sync)


def _is_reference(run: Run) -> bool:
    d = run.description
    return d.sync == "ddp" and not d.options and not d.s.get("entry")


def _point(run: Run) -> tuple:
    """What a run shares with its DDP reference: workload, length, seed, world, device."""
    d = run.description
    # as JSON: a workload's settings may hold lists (model.hidden=[1024])
    return json.dumps([d.workload, d.length, run.cfg("train").get("seed", 0), run.world_size,
                       run.device_kind], sort_keys=True, default=str)


def _weights_diff(run: Run, ref: Run) -> Optional[float]:
    a, b = run.summary.get("weights_sha256"), ref.summary.get("weights_sha256")
    if a and a == b:
        return 0.0
    # torch: only when two runs' weights differ
    from ..folder import weights

    x, y = weights.load(run.path), weights.load(ref.path)
    if x is None or y is None or set(x) != set(y):
        return None
    return max((float((x[k].double() - y[k].double()).abs().max()) for k in y
                if x[k].shape == y[k].shape and x[k].is_floating_point()), default=None)


def _state(run: Run) -> tuple[Optional[int], Optional[int]]:
    s = run.summary
    every = s.get("memory_optimizer_state_bytes_per_rank")
    if every:
        return max(every), min(every)
    one = s.get("memory_optimizer_state_bytes")
    return one, one


def _row(r: Run, ref: Run, idea: str, short) -> dict[str, Any]:
    """One run's row beside its DDP reference `ref` (itself for DDP's)."""
    big, small = _state(r)
    ref_big, _ = _state(ref)
    steps = r.summary.get("steps_run") or 0
    sent = r.summary.get("comm_bytes_sent")
    n, own = r.world_size or 1, r is ref
    if own:
        # DDP against itself: its share n exactly, no sent bytes as 0
        sent, steps = sent or 0, max(1, steps)
    # the largest rank's state over DDP's share of it (1/world of DDP's): 1 = even
    share = float(n) if own else (big / (ref_big / n) if big and ref_big else None)
    return {
        "idea": idea, "sync": "ddp" if own else r.description.sync_label(),
        "world_size": n, "workload": r.description.workload_words(length=True),
        "run": short(str(r.path)), "reference": short(str(ref.path)),
        "max_abs_diff_vs_ddp": 0.0 if own else _weights_diff(r, ref),
        "state_bytes_max": big, "state_bytes_min": small,
        "state_max_vs_ddp_share": share,
        "sent_bytes_per_step": sent / steps if sent is not None and steps else None,
        "bytes_exact": r.summary.get("comm_bytes_exact"),
        "step_ms": r.summary.get("step_time_ms_mean"),
    }


def rows(runs: list[Run], short) -> list[dict[str, Any]]:
    """One row per run of an idea that has a twin at its point, its DDP reference first."""
    train = usable(runs)
    refs: dict[tuple, Run] = {}
    for r in filter(_is_reference, train):
        refs.setdefault(_point(r), r)
    out = [_row(r, refs[_point(r)], _idea(r), short) for r in train
           if _idea(r) is not None and _point(r) in refs]
    ideas = {x["idea"] for x in out if x["sync"].split()[0] in TWINS or " hook=" in x["sync"]}
    # each idea with a twin of torch's, DDP's own row at the head of each of its blocks
    shown = [x for x in out if x["idea"] in ideas]
    for idea in ideas:
        for point in {(x["workload"], x["world_size"], x["reference"]) for x in shown
                      if x["idea"] == idea}:
            ref = next(r for r in train if short(str(r.path)) == point[2])
            shown.append(_row(ref, ref, idea, short))
    order = {"ddp": 0}
    return sorted(shown, key=lambda x: (x["idea"], x["workload"], x["world_size"],
                                        order.get(x["sync"], 1), x["sync"]))


def _fmt(v: Any, kind: str) -> str:
    if v is None:
        return "-"
    if kind == "diff":
        return "0 (equal)" if v == 0 else f"{v:.1e}"
    return f"{v / 1e6:.3f}" if kind == "MB" else f"{v:.3f}" if kind == "x" else f"{v:.1f}"


def table(rows_: list[dict[str, Any]]) -> list[str]:
    lines = ["| idea | ranks | sync | weights vs ddp (max abs) | optimiser state, largest rank MB "
             "| smallest rank MB | largest / (ddp's / ranks) | sent per step MB | step ms |",
             "| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    return lines + [md_row([
        x["idea"], x["world_size"], x["sync"], _fmt(x["max_abs_diff_vs_ddp"], "diff"),
        _fmt(x["state_bytes_max"], "MB"), _fmt(x["state_bytes_min"], "MB"),
        _fmt(x["state_max_vs_ddp_share"], "x"),
        _fmt(x["sent_bytes_per_step"], "MB") + ("" if x["bytes_exact"] else " (model)"),
        _fmt(x["step_ms"], "ms")]) for x in rows_]


def figure(rows_: list[dict[str, Any]]):
    """Per row: the optimiser state of the largest and smallest rank, and the time per step."""
    from .plots import _plt

    plt = _plt()
    labels = [f"{x['sync']}\n{x['world_size']} ranks" for x in rows_]
    fig, (ax_m, ax_t) = plt.subplots(2, 1, figsize=(max(6.0, 0.9 * len(rows_) + 2), 6.5),
                                     sharex=True)
    xs = list(range(len(rows_)))
    big = [(x["state_bytes_max"] or 0) / 1e6 for x in rows_]
    small = [(x["state_bytes_min"] or 0) / 1e6 for x in rows_]
    ax_m.bar([i - 0.2 for i in xs], big, 0.4, label="largest rank")
    ax_m.bar([i + 0.2 for i in xs], small, 0.4, label="smallest rank")
    ax_m.set_ylabel("optimiser state per rank (MB)")
    ax_m.legend(fontsize=8)
    ax_t.bar(xs, [x["step_ms"] or 0 for x in rows_], 0.6, color="tab:gray")
    ax_t.set_ylabel("time per step (ms)")
    for i, x in enumerate(rows_):
        ax_t.annotate(_fmt(x["max_abs_diff_vs_ddp"], "diff").replace(" (equal)", ""),
                      (i, x["step_ms"] or 0), ha="center", va="bottom", fontsize=7)
    ax_t.set_xticks(xs)
    ax_t.set_xticklabels(labels, rotation=45, ha="right", fontsize=7)
    fig.suptitle("Library twins beside DDP (labels: largest weight difference from DDP)",
                 fontsize=10)
    fig.tight_layout()
    return fig, {"title": "Library twins beside DDP",
                 "series": sorted({x["sync"] for x in rows_})}


def section(runs: list[Run], out_dir: Path, short, make_plots: bool = True) -> dict[str, Any]:
    """The report's twin section: `markdown` lines, `doc` (report.json `twins`), `screen`."""
    found = rows(runs, short)
    if not found:
        return {"markdown": [], "doc": {"rows": []}, "screen": ""}
    body = table(found)
    md = ["## Library twins", "",
            "Each idea's synchronisers beside DDP on the same workload, seed, length and world "
            "(docs/twins.md): the final weights' largest difference from DDP's (model.pt), "
            "the optimiser state of the largest and the smallest rank, the bytes a rank sent "
            "per step (rank 0's; `(model)`: the library's, modelled) and the mean time per "
            "step.", "", *body, ""]
    if make_plots:
        from .plots import save

        fig = save(*figure(found), out_dir / "twins.png")
        md += [f"![{fig['title']}]({fig['file']})", ""]
    screen = "\n".join(["", "Library twins (weights vs ddp, optimiser state per rank):",
                        *body]) + "\n"
    return {"markdown": md, "doc": {"rows": found}, "screen": screen}
