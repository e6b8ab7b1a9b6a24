"""Report figures (matplotlib, Agg), each with a sidecar JSON of the series drawn."""

from __future__ import annotations

import json
from pathlib import Path

from .model import call_time
from .runs import PHASES

PHASE_COLORS = {"data": "tab:gray", "forward": "tab:blue", "backward": "tab:orange",
                "sync": "tab:red", "optim": "tab:green"}


def _plt():
    # lazy: matplotlib takes 0.4 s to load and a report without plots (or its --help) needs
    # none; the Agg backend (no display) must be chosen before pyplot loads
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path, info: dict) -> dict:
    fig.savefig(path, dpi=110)
    _plt().close(fig)
    info = {"file": path.name, **info}
    path.with_suffix(".json").write_text(json.dumps(info, indent=2, default=str) + "\n")
    return info


def _err(mean, ci):
    """Error bar lengths (below, above) of a 95% interval; 0 where there is none."""
    return (mean - ci[0], ci[1] - mean) if ci and mean is not None else (0.0, 0.0)


def epoch_time_vs_world(groups: list[dict], path: Path) -> dict:
    """Mean post-warm-up epoch time (left) and parallel efficiency (right) vs world size,
    error bars = 95% CI of the repeats; one line per sync and allocation kind (fingerprint,
    where a series has several); dotted: ideal scaling from the baseline."""
    plt = _plt()
    fig, (ax_t, ax_e) = plt.subplots(1, 2, figsize=(12, 4.8))
    series = []
    several = len({(g["device"], g["workload"]) for g in groups}) > 1
    worlds = sorted({r["world_size"] for g in groups for r in g["rows"]})
    for g in groups:
        kinds = list(dict.fromkeys(r["fingerprint_id"] for r in g["rows"]))
        for fid in kinds:
            rows = sorted((r for r in g["rows"] if r["fingerprint_id"] == fid),
                          key=lambda r: r["world_size"])
            label = g["sync"] + (f" ({g['device']}, {g['workload']})" if several else "") \
                + (f" [{fid}]" if len(kinds) > 1 else "")
            x = [r["world_size"] for r in rows]
            y = [r["epoch_time_s_mean"] for r in rows]
            yerr = list(zip(*[_err(r["epoch_time_s_mean"], r["epoch_time_s_ci95"]) for r in rows]))
            cont = ax_t.errorbar(x, y, yerr=yerr, marker="o", capsize=3, label=label)
            color = cont[0].get_color()
            n0, t0 = g["baseline_world_size"], g["rows"][0]["epoch_time_s_mean"]
            # ideal: the baseline's time per unit of work (flat where the work grows with n)
            ideal = [t0 * r["efficiency"] / r["speedup"] if r["speedup"] else t0 * n0 / r["world_size"]
                     for r in rows]
            ax_t.plot(x, ideal, ":", color=color, alpha=0.7)
            eff = [(r["world_size"], r["efficiency"], r["efficiency_ci95"]) for r in rows
                   if r["efficiency"] is not None]
            if eff:
                eerr = list(zip(*[_err(e, ci) for _, e, ci in eff]))
                ax_e.errorbar([w for w, _, _ in eff], [e for _, e, _ in eff], yerr=eerr,
                              marker="o", capsize=3, color=color, label=label)
            series.append({"label": label, "world_size": x, "epoch_time_s": y,
                           "epoch_time_s_ci95": [r["epoch_time_s_ci95"] for r in rows],
                           "efficiency": [r["efficiency"] for r in rows],
                           "efficiency_ci95": [r["efficiency_ci95"] for r in rows],
                           "speedup": [r["speedup"] for r in rows], "baseline_world_size": n0})
    if worlds:
        ax_e.axhline(1.0, ls=":", color="black", alpha=0.6, label="ideal")
    for ax in (ax_t, ax_e):
        ax.set_xscale("log", base=2)
        ax.set_xticks(worlds or [1])
        ax.set_xticklabels([str(w) for w in worlds] or ["1"])
        ax.set_xlabel("world size (ranks)")
        ax.grid(True, alpha=0.3)
    ax_t.set_ylabel("mean epoch time after warm-up (s)")
    ax_t.set_title("time per epoch, 95% CI (dotted: ideal scaling)", fontsize=10)
    ax_e.set_ylabel("parallel efficiency vs the smallest world")
    ax_e.set_title("efficiency, 95% CI (1 = ideal)", fontsize=10)
    if series:
        ax_t.legend(fontsize=8)
        ax_e.legend(fontsize=8)
    fig.suptitle("Time per epoch and efficiency across allocations, per sync", fontsize=11)
    fig.tight_layout()
    return _save(fig, path, {"title": "epoch time and efficiency vs world size",
                             "series": [s["label"] for s in series], "data": series})


