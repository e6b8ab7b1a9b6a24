"""Bench results on disk: bench.csv, bench.json, bench.md and plots/*.png (+ .json).

Every plot has a sidecar JSON with the exact series drawn (label, x, y), so tests and scripts can
read what a figure shows without parsing pixels. Wrong results are in the tables (marked) and never
in a plot.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from ..predict.costmodel import pow2_label
from .harness import iter_series
from ..report.plots import GROUP_COLORS, GROUP_STYLES, IMPL_MARKERS, _plt, name_color, save

CSV_COLUMNS = ("op", "impl", "group", "group_size", "groups", "elements", "dtype", "bytes",
               "iters", "time_median_s", "time_p25_s", "time_p75_s", "time_min_s",
               "time_max_s", "algbw_GBps", "busbw_factor", "busbw_GBps", "throughput_GiBps",
               "correct", "error")

# bench.plot_metric -> (row key, y-axis label, title): every axis says its unit
METRICS = {
    "busbw": ("busbw_GBps", "busbw (GB/s = 1e9 bytes/s)", "bus bandwidth"),
    "algbw": ("algbw_GBps", "algbw (GB/s = 1e9 bytes/s)", "algorithm bandwidth"),
    "throughput": ("throughput_GiBps", "throughput (GiB/s = 2^30 bytes/s; bytes / time)",
                   "throughput, as the assignment computes it"),
}

UNITS = ("Times are per call, in ms: the median over the timed iterations (spread: p25-p75 "
         "and min-max), each iteration the slowest rank of the slowest group. "
         "algbw = bytes / time; busbw = algbw x factor as nccl-tests defines it "
         "(all_reduce 2(n-1)/n; all_gather and reduce_scatter (n-1)/n, bytes = the full "
         "array; broadcast, reduce, reduce_broadcast, send/recv 1); ping_pong times are one "
         "way (half the round trip). GB/s = 1e9 bytes/s; throughput = bytes / time in "
         "GiB/s (2^30 bytes/s), the assignment's figure (= algbw x 0.931).")


def series_label(row: dict, ops: int) -> str:
    groups = f" x{row['groups']}" if row["groups"] > 1 else ""
    base = f"{row['impl']} · {row['group']} (n={row['group_size']}{groups})"
    return f"{row['op']} · {base}" if ops > 1 else base


def _ms(s: float) -> str:
    return f"{s * 1e3:.4g}"


def markdown(result: dict, meta: dict) -> str:
    rows = result["rows"]
    lines = [f"# Collective benchmark: {meta['allocation']}", ""]
    if meta.get("command"):
        lines += ["```", meta["command"], "```", ""]
    lines += [f"- hosts: {', '.join(meta['hosts'])}; torch {meta['torch']}; dtype {meta['dtype']}",
              f"- memory for buffers: {result['memory']}",
              f"- sweep: {len(result['sizes'])} sizes {pow2_label(result['sizes'][0])}.."
              f"{pow2_label(result['sizes'][-1])} elements, {meta['warmup']} warm-up + "
              f"{meta['min_iters']}..{meta['iters']} timed iterations per size; "
              f"took {result['duration_s']:.0f} s", ""]
    lines += [f"- note: {note}" for note in result["notes"]] + ([""] if result["notes"] else [])
    wrong = [r for r in rows if not r["correct"]]
    if wrong:
        lines += [f"**{len(wrong)} measurement(s) gave a WRONG RESULT** (not plotted):", ""]
        lines += [f"- {r['op']} {r['impl']} {r['group']} {r['elements']} elements: {r['error']}"
                  for r in wrong] + [""]
    lines += [UNITS, "", "## Peak bus bandwidth", "",
              "| op | impl | group | n | groups | peak busbw (GB/s) | at elements | "
              "smallest size: time (ms) |", "|---|---|---|---|---|---|---|---|"]
    for (op, impl, group), rs in iter_series(rows).items():
        good = [r for r in rs if r["correct"]]
        best = max(good, key=lambda r: r["busbw_GBps"], default=rs[0])
        peak = (f"{best['busbw_GBps']:.3f} | {pow2_label(best['elements'])} | "
                f"{_ms(good[0]['time_median_s'])}" if good else "wrong results only | |")
        lines.append(f"| {op} | {impl} | {group} | {best['group_size']} | {best['groups']} | "
                     f"{peak} |")
    for op in dict.fromkeys(r["op"] for r in rows):
        lines += ["", f"## {op}", "",
                  "| elements | bytes | impl | group | n | time (ms) | p25-p75 (ms) | "
                  "min-max (ms) | algbw (GB/s) | busbw (GB/s) | throughput (GiB/s) | check |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted((r for r in rows if r["op"] == op),
                        key=lambda r: (r["elements"], r["impl"], r["group"])):
            check = "ok" if r["correct"] else "**WRONG**"
            lines.append(
                f"| {pow2_label(r['elements'])} | {r['bytes']} | {r['impl']} | {r['group']} | "
                f"{r['group_size']} | {_ms(r['time_median_s'])} | {_ms(r['time_p25_s'])}-"
                f"{_ms(r['time_p75_s'])} | {_ms(r['time_min_s'])}-{_ms(r['time_max_s'])} | "
                f"{r['algbw_GBps']:.4g} | {r['busbw_GBps']:.4g} | {r['throughput_GiBps']:.4g} | "
                f"{check} |")
    return "\n".join(lines) + "\n"


def _style(row: dict, nops: int, ops_order: list[str], impls: list[str]) -> dict:
    """Line style and marker = group kind; colour = implementation (the group kind when the figure
    has one implementation, as the hand-in plot; op on the overview), so lines read apart without
    the legend's help."""
    ls, marker = GROUP_STYLES.get(row["group"], ("-", "o"))
    if nops > 1:
        import matplotlib  # lazy: see report.plots._plt

        color = matplotlib.colormaps["tab10"](ops_order.index(row["op"]) % 10)
        if row["impl"] != "torch":
            marker = IMPL_MARKERS.get(row["impl"], marker)
    elif len(impls) == 1:
        color = GROUP_COLORS.get(row["group"], "tab:gray")
    else:
        color = name_color(row["impl"])
    return {"color": color, "linestyle": ls, "marker": marker}


