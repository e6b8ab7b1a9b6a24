"""Report figures (matplotlib, Agg), one colour per synchroniser in all:
time per epoch, a step's phases, the bench's all-reduce. Each `*_figure`
returns the Figure and what it drew; `save` writes the PNG and its JSON.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

from ..config import SCHEMAS
from ..folder.description import plural
from .alpha_beta import call_time
from .run import PHASES
from .tables import _mean, all_reduce_series, MIN_REPEATS, sig, workload_titles


# One colour per name (a sync, a bench implementation) in every figure, the report's and the
# bench's, a shade of it per option setting: never dependent on which runs a folder holds.

#: the registered syncs' colours, in registration order: tab10 without
#: its grey (the data phase's, and the "no interval" mark's), then more
SYNC_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                "#bcbd22", "#17becf", "#2f4b7c", "#a05195", "#f95d6a", "#665191", "#ffa600",
                "#003f5c", "#d45087")
#: names outside the registry (and syncs beyond SYNC_PALETTE): tab20b's
#: dark row, none of them a SYNC_PALETTE colour
OTHER_COLORS = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#5254a3", "#8ca252",
                "#bd9e39", "#ad494a", "#a55194")
#: an option setting's shade: + towards white, - towards black; the first two furthest apart
SHADES = (0.45, -0.4, -0.6, 0.25, 0.6, -0.2)

GROUP_STYLES = {"global": ("-", "o"), "intra_node": ("--", "s"), "cross_node": (":", "^"),
                "same_node": ("--", "s")}
GROUP_COLORS = {"global": "tab:blue", "intra_node": "tab:orange", "cross_node": "tab:green",
                "same_node": "tab:orange"}
IMPL_MARKERS = {"torch": "o", "ring": "D", "butterfly": "v", "tree": "P", "linear": "x"}
#: the bench's library all_reduce, the line the others are read against
REFERENCE_COLORS = {"torch": "#000000"}


def _hash(text: str) -> int:
    """A hash the same in every process (Python's `hash` is salted)."""
    return int.from_bytes(hashlib.md5(text.encode()).digest()[:4], "big")


def name_color(name: str) -> str:
    if name in REFERENCE_COLORS:
        return REFERENCE_COLORS[name]
    syncs = list(SCHEMAS["sync"])
    if name in syncs and syncs.index(name) < len(SYNC_PALETTE):
        return SYNC_PALETTE[syncs.index(name)]
    return OTHER_COLORS[_hash(name) % len(OTHER_COLORS)]


def _mix(color: str, amount: float) -> str:
    """`color` towards white (amount > 0) or black (< 0) by |amount|."""
    rgb = [int(color[i:i + 2], 16) for i in (1, 3, 5)]
    end = 255 if amount > 0 else 0
    return "#" + "".join(f"{round(c + (end - c) * abs(amount)):02x}" for c in rgb)


def sync_color(label: str) -> str:
    """A series label's colour (`ring`, `ring prepost=true`): its sync's,
    and for an option setting a shade of it (its words in any order)."""
    name, *setting = label.split()
    base = name_color(name)
    if not setting:
        return base
    return _mix(base, SHADES[_hash(" ".join(sorted(setting))) % len(SHADES)])


PHASE_COLORS = {"data": "tab:gray", "forward": "tab:blue", "backward": "tab:orange",
                "sync": "tab:red", "optim": "tab:green"}
MARKERS = "osD^v"  # one per fingerprint of a series (per bench run in bench_figure)
DODGE = 0.05  # log2 units between a panel's lines at one world: none hides another
BAR_IN = 0.3  # inches of figure height per horizontal bar (8-point text with room)
HALF_CHARS, FULL_CHARS = 60, 120  # a 9-point title's characters across half the figure, all


def _plt():
    # lazy: matplotlib takes 0.4 s to load; Agg (no display) must be chosen before pyplot loads
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, info: dict, path: Path) -> dict:
    """Write the PNG and beside it a JSON of what it shows; close it."""
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    info = {"file": path.name, **info}
    path.with_suffix(".json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    return info


def fit_title(text: str, width: int) -> str:
    """`text` on lines of at most `width` characters, broken only between
    its ", "-joined phrases (a longer phrase keeps a line of its own)."""
    lines: list[str] = []
    for phrase in text.split(", "):
        if lines and len(lines[-1]) + 2 + len(phrase) <= width:
            lines[-1] += ", " + phrase
        else:
            lines.append(phrase)
    return ",\n".join(lines)


def title_chars(fig_width_in: float, legend_labels: list[str]) -> int:
    """Characters of a centred 10-point title that stays clear of a
    top-right legend of 8-point labels (a character: 0.55 em wide)."""
    longest = max((len(line) for t in legend_labels for line in t.split("\n")), default=0)
    legend_in = 0.7 + longest * 8 * 0.55 / 72  # marker, padding, the longest label
    room_in = fig_width_in - 2 * (legend_in + 0.2)
    return max(30, int(room_in / (10 * 0.55 / 72)))


def measured(rows: list[dict]) -> str:
    """An axis's words for a time per epoch: after warm-up, warm-up
    included (1-epoch runs), or both (those points marked "warm-up in")."""
    left = [_left_out(r) for r in rows]
    if all(left):
        return "epoch time after warm-up (s)"
    if not any(left):
        return "epoch time, warm-up included (s)"
    return "epoch time (s) after warm-up,\nunless marked \"warm-up in\""


def _left_out(row: dict) -> bool:
    """Whether every repeat of a point left a warm-up epoch out."""
    return min(row.get("warmup_epochs") or [0]) > 0


def _panel(groups: list[dict], rows: list[dict]) -> tuple[int, bool, bool, bool]:
    """A panel's most common n, whether other n's are drawn, whether its series' epoch counts
    differ, whether only some of its points left a warm-up out."""
    counts = Counter(r["time_n"] for r in rows)
    return (counts.most_common(1)[0][0], len(counts) > 1, len({g.get("epochs") for g in groups}) > 1,
            len({_left_out(r) for r in rows}) > 1)


def _distinct(titles: dict[tuple, str], sep: str = ", ") -> tuple[dict[tuple, str], str]:
    """Titles cut to their `sep`-separated parts that differ, and the parts they all share."""
    parts = {k: t.split(sep) for k, t in titles.items()}
    common = [p for p in next(iter(parts.values()), []) if all(p in ps for ps in parts.values())]
    return ({k: sep.join(p for p in ps if p not in common) or titles[k] for k, ps in parts.items()},
            sep.join(common))


def _points(ax, rows: list[dict], shift: float, key: str, ci_key: str, color, marker, common: int,
            nth: int, exact=()) -> None:
    """A series' line and points (`key` of its rows, each world x `shift`): an error bar where
    there is an interval (`ci_key`), else a hollow marker unless `exact`; an n other than `common`
    beside its point (`nth`: lines higher)."""
    x, y = [r["world_size"] * shift for r in rows], [r[key] for r in rows]
    cis, ns = [r[ci_key] for r in rows], [r["time_n"] for r in rows]
    ax.plot(x, y, color=color, lw=1.5)
    bar = [i for i, ci in enumerate(cis) if ci]
    if bar:
        # the interval is around the geometric mean: the mean may sit above it, never below
        lo = [max(0.0, y[i] - cis[i][0]) for i in bar]
        hi = [max(0.0, cis[i][1] - y[i]) for i in bar]
        ax.errorbar([x[i] for i in bar], [y[i] for i in bar], yerr=[lo, hi], fmt=marker,
                    color=color, capsize=3)
    filled = [i for i, ci in enumerate(cis) if not ci and i in exact]
    hollow = [i for i, ci in enumerate(cis) if not ci and i not in exact]
    for idx, face in ((filled, color), (hollow, "white")):
        if idx:
            ax.plot([x[i] for i in idx], [y[i] for i in idx], ls="none", marker=marker,
                    color=color, mfc=face)
    for xi, yi, n in zip(x, y, ns):
        if n != common:
            ax.annotate(f"n={n}", (xi, yi), xytext=(4, 3 + 9 * nth), textcoords="offset points",
                        ha="left", fontsize=7, color=color)


def _line_row(ax_t, ax_e, panel: list[dict], title: str) -> tuple[list, dict, set]:
    """Time per epoch (left) and efficiency (right) vs world, a line per sync and fingerprint,
    each DODGE aside; returns the series, legend handles and the counts below MIN_REPEATS."""
    from matplotlib.lines import Line2D

    worlds: set[int] = set()
    nth = 0
    common, other_ns, epochs, mixed = _panel(panel, [r for g in panel for r in g["rows"]])
    handles, series, few = {}, [], set()
    lines = [(g, fid) for g in panel for fid in dict.fromkeys(r["fingerprint_id"] for r in g["rows"])]
    for k, (g, fid) in enumerate(lines):
        fids = list(dict.fromkeys(r["fingerprint_id"] for r in g["rows"]))
        j = fids.index(fid)  # a fingerprint's marker
        rows = sorted((r for r in g["rows"] if r["fingerprint_id"] == fid),
                      key=lambda r: r["world_size"])
        label = g["sync"] + (f" · {plural(g.get('epochs'), 'epoch')}" if epochs else "") \
            + (f" [{fid}]" if len(fids) > 1 else "") \
            + (" (warm-up in)" if mixed and not _left_out(rows[0]) else "")
        color, marker = sync_color(g["sync"]), MARKERS[j % len(MARKERS)]
        shift = 2 ** (DODGE * (k - (len(lines) - 1) / 2))
        ns = [r["time_n"] for r in rows]
        worlds.update(r["world_size"] for r in rows)
        few.update(n for n in ns if n < MIN_REPEATS)
        _points(ax_t, rows, shift, "epoch_time_s_mean", "epoch_time_s_ci95", color, marker, common, nth)
        n0, t0 = g["baseline_world_size"], g["rows"][0]["epoch_time_s_mean"]
        # ideal: the baseline's time per unit of work (flat where it grows)
        ideal = [t0 * r["efficiency"] / r["speedup"] if r["speedup"] else t0 * n0 / r["world_size"]
                 for r in rows]
        ax_t.plot([r["world_size"] * shift for r in rows], ideal, ":", color=color, alpha=0.7)
        series.append(_drawn(label, g, color, rows))
        eff = [r for r in rows if r["efficiency"] is not None]
        if eff:
            _points(ax_e, eff, shift, "efficiency", "efficiency_ci95", color, marker, common, nth,
                    exact=[i for i, r in enumerate(eff) if r["run"] == r["baseline_run"]])
        nth += any(n != common for n in ns)
        handles.setdefault(label, Line2D([], [], color=color, marker=marker))
    ax_e.axhline(1.0, ls=":", color="black", alpha=0.6)
    n_text = f"n={common}" + (" unless marked" if other_ns else " at every point")
    head = f"{title}\n" if title else ""
    ax_t.set_title(f"{head}time per epoch, {n_text}", fontsize=9)
    ax_t.set_ylabel(measured([r for g in panel for r in g["rows"]]))
    ax_e.set_title(f"{head}efficiency, {n_text}", fontsize=9)
    ax_e.set_ylabel("efficiency vs smallest world")
    for ax in (ax_t, ax_e):
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(worlds), labels=[str(w) for w in sorted(worlds)])
        ax.minorticks_off()
        ax.set_xlabel("world size (ranks)")
        ax.grid(True, alpha=0.3)
        ax.margins(x=0.12)
        # from zero, with room above the highest bar for any n label
        ax.set_ylim(0, ax.dataLim.ymax * (1.08 + 0.06 * nth))
    ax_e.set_ylim(top=max(1.2, ax_e.get_ylim()[1]))
    return series, handles, few