def phase_bars(rows: list[dict], path: Path) -> dict:
    """Stacked mean ms per step of every phase, one bar per run, grouped by sync; a black
    diamond marks the measured comm time per step (inside backward for ddp)."""
    plt = _plt()
    rows = [r for r in rows if r.get("step_ms") is not None]
    fig, ax = plt.subplots(figsize=(min(15, max(6, 0.6 * len(rows) + 3)), 4.8))
    labels = [f"{r['sync']}\nn={r['world_size']}" for r in rows]
    x, pos = [], -1.0
    for i, r in enumerate(rows):  # a gap between syncs: bars group by sync
        pos += 1.0 + (0.6 if i and r["sync"] != rows[i - 1]["sync"] else 0.0)
        x.append(pos)
    bottom = [0.0] * len(rows)
    for p in PHASES:
        h = [r.get(f"{p}_ms") or 0.0 for r in rows]
        ax.bar(x, h, bottom=bottom, color=PHASE_COLORS[p], label=p if p != "sync" else "sync (comm)",
               width=0.6)
        bottom = [b + v for b, v in zip(bottom, h)]
    comm = [(x[i], r["comm_ms"]) for i, r in enumerate(rows) if r.get("comm_ms")]
    if comm:
        ax.scatter([i for i, _ in comm], [c for _, c in comm], marker="D", color="black", zorder=3,
                   label="measured comm / step")
    ax.set_xticks(x)
    ax.set_xticklabels([f"n={r['world_size']}" for r in rows], fontsize=8)
    for sync in dict.fromkeys(r["sync"] for r in rows):  # the sync's name under its bars
        xs = [x[i] for i, r in enumerate(rows) if r["sync"] == sync]
        ax.text(sum(xs) / len(xs), -0.11, sync, transform=ax.get_xaxis_transform(),
                ha="center", va="top", fontsize=9)
    ax.set_ylabel("time per step (ms, mean)")
    ax.set_title("Phase times per step, per sync and world size", fontsize=11)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    return _save(fig, path, {"title": "phase times per step",
                             "series": [p for p in PHASES] + (["comm"] if comm else []),
                             "bars": labels,
                             "data": [{k: r.get(k) for k in ("sync", "world_size", *(f"{p}_ms" for p in PHASES), "comm_ms")}
                                      for r in rows]})


def bench_compare(fits: list[dict], path: Path) -> dict:
    """all_reduce across bench runs: busbw vs size (left) and time vs bytes with the
    fitted alpha-beta line (right), one colour per bench run. Each run shows the series
    its fit used (torch over all ranks where measured); its own plots/ has the rest."""
    plt = _plt()
    fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(13, 5.4))
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
        fig.legend(*ax_bw.get_legend_handles_labels(), loc="lower center", ncol=2, fontsize=8,
                   frameon=False)
    fig.suptitle("all_reduce across bench runs (allocations)", fontsize=11)
    fig.tight_layout(rect=(0, 0.06 + 0.03 * ((len(series) + 1) // 2), 1, 1))
    return _save(fig, path, {"title": "all_reduce across bench runs",
                             "series": [s["label"] for s in series], "data": series})