def op_figure(title: str, rows: list[dict], metric: str, nops: int):
    """Bandwidth (left) and time per call (right) against size in elements, one line per series,
    the legend under the panels (never over a line); the figure and the sidecar JSON's content."""
    plt = _plt()
    from matplotlib.ticker import LogLocator  # lazy: see report.plots._plt

    series = [[r for r in rs if r["correct"]] for rs in iter_series(rows).values()]
    # a wrong result is reported, not plotted
    series = [s for s in series if s]
    ops_order = list(dict.fromkeys(r["op"] for r in rows))
    impls = list(dict.fromkeys(s[0]["impl"] for s in series))
    fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(13, 5.2 + 0.2 * -(-len(series) // 3)),
                                      sharex=True, layout="constrained")
    drawn = []
    for good in series:
        label = series_label(good[0], nops)
        style = _style(good[0], nops, ops_order, impls)
        x = [r["elements"] for r in good]
        y = [r[METRICS[metric][0]] for r in good]
        t = [r["time_median_s"] * 1e3 for r in good]
        ax_bw.plot(x, y, ms=4, label=label, **style)
        ax_t.plot(x, t, ms=4, **style)
        # spread bands only where they stay readable
        if len(series) <= 4:
            ax_t.fill_between(x, [r["time_p25_s"] * 1e3 for r in good],
                              [r["time_p75_s"] * 1e3 for r in good], color=style["color"], alpha=0.15)
        drawn.append({"label": label, "op": good[0]["op"], "impl": good[0]["impl"],
                      "group": good[0]["group"], "x_elements": x, "y": y, "time_ms": t})
    dtype = rows[0]["dtype"] if rows else ""
    for ax in (ax_bw, ax_t):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_locator(LogLocator(base=2, numticks=12))
        ax.grid(True, which="major", alpha=0.3)
        ax.set_xlabel(f"size (elements of {dtype}, log scale)")
    ax_bw.set_ylabel(METRICS[metric][1])
    ax_bw.set_ylim(bottom=0)
    ax_bw.set_title(f"{METRICS[metric][2]} (higher is better)", fontsize=10)
    ax_t.set_yscale("log")
    ax_t.set_ylabel("time per call (ms, median)")
    ax_t.set_title("time per call (lower is better)" +
                   ("; band p25-p75" if 0 < len(series) <= 4 else ""), fontsize=10)
    if drawn:
        fig.legend(loc="outside lower center", ncol=min(3, len(drawn)), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=11)
    return fig, {"title": title, "metric": metric, "xlabel": "elements",
                 "ylabel": METRICS[metric][1], "series": [d["label"] for d in drawn], "data": drawn}


def write_outputs(run_dir: Path, result: dict, meta: dict, metric: str = "busbw",
                  title: str = "") -> dict[str, Any]:
    """Every file of a bench run folder; returns the plot descriptions."""
    rows = result["rows"]
    with open(run_dir / "bench.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
    plots_dir = run_dir / "plots"
    plots_dir.mkdir(exist_ok=True)
    plots = []
    ops = list(dict.fromkeys(r["op"] for r in rows))
    for op in ops:
        head = title if title and len(ops) == 1 else (f"{title}: {op}" if title else op)
        plots.append(save(*op_figure(f"{head} — {meta['allocation']}",
                                     [r for r in rows if r["op"] == op], metric, 1),
                          plots_dir / f"{op}.png"))
    if len(ops) > 1:
        plots.append(save(*op_figure(f"{title or 'all ops'} — {meta['allocation']}", rows, metric,
                                     len(ops)), plots_dir / "overview.png"))
    (run_dir / "bench.md").write_text(markdown(result, meta))
    doc = {"meta": meta, **result, "plots": [{k: p[k] for k in ("file", "title", "series")}
                                             for p in plots]}
    (run_dir / "bench.json").write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return {"plots": plots}