#: a drawn series' keys in the figure's JSON, and the rows' keys they copy
SERIES_KEYS = (("world_size", "world_size"), ("epoch_time_s", "epoch_time_s_mean"),
               ("n", "time_n"), ("epoch_time_s_ci95", "epoch_time_s_ci95"),
               ("efficiency", "efficiency"), ("efficiency_ci95", "efficiency_ci95"),
               ("speedup", "speedup"))


def _drawn(label: str, g: dict, color: str, rows: list[dict]) -> dict:
    """A line's or bar's entry in the figure's JSON."""
    return {"label": label, "sync": g["sync"], "color": color, "workload": g["workload"],
            "device": g["device"], **{k: [r[key] for r in rows] for k, key in SERIES_KEYS},
            "baseline_world_size": g["baseline_world_size"]}


def _bar_row(ax, panel: list[dict], title: str) -> list[dict]:
    """A workload at one world size per sync: a horizontal bar per point, its mean time (and
    an n not the panel's) at its end, the 95% interval as an error bar."""
    pts = [(g, r) for g in panel for r in g["rows"]]
    worlds = sorted({r["world_size"] for _, r in pts})
    allocs = sorted({f"{r['nodes']}x{r['nproc_per_node']}" for _, r in pts})
    common, other_ns, epochs, mixed = _panel(panel, [r for _, r in pts])
    names = [g["sync"] + (f" · {r['world_size']} ranks" if len(worlds) > 1 else "")
             + (f" · {plural(g.get('epochs'), 'epoch')}" if epochs else "")
             + (f" [{r['fingerprint_id']}]" if len({x["fingerprint_id"] for x in g["rows"]}) > 1 else "")
             for g, r in pts]
    colors = [sync_color(g["sync"]) for g, _ in pts]
    # with and without an interval apart: bar_label puts a label at its error bar's end
    for has_ci in (True, False):
        idx = [i for i, (_, r) in enumerate(pts) if bool(r["epoch_time_s_ci95"]) == has_ci]
        if not idx:
            continue
        mean = [pts[i][1]["epoch_time_s_mean"] for i in idx]
        cis = [pts[i][1]["epoch_time_s_ci95"] for i in idx]
        # the interval is around the geometric mean: never below zero, nor above the mean's bar
        xerr = [[max(0.0, m - c[0]) for m, c in zip(mean, cis)],
                [max(0.0, c[1] - m) for m, c in zip(mean, cis)]] if has_ci else None
        bars = ax.barh(idx, mean, xerr=xerr, height=0.7, capsize=3, color=[colors[i] for i in idx])
        ax.bar_label(bars, padding=3, fontsize=8, labels=[
            f"{sig(m)} s" + (f", n={pts[i][1]['time_n']}" if pts[i][1]["time_n"] != common else "")
            + (", warm-up in" if mixed and not _left_out(pts[i][1]) else "")
            for i, m in zip(idx, mean)])
    ax.set_yticks(range(len(pts)), labels=names, fontsize=8)
    # the first point on top, as read
    ax.set_ylim(len(pts) - 0.4, -0.6)
    # room for the longest bar's label (about 1% of the axis a character)
    ax.margins(x=max(0.15, 0.012 * max(len(t.get_text()) for t in ax.texts)))
    ax.set_xlim(left=0)
    ax.set_xlabel(measured([r for _, r in pts]))
    ax.grid(True, axis="x", alpha=0.3)
    where = (f"at {worlds[0]} ranks ({allocs[0]})" if len(worlds) == 1 and len(allocs) == 1
             else f"at {', '.join(map(str, worlds))} ranks, named per bar")
    n_text = f"n={common}" + (" unless marked" if other_ns else " at every bar")
    no_ci = f"; no interval below n={MIN_REPEATS}" if common < MIN_REPEATS else ""
    head = f"{title}\n" if title else ""
    ax.set_title(f"{head}time per epoch {where}, {n_text}{no_ci}", fontsize=9)
    # one world per series: no speedup nor efficiency (tables.scaling_groups)
    return [_drawn(name, g, color, [r]) for (g, r), name, color in zip(pts, names, colors)]


