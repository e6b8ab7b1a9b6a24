"""The witness table: ddp_lab's figures beside clocks that are not its
own.

Per profiled run (`timing.profile=true`), one row per figure: ddp_lab's
comm in flight per step against the profiler's trace, and for sync=ddp
against DDP's own timing; their ratio and whether it lies within
`EXPECTED` (the one place those bounds live; docs/timing.md,
"Independent witnesses"). On CUDA with HTA, exposed comm against HTA's
overlap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from .run import Run
from .tables import _mean  # of the values that are not None

#: ours / witness: the band each figure's ratio should lie in
#: (docs/timing.md explains each); None: the definitions differ too much
#: to expect agreement, shown for reading.
EXPECTED: dict[str, Optional[tuple[float, float]]] = {
    "comm in flight per step (profiler)": (0.8, 1.2),
    "backward comm per step (DDP)": (0.45, 1.1),
    "comm hidden behind backward per step (DDP overlap)": None,
    "compute per step (DDP forward + backward)": None,
    # not yet measured on a GPU: no band until docs/timing.md states a
    # measured one
    "exposed comm share of comm (HTA)": None,
}


def witness_rows(run: Run, short) -> list[dict[str, Any]]:
    """The rows of one run (none without witnesses); values in seconds,
    ranks averaged for the profiler's figures, rank 0's for DDP's (as
    summary.json keeps them)."""
    s = run.summary
    rows: list[dict[str, Any]] = []
    name = short(str(run.path))

    def row(figure: str, ours: Optional[float], theirs: Optional[float], witness: str,
            per_rank: Optional[dict[int, float]] = None, steps: Optional[int] = None) -> None:
        if ours is None or theirs is None:
            return
        ratio = ours / theirs if theirs else None
        band = EXPECTED[figure]
        inside = (lambda x: band[0] <= x <= band[1]) if band else None
        # every rank's ratio within the band, not only their mean: one
        # rank's clock can disagree where the mean of two does not
        ok = None if inside is None or ratio is None else \
            inside(ratio) and all(inside(x) for x in (per_rank or {}).values())
        rows.append({"run": name, "sync": s.get("sync"), "figure": figure, "ours": ours,
                     "witness": theirs, "source": witness, "ratio": ratio,
                     "rank_ratios": per_rank, "expected": band, "agrees": ok, "steps": steps})

    w = s.get("witnesses") or {}
    ranks = w.get("ranks") or []
    if ranks:
        source = next((r["profiler"].get("source") for r in ranks if r.get("profiler")), "")
        per_rank = {r["rank"]: r["ddp_lab"]["comm_per_step_s"] / r["profiler"]["comm_per_step_s"]
                    for r in ranks if r["ddp_lab"].get("comm_per_step_s") is not None
                    and r["profiler"].get("comm_per_step_s")}
        row("comm in flight per step (profiler)",
            _mean([r["ddp_lab"].get("comm_per_step_s") for r in ranks]),
            _mean([r["profiler"].get("comm_per_step_s") for r in ranks]),
            f"torch.profiler: {source}", per_rank, (w.get("window") or {}).get("steps"))
    d = s.get("ddp_timing") or {}
    ours = d.get("ddp_lab") or {}
    if d.get("every_iteration") and ours:
        row("backward comm per step (DDP)", ours.get("comm_per_step_s"),
            d.get("backward_comm_time_s"), "DDP logging data")
        row("comm hidden behind backward per step (DDP overlap)", ours.get("hidden_per_step_s"),
            d.get("backward_compute_comm_overlap_time_s"), "DDP logging data")
        fwd, bwd = d.get("forward_compute_time_s"), d.get("backward_compute_time_s")
        row("compute per step (DDP forward + backward)", ours.get("compute_per_step_s"),
            fwd + bwd if fwd is not None and bwd is not None else None, "DDP logging data")
    if w.get("device") == "cuda":
        hta = hta_overlap(run.path / "profile")
        exposed = _mean([r["ddp_lab"].get("exposed_per_step_s") for r in ranks])
        inflight = _mean([r["ddp_lab"].get("comm_per_step_s") for r in ranks])
        if hta is not None and exposed is not None and inflight:
            row("exposed comm share of comm (HTA)", exposed / inflight, 1.0 - hta,
                "HTA comm/compute overlap")
    return rows


def hta_overlap(trace_dir: Path) -> Optional[float]:
    """HTA's comm/compute overlap of the traces in `trace_dir` (the
    share of the NCCL kernels' time that overlaps compute kernels),
    ranks averaged; None without HTA (a test extra: `pip install
    holistictraceanalysis`) or without GPU kernels (NaN on CPU)."""
    try:
        from hta.trace_analysis import TraceAnalysis
    except ImportError:
        return None
    try:
        df = TraceAnalysis(trace_dir=str(trace_dir)).get_comm_comp_overlap(visualize=False)
        value = float(df["comp_comm_overlap_ratio"].mean())
    except Exception:  # noqa: BLE001  (HTA's own errors on traces it cannot analyse)
        return None
    # NaN: no kernels to overlap
    return value if value == value else None


def disagreement(r: dict) -> str:
    """One figure outside its band, on one line: the run, the figure,
    the ratio (every rank's where there are several) and the band."""
    ranks = r.get("rank_ratios") or {}
    each = f" (rank {', rank '.join(f'{k} {v:.2f}' for k, v in sorted(ranks.items()))})" \
        if len(ranks) > 1 else ""
    lo, hi = r["expected"]
    return (f"{r['run']}: {r['figure']} ddp_lab / witness {r['ratio']:.2f}{each}, "
            f"outside {lo:.2f}-{hi:.2f}")


def witness_markdown(runs: list[Run], short) -> list[str]:
    """The report's section: one table, then one line per figure outside
    its band (the terminal prints the same lines: summary.py)."""
    rows = [r for run in runs if run.kind == "train" and run.ok for r in witness_rows(run, short)]
    if not rows:
        return []

    def fmt(v: float, figure: str) -> str:
        return f"{v:.3f}" if "share" in figure else f"{v * 1e3:.3f} ms"

    def ratio(r: dict) -> str:
        if r["ratio"] is None:
            return "-"
        ranks = r.get("rank_ratios") or {}
        each = "; ".join(f"rank {k} {v:.2f}" for k, v in sorted(ranks.items()))
        return f"{r['ratio']:.2f}" + (f" ({each})" if len(ranks) > 1 else "")

    lines = ["## Independent witnesses", "",
             "ddp_lab's figures beside the PyTorch profiler's trace and DDP's own logging "
             "data (runs with `timing.profile=true`; what each means and the band each ratio "
             "should lie in: docs/timing.md, *Independent witnesses*). The profiler's figure "
             "is the ranks' mean, each rank's ratio beside it: all of them must lie in the "
             "band.", "",
             "| run | sync | figure | ddp_lab | witness | witness from | ratio | expected |",
             "| --- | --- | --- | ---: | ---: | --- | ---: | --- |"]
    for r in rows:
        band = r["expected"]
        lines.append(f"| `{r['run']}` | {r['sync']} | {r['figure']} | {fmt(r['ours'], r['figure'])} "
                     f"| {fmt(r['witness'], r['figure'])} | {r['source']} | {ratio(r)} | "
                     + (f"{band[0]:.2f}-{band[1]:.2f}" if band else "(definitions differ)") + " |")
    lines.append("")
    for r in rows:
        if r["agrees"] is False:
            lines.append(f"- outside the expected band: {disagreement(r)}")
    if lines[-1] != "":
        lines.append("")
    return lines
