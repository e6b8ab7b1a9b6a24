"""Report figures (matplotlib, Agg), each with a sidecar JSON of the series drawn.

Each `*_figure` function returns the Figure and what it drew; `save` writes the PNG and
the JSON. Tests read the returned Figure's own artists (legend, error bars, limits).
Layout is matplotlib's constrained layout with every legend outside the axes
(`fig.legend(loc="outside ...")`): a legend never covers a point or an axis label.
"""

from __future__ import annotations

import json
import textwrap
from collections import Counter
from pathlib import Path

from .model import call_time
from .runs import PHASES
from .stats import MIN_REPEATS
from .tables import workload_titles

PHASE_COLORS = {"data": "tab:gray", "forward": "tab:blue", "backward": "tab:orange",
                "sync": "tab:red", "optim": "tab:green"}
MARKERS = "osD^v"  # one per fingerprint of a series


def _plt():
    # lazy: matplotlib takes 0.4 s to load and a report without plots (or its --help) needs
    # none; the Agg backend (no display) must be chosen before pyplot loads
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, info: dict, path: Path) -> dict:
    """The PNG, and beside it a JSON of what it shows; the figure is closed."""
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    info = {"file": path.name, **info}
    path.with_suffix(".json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    return info


def _distinct(titles: dict[tuple, str]) -> tuple[dict[tuple, str], str]:
    """Titles cut to the parts that differ ("20 steps/epoch" vs "50 steps/epoch"), and
    the parts they share ("mlp, batch 64/rank")."""
    parts = {k: t.split(", ") for k, t in titles.items()}
    common = [p for p in next(iter(parts.values()), []) if all(p in ps for ps in parts.values())]
    return ({k: ", ".join(p for p in ps if p not in common) or titles[k] for k, ps in parts.items()},
            ", ".join(common))


def _points(ax, x, y, cis, ns, color, marker, common: int, exact=(), nth=0) -> None:
    """A series' line and points: an error bar where there is an interval, a hollow marker
    where there is none (fewer than MIN_REPEATS repeats) unless the value is exact (a
    baseline against itself). A point whose n is not the panel's `common` one (said in its
    title) gets its n at its upper right, clear of the bar (the panel's `nth` series one
    line higher: two series at one world never write over each other)."""
    ax.plot(x, y, color=color, lw=1.5)
    bar = [i for i, ci in enumerate(cis) if ci]
    if bar:
        # the interval is around the geometric mean: the (arithmetic) mean may sit at its
        # upper edge, never below its lower one
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


def epoch_time_figure(groups: list[dict]):
    """One row of panels per workload (device and workload: capped and full epochs never
    share an axis): mean post-warm-up time per epoch (left) and parallel efficiency
    (right) vs world size, one colour per sync (a marker per fingerprint where a series
    has several). Error bars: the 95% interval (t on log time, never below zero), only
    where n >= MIN_REPEATS (else a hollow marker). Every point's n: the panel's most common
    one in its title, any other beside its point. Dotted: ideal scaling."""
    plt = _plt()
    from matplotlib.lines import Line2D

    keys = list(dict.fromkeys((g["device"], g["workload"]) for g in groups))
    titles = workload_titles(groups, keys)
    colors = {s: f"C{i % 10}" for i, s in enumerate(dict.fromkeys(g["sync"] for g in groups))}
    fig, axes = plt.subplots(len(keys), 2, figsize=(11, 0.8 + 3.4 * len(keys)), squeeze=False,
                             sharex="row", layout="constrained")
    handles: dict[str, Line2D] = {}
    series, few = [], set()
    for (ax_t, ax_e), key in zip(axes, keys):
        worlds: set[int] = set()
        nth = 0
        panel = [g for g in groups if (g["device"], g["workload"]) == key]
        counts = Counter(r["time_n"] for g in panel for r in g["rows"])
        common = counts.most_common(1)[0][0]
        for g in panel:
            fids = list(dict.fromkeys(r["fingerprint_id"] for r in g["rows"]))
            for j, fid in enumerate(fids):
                rows = sorted((r for r in g["rows"] if r["fingerprint_id"] == fid),
                              key=lambda r: r["world_size"])
                label = g["sync"] + (f" [{fid}]" if len(fids) > 1 else "")
                color, marker = colors[g["sync"]], MARKERS[j % len(MARKERS)]
                x = [r["world_size"] for r in rows]
                y = [r["epoch_time_s_mean"] for r in rows]
                ns = [r["time_n"] for r in rows]
                worlds.update(x)
                few.update(n for n in ns if n < MIN_REPEATS)
                _points(ax_t, x, y, [r["epoch_time_s_ci95"] for r in rows], ns, color, marker,
                        common, nth=nth)
                n0, t0 = g["baseline_world_size"], g["rows"][0]["epoch_time_s_mean"]
                # ideal: the baseline's time per unit of work (flat where the work grows with n)
                ideal = [t0 * r["efficiency"] / r["speedup"] if r["speedup"] else t0 * n0 / r["world_size"]
                         for r in rows]
                ax_t.plot(x, ideal, ":", color=color, alpha=0.7)
                eff = [r for r in rows if r["efficiency"] is not None]
                if eff:
                    _points(ax_e, [r["world_size"] for r in eff], [r["efficiency"] for r in eff],
                            [r["efficiency_ci95"] for r in eff], [r["time_n"] for r in eff],
                            color, marker, common, nth=nth,
                            exact=[i for i, r in enumerate(eff) if r["run"] == r["baseline_run"]])
                nth += any(n != common for n in ns)
                handles.setdefault(label, Line2D([], [], color=color, marker=marker))
                series.append({"label": label, "workload": g["workload"], "device": g["device"],
                               "world_size": x, "epoch_time_s": y, "n": ns,
                               "epoch_time_s_ci95": [r["epoch_time_s_ci95"] for r in rows],
                               "efficiency": [r["efficiency"] for r in rows],
                               "efficiency_ci95": [r["efficiency_ci95"] for r in rows],
                               "speedup": [r["speedup"] for r in rows], "baseline_world_size": n0})
        ax_e.axhline(1.0, ls=":", color="black", alpha=0.6)
        n_text = f"n={common}" + (" unless marked" if len(counts) > 1 else " at every point")
        title = textwrap.fill(titles[key], 62)  # within its panel: no title runs into the next
        ax_t.set_title(f"{title}\ntime per epoch, {n_text}", fontsize=9)
        ax_t.set_ylabel("epoch time after warm-up (s)")
        ax_e.set_title(f"{title}\nefficiency, {n_text}", fontsize=9)
        ax_e.set_ylabel("efficiency vs smallest world")
        for ax in (ax_t, ax_e):
            ax.set_xscale("log", base=2)
            ax.set_xticks(sorted(worlds) or [1], labels=[str(w) for w in sorted(worlds)] or ["1"])
            ax.minorticks_off()
            ax.set_xlabel("world size (ranks)")
            ax.grid(True, alpha=0.3)
            ax.margins(x=0.12)
            # from zero, with room above the highest bar for any n label
            ax.set_ylim(0, ax.dataLim.ymax * (1.08 + 0.06 * nth))
        ax_e.set_ylim(top=max(1.2, ax_e.get_ylim()[1]))
    handles["ideal scaling"] = Line2D([], [], ls=":", color="black")
    if few:
        text = "n=" + " or ".join(map(str, sorted(few))) + ": interval\nnot meaningful (no bar)"
        handles[text] = Line2D([], [], ls="none", marker="o", color="gray", mfc="white")
    fig.legend(list(handles.values()), list(handles), loc="outside right upper", fontsize=8)
    fig.suptitle("Time per epoch and parallel efficiency per workload; bars: 95% CI, "
                 "n = repeats", fontsize=10)
    return fig, {"title": "epoch time and efficiency vs world size",
                 "series": [s["label"] for s in series], "data": series}


def phase_figure(rows: list[dict]):
    """Stacked mean ms per step of every phase, one bar per point (sync, workload, world,
    nodes x procs, fingerprint: a study's repeats are one bar, their mean, the count under
    it), bars grouped by sync and workload; a black diamond: the measured comm per step
    (inside backward for ddp)."""
    plt = _plt()
    points: dict[tuple, list[dict]] = {}
    for r in rows:
        if r.get("step_ms") is not None:
            key = (r["device"], r["workload"], r["sync"], r["world_size"] or 1,
                   r["allocation"], r["fingerprint_id"])
            points.setdefault(key, []).append(r)
    keys = sorted(points, key=str)
    titles, common = _distinct(workload_titles(rows, list(dict.fromkeys(k[:2] for k in keys))))
    several = len(titles) > 1

    def mean(rs, k):
        vs = [r[k] for r in rs if r.get(k) is not None]
        return sum(vs) / len(vs) if vs else None

    bars, x, pos = [], [], -1.0
    for i, k in enumerate(keys):  # a gap between groups (sync and workload)
        pos += 1.0 + (0.6 if i and k[:3] != keys[i - 1][:3] else 0.0)
        x.append(pos)
        rs = points[k]
        nodes = k[4].split("x")[0]
        where = f"{k[3]} rank{'s' if k[3] > 1 else ''}" \
            + (f"/{nodes} nodes" if nodes not in ("1", "?") else "")
        fids = {kk[5] for kk in keys if kk[:3] == k[:3]}
        bars.append({"sync": k[2], "workload": k[1], "world_size": k[3], "allocation": k[4],
                     "fingerprint_id": k[5], "runs": [r["run"] for r in rs],
                     "label": where + (f" [{k[5]}]" if len(fids) > 1 else "")
                     + f"\n{len(rs)} run{'s' if len(rs) > 1 else ''}",
                     **{f"{p}_ms": mean(rs, f"{p}_ms") for p in (*PHASES, "step", "comm")}})
    fig, ax = plt.subplots(figsize=(min(15, max(6.5, 0.7 * len(bars) + 3.5)), 4.8),
                           layout="constrained")
    bottom = [0.0] * len(bars)
    for p in PHASES:
        h = [b[f"{p}_ms"] or 0.0 for b in bars]
        ax.bar(x, h, bottom=bottom, color=PHASE_COLORS[p], width=0.6,
               label=p if p != "sync" else "sync (comm)")
        bottom = [lo + v for lo, v in zip(bottom, h)]
    comm = [(xi, b["comm_ms"]) for xi, b in zip(x, bars) if b["comm_ms"]]
    if comm:
        ax.scatter([c[0] for c in comm], [c[1] for c in comm], marker="D", color="black",
                   zorder=3, label="measured comm / step")
    ax.set_xticks(x, labels=[b["label"] for b in bars], fontsize=8)
    # the group's name under its bars: a second row of tick labels (matplotlib's own
    # secondary axis; the blank lines put it below the first row)
    groups = list(dict.fromkeys(k[:3] for k in keys))
    centres = [sum(xi for xi, k in zip(x, keys) if k[:3] == g) / sum(k[:3] == g for k in keys)
               for g in groups]
    names = [g[2] + (f"\n{titles[g[:2]]}" if several else "") for g in groups]
    sec = ax.secondary_xaxis("bottom")
    sec.set_xticks(centres, labels=["\n\n\n" + n for n in names], fontsize=9)
    sec.tick_params("x", length=0)
    ax.set_ylabel("time per step (ms, mean)")
    ax.grid(True, axis="y", alpha=0.3)
    # the axes' own title (a suptitle would reach over the legend on a narrow figure)
    ax.set_title("Phase times per step, repeats averaged" + (f"\n{common}" if common else ""),
                 fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda i: (labels[i] != "measured comm / step", -i))
    fig.legend([handles[i] for i in order], [labels[i] for i in order],  # as the bars stack
               loc="outside right upper", fontsize=8)
    return fig, {"title": "phase times per step",
                 "series": list(PHASES) + (["comm"] if comm else []),
                 "bars": [b["label"] for b in bars], "data": bars}


def bench_figure(fits: list[dict]):
    """all_reduce across bench runs: busbw vs size (left) and time vs bytes with the
    fitted alpha-beta line (right), one colour per bench run. Each run shows the series
    its fit used (torch over all ranks where measured); its own plots/ has the rest."""
    plt = _plt()
    fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(13, 5.4), layout="constrained")
    cmap = plt.get_cmap("tab10")
    series = []
    for i, f in enumerate(fits):
        fit = f["primary"]
        if fit is None:
            continue
        run = f["run"]
        alloc = run.bench.get("meta", {}).get("allocation", run.path.name)
        pts = sorted((r for r in run.bench.get("rows", []) if r.get("op") == "all_reduce"
                      and r.get("correct") and r["impl"] == fit.impl and r["group"] == fit.group),
                     key=lambda r: r["bytes"])
        label = f"{alloc} · {fit.impl} · {fit.group} (n={fit.n})"
        color = cmap(i % 10)
        x = [r["elements"] for r in pts]
        ax_bw.plot(x, [r["busbw_GBps"] for r in pts], marker="o", ms=3, color=color, label=label)
        b = [r["bytes"] for r in pts]
        ax_t.plot(b, [r["time_median_s"] * 1e3 for r in pts], marker="o", ms=3, color=color)
        pred = [call_time("all_reduce", fit.impl, v, fit.n, fit) * 1e3 for v in b]
        ax_t.plot(b, pred, color=color, lw=4, alpha=0.3)
        series.append({"label": label, "x_elements": x, "busbw_GBps": [r["busbw_GBps"] for r in pts],
                       "bytes": b, "time_ms": [r["time_median_s"] * 1e3 for r in pts],
                       "fit_time_ms": pred, "alpha_us": fit.alpha_s * 1e6,
                       "bandwidth_GBps": fit.bandwidth_GBps})
    ax_bw.set_xscale("log", base=2)
    ax_bw.set_xlabel("size (elements, log scale)")
    ax_bw.set_ylabel("busbw (GB/s = 1e9 bytes/s)")
    ax_bw.set_ylim(bottom=0)
    ax_bw.set_title("all_reduce bus bandwidth", fontsize=10)
    ax_t.set_xscale("log", base=2)
    ax_t.set_yscale("log")
    ax_t.set_xlabel("bytes per rank (log scale)")
    ax_t.set_ylabel("time per call (ms, median)")
    ax_t.set_title("time per call; thick: the alpha-beta fit", fontsize=10)
    for ax in (ax_bw, ax_t):
        ax.grid(True, alpha=0.3)
    if series:
        fig.legend(*ax_bw.get_legend_handles_labels(), loc="outside lower center", ncol=2,
                   fontsize=8, frameon=False)
    fig.suptitle("all_reduce across bench runs (allocations)", fontsize=11)
    return fig, {"title": "all_reduce across bench runs",
                 "series": [s["label"] for s in series], "data": series}
