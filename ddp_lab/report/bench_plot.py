"""The report's bench figure: all_reduce of every bench run, every
implementation it measured, on one x axis (bytes per rank) for both
panels."""

from __future__ import annotations

from .style import GROUP_STYLES, impl_color
from .alpha_beta import call_time
from .plots import MARKERS, _distinct, _plt

# one per bench run where the group kinds do not vary
LINESTYLES = ("-", "--", ":", "-.")


def bench_names(fits: list[dict]) -> tuple[list[str], str]:
    """A short name per bench run, and what they all share (for the
    title): the allocation ("2 ranks = 1 node x 2 ranks, gloo on CPU")
    where the runs differ by it, else what differs in their folders'
    names ("bench 17-31-31" of 2026-11-26_17-31-31_bench_local): two
    runs on one allocation never read alike."""
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
    """A bench run's correct all_reduce points by (implementation, group
    kind), sizes ascending."""
    out: dict[tuple[str, str], list[dict]] = {}
    for r in run.bench.get("rows", []):
        if r.get("op") == "all_reduce" and r.get("correct"):
            out.setdefault((r["impl"], r["group"]), []).append(r)
    return {k: sorted(v, key=lambda r: r["bytes"]) for k, v in out.items()}


def bench_figure(fits: list[dict]):
    """all_reduce across bench runs: busbw (left) and time per call with
    each series' fitted alpha-beta line (right), both against bytes per
    rank. Colour = implementation (as in the bench's own plots), marker
    (and line style) = bench run; one legend entry per line drawn."""
    plt = _plt()
    fits = [f for f in fits if _series(f["run"])]
    names, common = bench_names(fits)
    groups = {k[1] for f in fits for k in _series(f["run"])}
    fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(13, 5.6), sharex=True, layout="constrained")
    series = []
    for i, (f, name) in enumerate(zip(fits, names)):
        by_key = {(x.impl, x.group): x for x in f["fits"]}
        for (impl, group), pts in _series(f["run"]).items():
            # the group kind sets the line style where several kinds
            # were measured (as in the bench's own plots), else the
            # bench run does, with its marker
            ls = GROUP_STYLES.get(group, ("-", "o"))[0] if len(groups) > 1 else LINESTYLES[i % 4]
            style = {"color": impl_color(impl), "marker": MARKERS[i % len(MARKERS)],
                     "linestyle": ls, "ms": 4}
            label = " · ".join(p for p in (name if len(fits) > 1 else "", impl,
                                           group if len(groups) > 1 else "") if p) \
                + f" (n={pts[0]['group_size']})"
            b = [r["bytes"] for r in pts]
            ax_bw.plot(b, [r["busbw_GBps"] for r in pts], label=label, **style)
            ax_t.plot(b, [r["time_median_s"] * 1e3 for r in pts], **style)
            fit = by_key.get((impl, group))
            pred = [call_time("all_reduce", impl, v, fit.n, fit) * 1e3 for v in b] if fit else None
            # thick and pale, under its points: the line the fit draws
            # through them
            if pred:
                ax_t.plot(b, pred, color=style["color"], lw=5, alpha=0.25, zorder=1)
            series.append({"label": label, "run": str(f["run"].path), "impl": impl, "group": group,
                           "color": style["color"],
                           "bytes": b, "busbw_GBps": [r["busbw_GBps"] for r in pts],
                           "time_ms": [r["time_median_s"] * 1e3 for r in pts], "fit_time_ms": pred,
                           "alpha_us": fit.alpha_s * 1e6 if fit else None,
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
