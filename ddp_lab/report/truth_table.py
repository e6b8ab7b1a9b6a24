"""Are the numbers true? The witness table: ddp_lab's figures beside
clocks not its own (the profiler's trace, DDP's timing, HTA;
docs/timing.md, "Independent witnesses"). The truth table: a training
run's comm per step, from its trace (`python -m ddp_lab.bench.suite
truth`), against its allocation's bench run (check (a)) and the
alpha-beta model (check (b)), and why a row misses (docs/benchmarks.md,
"Are the numbers true?").
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any, Optional

from ..predict.costmodel import SYNC_COLLECTIVES, union_length
from .alpha_beta import fit_all, predict_comm_s
from .run import find_runs, Run, usable
from .tables import _f, _mean, _ms, md_row


#: ours / witness: the band each figure's ratio should lie in
#: (docs/timing.md); None: the definitions differ too much to expect it
EXPECTED: dict[str, Optional[tuple[float, float]]] = {
    "comm in flight per step (profiler)": (0.8, 1.2),
    "backward comm per step (DDP)": (0.45, 1.1),
    "comm hidden behind backward per step (DDP overlap)": None,
    "compute per step (DDP forward + backward)": None,
    # no band until docs/timing.md states one measured on a GPU
    "exposed comm share of comm (HTA)": None,
}


def witness_rows(run: Run, short) -> list[dict[str, Any]]:
    """One run's rows (none without witnesses), in seconds: the ranks'
    mean for the profiler's figures, rank 0's for DDP's."""
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
    """HTA's comm/compute overlap of the traces in `trace_dir`, ranks averaged; None without HTA (a
    test extra: `pip install holistictraceanalysis`) or without GPU kernels (NaN on CPU)."""
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


def _each_rank(r: dict, sep: str) -> str:
    """" (rank 0 0.95<sep>rank 1 1.58)": every rank's ratio, where there are several."""
    ranks = r.get("rank_ratios") or {}
    each = sep.join(f"rank {k} {v:.2f}" for k, v in sorted(ranks.items()))
    return f" ({each})" if len(ranks) > 1 else ""


def disagreement(r: dict) -> str:
    """One figure outside its band, on one line (every rank's ratio)."""
    lo, hi = r["expected"]
    return (f"{r['run']}: {r['figure']} ddp_lab / witness {r['ratio']:.2f}{_each_rank(r, ', ')}, "
            f"outside {lo:.2f}-{hi:.2f}")


def witness_markdown(runs: list[Run], short) -> list[str]:
    """A table, then a line per figure outside its band (as the terminal's, summary.py)."""
    rows = [r for run in usable(runs) for r in witness_rows(run, short)]
    if not rows:
        return []

    def fmt(v: float, figure: str) -> str:
        return f"{v:.3f}" if "share" in figure else f"{v * 1e3:.3f} ms"

    def ratio(r: dict) -> str:
        return "-" if r["ratio"] is None else f"{r['ratio']:.2f}" + _each_rank(r, "; ")

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
    bad = [f"- outside the expected band: {disagreement(r)}" for r in rows if r["agrees"] is False]
    return lines + [""] + (bad + [""] if bad else [])


#: the targets: (a) measured vs bench, (b) measured vs model
TARGET_BENCH = 0.20
TARGET_MODEL = 0.30


# ------------------------------------------------------------------ the trace
def step_calls(events: list[dict], rank: int = 0) -> dict[int, list[dict]]:
    """Step -> its comm trace slices on `rank` (name = op, dur in µs), by their start."""
    out: dict[int, list[dict]] = {}
    for e in events:
        if e.get("cat") == "comm" and e.get("pid") == rank:
            out.setdefault(e["args"]["step"], []).append(e)
    for calls in out.values():
        calls.sort(key=lambda e: e["ts"])
    return out


def read_trace(run_dir: Path) -> list[dict]:
    """Every rank's events (trace/all.json, else trace/rank0.json)."""
    for name in ("all.json", "rank0.json"):
        p = Path(run_dir) / "trace" / name
        if p.exists():
            return json.loads(p.read_text())["traceEvents"]
    return []