def epoch_time_figure(groups: list[dict]):
    """A row per workload: `_line_row`, or `_bar_row` at one world (docs/scaling.md)."""
    plt = _plt()
    from matplotlib.lines import Line2D

    # a panel per device and workload but its epoch count, its title cut to what sets it apart
    keys = list(dict.fromkeys((g["device"], g.get("workload_panel", g["workload"])) for g in groups))
    several = len({k[0] for k in keys}) > 1
    full = {k: (f"{k[0]}, " if several else "") + k[1] for k in keys}
    titles, common = ({keys[0]: ""}, full[keys[0]]) if len(keys) == 1 else _distinct(full)
    panels = [[g for g in groups if (g["device"], g.get("workload_panel", g["workload"])) == key]
              for key in keys]
    lines = [any(len({r["world_size"] for r in g["rows"]}) > 1 for g in p) for p in panels]
    heights = [3.4 if line else 1.0 + BAR_IN * sum(len(g["rows"]) for g in p)
               for p, line in zip(panels, lines)]
    fig = plt.figure(figsize=(11, 1.0 + sum(heights)), layout="constrained")
    grid = fig.add_gridspec(len(keys), 2, height_ratios=heights)
    handles: dict[str, Line2D] = {}
    series, few, line_x = [], set(), None
    for i, (key, panel, line) in enumerate(zip(keys, panels, lines)):
        # the world-size axis is one quantity: every line panel shares it
        if line:
            ax_t = fig.add_subplot(grid[i, 0], sharex=line_x)
            line_x = line_x or ax_t
            # a title within its half of the figure runs into no other
            s, h, f = _line_row(ax_t, fig.add_subplot(grid[i, 1], sharex=ax_t), panel,
                                fit_title(titles[key], HALF_CHARS))
            series += s
            few |= f
            handles.update((k, v) for k, v in h.items() if k not in handles)
        else:
            series += _bar_row(fig.add_subplot(grid[i, :]), panel, fit_title(titles[key], FULL_CHARS))
    # a bar is named on its axis; a line's sync is in the legend
    if any(lines):
        handles["ideal scaling"] = Line2D([], [], ls=":", color="black")
    if few:
        text = "n=" + " or ".join(map(str, sorted(few))) + ": interval\nnot meaningful (no bar)"
        handles[text] = Line2D([], [], ls="none", marker="o", color="gray", mfc="white")
    if handles:
        fig.legend(list(handles.values()), list(handles), loc="outside right upper", fontsize=8)
    what = "Time per epoch" + (" and parallel efficiency" if any(lines) else "")
    # the legend takes the top right: the centred title keeps clear of it
    fig.suptitle(fit_title(f"{what}: {common}" if common else what,
                           title_chars(fig.get_figwidth(), list(handles)))
                 + "\nerror bars: 95% CI, n = repeats", fontsize=10)
    return fig, {"title": "epoch time and efficiency vs world size",
                 "series": list(dict.fromkeys(s["label"] for s in series)),
                 "colors": {s["sync"]: s["color"] for s in series}, "data": series}


