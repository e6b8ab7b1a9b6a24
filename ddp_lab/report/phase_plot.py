"""The report's phase figure: where a step's time goes, one stacked bar
per point.

Bars lie horizontally, a row per name, so long names never meet. One
panel per workload, each on its own x axis from zero (a 5 ms step beside
a 430 ms one would be a sliver on a shared one; the tables compare the
workloads), its scale said under its bars.
"""

from __future__ import annotations

from .plots import FULL_CHARS, PHASE_COLORS, _distinct, _plt, fit_title, title_chars
from .style import sync_color
from .run import PHASES
from .tables import _mean, workload_titles

# inches of figure height per bar: one line of 8-point text with room
BAR_IN = 0.3
# a panel's x ticks and their label, in bars' heights
AXIS_ROWS = 1.5
XLABEL = "time per step (ms, mean over the runs of a bar; this panel's own scale)"


def _points(rows: list[dict]) -> dict[tuple, list[dict]]:
    """Runs with phase times by point: (device, workload, sync, world,
    nodes x procs, fingerprint); a study's repeats are one point."""
    points: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("step_ms") is not None:
            key = (r["device"], r["workload"], r["sync"], r["world_size"] or 1,
                   r["allocation"], r["fingerprint_id"])
            points.setdefault(key, []).append(r)
    return {k: points[k] for k in sorted(points, key=str)}


def _bar(key: tuple, rs: list[dict], fids: set[str]) -> dict:
    """One bar: its point, runs, mean ms per phase, and its name ("ring
    · 2 ranks · 3 runs")."""
    sync, world, alloc, fid = key[2:]
    nodes = alloc.split("x")[0]
    where = f"{world} rank{'s' if world > 1 else ''}" \
        + (f"/{nodes} nodes" if nodes not in ("1", "?") else "") + (f" [{fid}]" if len(fids) > 1 else "")
    runs = f"{len(rs)} run{'s' if len(rs) > 1 else ''}"
    return {"sync": sync, "color": sync_color(sync), "workload": key[1], "world_size": world,
            "allocation": alloc,
            "fingerprint_id": fid, "runs": [r["run"] for r in rs],
            "label": f"{where}\n{runs}", "name": f"{sync} · {where} · {runs}",
            **{f"{p}_ms": _mean([r.get(f"{p}_ms") for r in rs]) for p in (*PHASES, "step", "comm")}}


def phase_figure(rows: list[dict]):
    """Stacked mean ms per step of every phase, one bar per point,
    grouped by sync in a panel per workload; a black diamond: the
    measured comm per step (inside backward for ddp)."""
    plt = _plt()
    from matplotlib.colors import to_rgba

    points = _points(rows)
    workloads = list(dict.fromkeys(k[:2] for k in points))
    titles, common = _distinct(workload_titles(rows, workloads))
    panels = []
    for wl in workloads:
        keys = [k for k in points if k[:2] == wl]
        bars, y = [], []
        # half a row between syncs
        for i, k in enumerate(keys):
            y.append((y[-1] if y else -1.0) + 1.0 + (0.5 if i and k[2] != keys[i - 1][2] else 0.0))
            bars.append(_bar(k, points[k], {kk[5] for kk in keys if kk[2] == k[2]}))
        panels.append((wl, bars, y))
    # bars, gaps, the panel's title and (its own scale) its ticks and
    # their label
    rows_in = [y[-1] + 1.6 + AXIS_ROWS for _, _, y in panels]
    fig, axes = plt.subplots(len(panels), 1, squeeze=False, layout="constrained",
                             figsize=(10, 1.2 + BAR_IN * sum(rows_in)), height_ratios=rows_in)
    legend = {}
    for ax, (wl, bars, y) in zip(axes[:, 0], panels):
        left = [0.0] * len(bars)
        for p in PHASES:
            w = [b[f"{p}_ms"] or 0.0 for b in bars]
            ax.barh(y, w, left=left, height=0.7, color=PHASE_COLORS[p],
                    label=p if p != "sync" else "sync (comm)")
            left = [a + v for a, v in zip(left, w)]
        comm = [(yi, b["comm_ms"]) for yi, b in zip(y, bars) if b["comm_ms"]]
        if comm:
            ax.scatter([c[1] for c in comm], [c[0] for c in comm], marker="D", color="black",
                       zorder=3, label="measured comm / step")
        # a bar's name framed in its sync's colour, as the sync's bars
        # and lines in the other figures (the bars' own colours are the
        # phases'); the text stays black to read
        ax.set_yticks(y, labels=[b["name"] for b in bars], fontsize=8)
        for tick, b in zip(ax.get_yticklabels(), bars):
            tick.set_bbox({"boxstyle": "round,pad=0.25", "facecolor": to_rgba(b["color"], 0.25),
                           "edgecolor": b["color"], "linewidth": 1.5})
        # the first bar on top, as read
        ax.set_ylim(y[-1] + 0.8, -0.8)
        # its own scale: the longest bar (or diamond) sets it
        ax.set_xlim(0, None)
        ax.set_xlabel(XLABEL, fontsize=8)
        ax.grid(True, axis="x", alpha=0.3)
        if len(panels) > 1:
            ax.set_title(fit_title(titles[wl], FULL_CHARS), fontsize=9)
        # every panel draws every phase: the legend takes each label
        # once
        handles, labels = ax.get_legend_handles_labels()
        legend.update(zip(labels, handles))
    # stacking order after it
    order = sorted(legend, key=lambda k: k != "measured comm / step")
    fig.legend([legend[k] for k in order], order, loc="outside right upper", fontsize=8)
    fig.suptitle(fit_title("Phase times per step" + (f": {common}" if common else ""),
                           title_chars(fig.get_figwidth(), order)), fontsize=10)
    bars = [b for _, bs, _ in panels for b in bs]
    return fig, {"title": "phase times per step",
                 "series": list(PHASES) + (["comm"] if any(b["comm_ms"] for b in bars) else []),
                 "colors": {b["sync"]: b["color"] for b in bars},
                 "bars": [b["label"] for b in bars], "data": bars}