def per_step(events: list[dict]) -> dict[str, Any]:
    """Rank 0's comm per step (the union of its calls) and after the last
    arrival (each call's shortest duration over ranks: the i-th call of a
    step is one collective on every rank), in seconds."""
    ranks = sorted({e["pid"] for e in events if e.get("cat") == "comm"})
    by_rank = {r: step_calls(events, r) for r in ranks}
    mine = by_rank.get(0, {})
    measured, last, calls = [], [], None
    for step, cs in sorted(mine.items()):
        measured.append(union_length([(c["ts"] / 1e6, (c["ts"] + c["dur"]) / 1e6) for c in cs]))
        others = [by_rank[r].get(step, []) for r in ranks]
        if all(len(o) == len(cs) for o in others):
            # ending when call i ended on rank 0; unioned like the
            # measured figure (DDP's buckets overlap)
            last.append(union_length([((c["ts"] + c["dur"] - min(o[i]["dur"] for o in others)) / 1e6,
                                       (c["ts"] + c["dur"]) / 1e6) for i, c in enumerate(cs)]))
        calls = [(c["name"], int(c["args"]["payload_bytes"])) for c in cs]
    return {"measured_s": measured, "last_arrival_s": last, "calls": calls or [],
            "steps": len(measured)}


def call_durations(events: list[dict]) -> dict[tuple[str, int], list[float]]:
    """(op, payload bytes) -> every duration (s) of such a call on rank 0."""
    out: dict[tuple[str, int], list[float]] = {}
    for cs in step_calls(events).values():
        for c in cs:
            out.setdefault((c["name"], int(c["args"]["payload_bytes"])), []).append(c["dur"] / 1e6)
    return out