# The phase figure: where a step's time goes, a stacked bar per point.

AXIS_ROWS = 1.5  # a panel's x ticks and their label, in bars' heights
XLABEL = "time per step (ms, mean over the runs of a bar; this panel's own scale)"


def _phase_points(rows: list[dict]) -> dict[tuple, list[dict]]:
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
    """One bar: its point, runs, mean ms per phase and name."""
    sync, world, alloc, fid = key[2:]
    nodes = alloc.split("x")[0]
    where = f"{world} rank{'s' if world > 1 else ''}" \
        + (f"/{nodes} nodes" if nodes not in ("1", "?") else "") + (f" [{fid}]" if len(fids) > 1 else "")
    runs = f"{len(rs)} run{'s' if len(rs) > 1 else ''}"
    return {"sync": sync, "color": sync_color(sync), "workload": key[1], "world_size": world,
            "allocation": alloc, "fingerprint_id": fid, "runs": [r["run"] for r in rs],
            "label": f"{where}\n{runs}", "name": f"{sync} · {where} · {runs}",
            **{f"{p}_ms": _mean([r.get(f"{p}_ms") for r in rs]) for p in (*PHASES, "step", "comm")}}


def phase_figure(rows: list[dict]):
    """Stacked mean ms per step of every phase, a bar per point, by sync
    in a panel per workload; a diamond: the measured comm per step."""
    plt = _plt()
    from matplotlib.colors import to_rgba

    points = _phase_points(rows)
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
    # bars, gaps, the panel's title, its own ticks and their label
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
        # a bar's name framed in its sync's colour (the bars' colours are the phases')
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
        # every panel draws every phase: the legend takes each label once
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


# The bench figure: every bench run's all_reduce, by bytes per rank.

LINESTYLES = ("-", "--", ":", "-.")  # one per bench run where the group kinds do not vary


def bench_names(fits: list[dict]) -> tuple[list[str], str]:
    """A short name per bench run (the allocation, else what differs in the folders' names:
    "bench 17-31-31"), and what they all share."""
    allocs = [f["run"].bench.get("meta", {}).get("allocation") or f["run"].path.name for f in fits]
    if len(allocs) == 1:
        return allocs, allocs[0]
    if len(set(allocs)) == len(allocs):
        return allocs, ""
    common = allocs[0] if len(set(allocs)) == 1 else ""
    folders, _ = _distinct({(i,): f["run"].path.name for i, f in enumerate(fits)}, sep="_")
    return [a if allocs.count(a) == 1 else f"bench {folders[(i,)]}"
            for i, a in enumerate(allocs)], common


def _series(run) -> dict[tuple[str, str], list[dict]]:
    """A bench run's correct all_reduce points by (impl, group), sized up."""
    return {k: sorted(v, key=lambda r: r["bytes"]) for k, v in all_reduce_series(run, True).items()}


def bench_figure(fits: list[dict]):
    """all_reduce by bytes per rank: busbw (left), time per call and its alpha-beta fit
    (right); colour = implementation, marker (and line style) = bench run."""
    plt = _plt()
    fits = [f for f in fits if _series(f["run"])]
    names, common = bench_names(fits)
    groups = {k[1] for f in fits for k in _series(f["run"])}
    fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(13, 5.6), sharex=True, layout="constrained")
    series = []
    for i, (f, name) in enumerate(zip(fits, names)):
        by_key = {(x.impl, x.group): x for x in f["fits"]}
        for (impl, group), pts in _series(f["run"]).items():
            # the group kind sets the line style where several were measured, else the run
            ls = GROUP_STYLES.get(group, ("-", "o"))[0] if len(groups) > 1 else LINESTYLES[i % 4]
            style = {"color": name_color(impl), "marker": MARKERS[i % len(MARKERS)],
                     "linestyle": ls, "ms": 4}
            label = " · ".join(p for p in (name if len(fits) > 1 else "", impl,
                                           group if len(groups) > 1 else "") if p) \
                + f" (n={pts[0]['group_size']})"
            b, fit = [r["bytes"] for r in pts], by_key.get((impl, group))
            bw, ms = [r["busbw_GBps"] for r in pts], [r["time_median_s"] * 1e3 for r in pts]
            ax_bw.plot(b, bw, label=label, **style)
            ax_t.plot(b, ms, **style)
            pred = [call_time("all_reduce", impl, v, fit.n, fit) * 1e3 for v in b] if fit else None
            # thick and pale, under its points: the fit's line
            if pred:
                ax_t.plot(b, pred, color=style["color"], lw=5, alpha=0.25, zorder=1)
            series.append({"label": label, "run": str(f["run"].path), "impl": impl, "group": group,
                           "color": style["color"], "bytes": b, "busbw_GBps": bw, "time_ms": ms,
                           "fit_time_ms": pred, "alpha_us": fit.alpha_s * 1e6 if fit else None,
                           "bandwidth_GBps": fit.bandwidth_GBps if fit else None})
    for ax in (ax_bw, ax_t):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes per rank (log scale)")
        ax.grid(True, alpha=0.3)
    ax_bw.set_ylabel("busbw (GB/s = 1e9 bytes/s)")
    ax_bw.set_ylim(bottom=0)
    ax_bw.set_title("all_reduce bus bandwidth (higher is better)", fontsize=10)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time per call (ms, median)")
    ax_t.set_title("time per call; thick, pale: its alpha-beta fit", fontsize=10)
    if series:
        fig.legend(loc="outside lower center", ncol=min(3, len(series)), fontsize=8, frameon=False)
    fig.suptitle("all_reduce across bench runs" + (f": {common}" if common else " (allocations)"),
                 fontsize=11)
    return fig, {"title": "all_reduce across bench runs",
                 "series": [s["label"] for s in series],
                 "colors": {s["impl"]: s["color"] for s in series}, "data": series}