def wire_sizes(paths: list) -> dict[int, list[int]]:
    """World size -> the call sizes (float32 elements) the training runs under `paths` sent, for
    `bench.sizes`."""
    out: dict[int, set[int]] = {}
    for r in usable(find_runs(list(paths))):
        st = per_step(read_trace(r.path))
        out.setdefault(r.world_size or 1, set()).update(b // 4 for _, b in st["calls"])
    return {w: sorted(s) for w, s in out.items()}


# ------------------------------------------------------------------ the bench
def bench_time(rows: list[dict], op: str, impl: str, elements: int, n: int,
               key: str = "time_median_s") -> Optional[tuple[float, bool]]:
    """(seconds by `key`, exact) of `op`/`impl` on the global group of
    `n` ranks at `elements`: the measured row, else log-log between the
    nearest sizes (exact False); None outside the measured range."""
    pts = sorted((r["elements"], r[key]) for r in rows
                 if r.get("op") == op and r.get("impl") == impl and r.get("correct")
                 and r.get("group") == "global" and r.get("group_size") == n
                 and r.get(key, 0) > 0)
    for e, t in pts:
        if e == elements:
            return t, True
    below, above = [p for p in pts if p[0] < elements], [p for p in pts if p[0] > elements]
    if not below or not above:
        return None
    (e0, t0), (e1, t1) = below[-1], above[0]
    w = (math.log(elements) - math.log(e0)) / (math.log(e1) - math.log(e0))
    return math.exp(math.log(t0) + w * (math.log(t1) - math.log(t0))), False


def _bench_for(run: Run, benches: list[Run]) -> Optional[Run]:
    """The latest bench run of this run's world size, nodes, backend."""
    same = [b for b in benches if b.world_size == run.world_size
            and (b.get("nodes") or 1) == (run.get("nodes") or 1)
            and b.get("backend") == run.get("backend")]
    return sorted(same, key=lambda b: str(b.path))[-1] if same else None


def _median_ms(seconds: list[float]) -> Optional[float]:
    return statistics.median(seconds) * 1e3 if seconds else None


def _ratio(a: Optional[float], b: Optional[float]) -> Optional[float]:
    return a / b if a is not None and b else None


def _within(ratio: Optional[float], target: float) -> Optional[bool]:
    return None if ratio is None else abs(ratio - 1) <= target


def truth_row(run: Run, bench: Optional[Run]) -> dict[str, Any]:
    """One training run against its bench run: (a) and (b), and the per-call detail."""
    events = read_trace(run.path)
    st = per_step(events)
    sync, n = run.get("sync", "?"), run.world_size or 1
    row: dict[str, Any] = {
        "run": str(run.path), "sync": sync, "model": run.get("model", "?"), "world": n,
        "nodes": run.get("nodes") or 1, "link": run.fingerprint.get("link"),
        "steps": st["steps"], "calls": [list(c) for c in st["calls"]],
        "measured_ms": _median_ms(st["measured_s"]),
        "last_arrival_ms": _median_ms(st["last_arrival_s"]),
        "bench_run": str(bench.path) if bench else None,
        **dict.fromkeys(("bench_ms", "bench_exact", "bench_min_ms", "model_ms", "model_one_fit_ms")),
        "fits": {}, "per_call": []}
    if bench is None or not st["calls"]:
        return _ratios(row)
    rows = bench.bench.get("rows", [])
    phases = SYNC_COLLECTIVES.get(sync, ())
    durations = call_durations(events)
    total, exact, fastest = 0.0, True, 0.0
    for i, (op, payload) in enumerate(st["calls"]):
        algo = phases[i % len(phases)][1] if phases else "torch"
        bt = bench_time(rows, op, algo, payload // 4, n)
        low = bench_time(rows, op, algo, payload // 4, n, "time_min_s")
        if bt is None:
            total = None
        elif total is not None:
            total += bt[0]
            exact = exact and bt[1]
        fastest = fastest + low[0] if fastest is not None and low else None
        row["per_call"].append({
            "op": op, "algorithm": algo, "bytes": payload,
            "measured_ms": _median_ms(durations.get((op, payload), [])),
            "bench_ms": bt[0] * 1e3 if bt else None, "bench_exact": bt[1] if bt else None})
    row["bench_ms"], row["bench_min_ms"] = _ms(total), _ms(fastest)
    row["bench_exact"] = exact if total is not None else None
    fits = fit_all(rows)
    payload, k = sum(b for _, b in st["calls"]), len(st["calls"])
    row["model_ms"] = _ms(predict_comm_s(sync, n, payload, k, fits))
    # the model as it was: the library all_reduce's fit for every call of every sync
    one = fits.get(("all_reduce", "torch"))
    row["model_one_fit_ms"] = _ms(predict_comm_s(sync, n, payload, k, one) if one else None)
    row["fits"] = {f"{op}/{impl}": f.as_dict() for (op, impl), f in fits.items() if (op, impl) in phases}
    return _ratios(row)


def _ratios(row: dict) -> dict:
    m = row["measured_ms"]
    row["measured_over_bench"] = _ratio(m, row["bench_ms"])
    row["measured_over_model"] = _ratio(m, row["model_ms"])
    row["a_ok"] = _within(row["measured_over_bench"], TARGET_BENCH)
    row["b_ok"] = _within(row["measured_over_model"], TARGET_MODEL)
    row["last_arrival_over_model"] = _ratio(row["last_arrival_ms"], row["model_ms"])
    row["why"] = why(row)
    return row


# ------------------------------------------------------------------ why a row misses
def why(row: dict) -> Optional[str]:
    """The known reasons a row misses (a) or (b); None if it meets both, else "not known"."""
    if row["a_ok"] is not False and row["b_ok"] is not False:
        return None
    out = []
    after = _ratio(row["last_arrival_ms"], row["bench_ms"])
    if row["a_ok"] is False and _within(after, TARGET_BENCH):
        out.append(f"waiting for a later rank (after the last arrival: {after:.2f} of the bench)")
    bench_model = _ratio(row["bench_ms"], row["model_ms"])
    if row["b_ok"] is False and bench_model is not None and not _within(bench_model, TARGET_MODEL):
        out.append(f"the fit's line misses the bench here (bench / model {bench_model:.2f})")
    burst = (row.get("link") or {}).get("shaped_burst_B")
    smallest = min((b for _, b in row["calls"]), default=None)
    if row["nodes"] > 1 and burst and smallest and smallest <= BURST_REACH * burst:
        out.append(f"calls of {smallest / 1e3:.0f} kB against the link's tbf burst of "
                   f"{burst / 1e3:.0f} kB (its idle time before a call sets the call's time)")
    if row["sync"] == "ddp" and len(row["calls"]) > 1:
        out.append(f"DDP's {len(row['calls'])} buckets overlap backward and each other")
    fastest = _ratio(row["measured_ms"], row.get("bench_min_ms"))
    if row["a_ok"] is False and _within(fastest, TARGET_BENCH):
        out.append(f"the bench's spread (its fastest iterations: {row['bench_min_ms']:.0f} ms/step, "
                   f"measured / fastest {fastest:.2f})")
    roots = [c for c in row.get("per_call", []) if c["op"] == "broadcast"
             and (_ratio(c["measured_ms"], c["bench_ms"]) or 1) < 1 - TARGET_BENCH]
    if row["a_ok"] is False and roots:
        c = roots[0]
        out.append(f"rank 0 roots the broadcast: its sends end when handed to the kernel "
                   f"({c['measured_ms']:.0f} ms against the bench's {c['bench_ms']:.0f})")
    return "; ".join(out) or "not known"


#: a call of up to this many tbf bursts passes partly at memory speed after an idle link
BURST_REACH = 4


def truth_table(run_paths: list, bench_paths: list) -> list[dict]:
    """A truth row per training run under `run_paths`, against its bench run under `bench_paths`."""
    benches = usable(find_runs(list(bench_paths)), "bench")
    rows = [truth_row(r, _bench_for(r, benches)) for r in usable(find_runs(list(run_paths)))]
    order = {s: i for i, s in enumerate(SYNC_COLLECTIVES)}
    rows.sort(key=lambda x: (x["model"], x["world"], order.get(x["sync"], 99), x["run"]))
    return rows


# ------------------------------------------------------------------ printing
def _yes(x: Optional[bool]) -> str:
    return "–" if x is None else ("yes" if x else "NO")


def _world(row: dict) -> str:
    """"4", or "4 (2 nodes)" for a run across nodes."""
    nodes = row.get("nodes") or 1
    return f"{row['world']} ({nodes} nodes)" if nodes > 1 else str(row["world"])


def markdown(rows: list[dict]) -> list[str]:
    lines = [
        "| sync | model | world | calls/step | measured ms/step | after last arrival | "
        "bench ms/step | model ms/step | measured / bench | (a) ≤20% | measured / model | "
        "(b) ≤30% | one-fit model ms/step | measured / one-fit | why (a row that misses) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(md_row([
            r["sync"], r["model"], _world(r), len(r["calls"]), _f(r["measured_ms"]), _f(r["last_arrival_ms"]),
            _f(r["bench_ms"]) + ("" if r["bench_exact"] in (None, True) else "*"), _f(r["model_ms"]),
            _f(r["measured_over_bench"], ".2f"), _yes(r["a_ok"]), _f(r["measured_over_model"], ".2f"),
            _yes(r["b_ok"]), _f(r["model_one_fit_ms"]),
            _f(_ratio(r["measured_ms"], r["model_one_fit_ms"]), ".2f"), r.get("why") or ""]))
    lines += ["", "measured: median over steps of rank 0's comm per step (union of its calls, as "
              "the synchroniser's CommRecorder timed them); after last arrival: per call the "
              "shortest duration over ranks (the rest is waiting for a later rank); bench: the "
              "bench's median time of the same collective and algorithm at each call's size, "
              "summed (* = some size interpolated); model: alpha-beta fits of that bench run, "
              "one per collective and algorithm; one-fit model: the library all_reduce's fit "
              "for every call.", "",
              "Per call (median duration over the run's steps vs the bench at that size):", "",
              "| sync | model | world | op (algorithm) | MB | measured ms | bench ms | ratio |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        first: dict[tuple, dict] = {}
        for c in r["per_call"]:
            first.setdefault((c["op"], c["bytes"]), c)
        lines += [md_row([r["sync"], r["model"], r["world"], f"{c['op']} ({c['algorithm']})",
                          f"{c['bytes'] / 1e6:.3f}", _f(c["measured_ms"]), _f(c["bench_ms"]),
                          _f(_ratio(c["measured_ms"], c["bench_ms"]), ".2f")]) for c in first.values()]
    return lines
