"""The network benchmark's claims (`python -m ddp_lab.bench.suite
network`): each claim's prediction from the link rate, its target, the
tables and the plots, from the rows the job's rank 0 measured. Pure
arithmetic and matplotlib: no lab, no cluster, no process group
(tests/test_net_claims.py checks them from saved rows).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import statistics
from pathlib import Path
from typing import Any, Optional

SWEEP = ["ring", "hierarchical", "ddp", "allreduce"]
STRAGGLER = ["ddp", "hierarchical"]
COMPRESSED = ["ddp fp16", "ddp bf16", "ddp powersgd"]
TOLERANCE = 0.20  # a prediction is met within 20%
RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)$")
# tc's: bytes/s
RATE_UNITS = {"bit": 0.125, "kbit": 125, "mbit": 125e3, "gbit": 125e6,
              "bps": 1, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9}


def rate_bytes(text: str) -> float:
    """A tc rate (200mbit, 1gbit, 25mbps = 25 MB/s) in bytes/s;
    ValueError if it is none."""
    m = RATE_RE.match(text)
    if not m or float(m[1]) <= 0:
        raise ValueError(f"'{text}' is not a tc rate such as 200mbit, 1gbit or 25mbps")
    return float(m[1]) * RATE_UNITS[m[2]]


# ------------------------------------------------------------------- the predictions
@dataclasses.dataclass
class Claim:
    name: str
    # a number in `unit`, or words (the rank named)
    measured: float | str
    predicted: float | str
    unit: str
    target: str
    ok: bool


def within(measured: float, predicted: float, tol: float = TOLERANCE) -> bool:
    return predicted != 0 and abs(measured / predicted - 1) <= tol


def hierarchy_saving_s(payload_bytes: float, rate: float) -> float:
    """Seconds per step a 2x2 hierarchy saves over the flat ring on a
    link of `rate` bytes/s (the cost model's bandwidth term, alpha 0:
    the link sets the pace): the flat ring of 4 sends 2(n-1)/n = 1.5
    buffers over each link that crosses nodes, the leaders' ring of 2
    one buffer; the in-node phases run on the nodes' loopback and are
    not counted."""
    from ddp_lab.report.alpha_beta import Fit, call_time

    fit = Fit(alpha_s=0.0, beta_s_per_byte=1 / rate, points=0, impl="link", algorithm="ring",
              group="", n=0, rel_rms=0.0)
    return (call_time("all_reduce", "ring", payload_bytes, 4, fit)
            - call_time("all_reduce", "ring", payload_bytes, 2, fit))


def link_bytes(m: dict) -> float:
    """Bytes per step over the busiest link between the nodes: the
    hierarchy's leader sends all it sends (`cross_bytes`) to the other
    node; in a flat ring of 4 (ours, or the library's, modelled as one)
    each link between nodes carries what one rank sends."""
    return m["cross_bytes"] if m.get("cross_bytes") is not None else m["sent_bytes"]


def hierarchy_claim(med: dict[str, dict], rate: float, where: str = "") -> list[Claim]:
    """The hierarchy's saving over the flat ring at `rate`, if both were
    run."""
    ring, hier = med.get("ring"), med.get("hierarchical")
    if not (ring and hier):
        return []
    pred = 1e3 * hierarchy_saving_s(hier["payload_bytes"], rate)
    got = ring["step_ms"] - hier["step_ms"]
    return [Claim(f"hierarchical saves over ring (time/step){where}", got, pred, "ms",
                  f"within {TOLERANCE:.0%}", within(got, pred))]


def claims(med: dict[str, dict], rate: float, named: dict[str, Optional[dict]],
           slow: Optional[dict[str, dict]] = None, slow_rate: float = 0.0) -> list[Claim]:
    """The claims from the medians at the claims' link (`med`: label ->
    figures per step), the straggler phase's findings (`named`: label ->
    the rank named, or None) and medians (`slow`, node2's link at
    `slow_rate` bytes/s)."""
    out = hierarchy_claim(med, rate)
    base = med.get("ddp")
    for label in (c for c in COMPRESSED if c in med and base):
        pred = med[label]["sent_bytes"] / base["sent_bytes"]
        got = med[label]["inflight_ms"] / base["inflight_ms"]
        out.append(Claim(f"{label} / none: comm time/step (pred.: bytes)", got, pred, "x",
                         f"within {TOLERANCE:.0%}", within(got, pred)))
    ov, blocking = med.get("allreduce+overlap"), med.get("allreduce")
    if ov and blocking:
        out.append(Claim("allreduce+overlap: exposed / in-flight comm",
                         ov["exposed_ms"] / ov["inflight_ms"], 1.0, "x", "below 1",
                         ov["exposed_ms"] < ov["inflight_ms"]))
        pred = blocking["step_ms"] - (ov["inflight_ms"] - ov["exposed_ms"])
        out.append(Claim("allreduce+overlap: time/step (pred.: blocking - hidden comm)",
                         ov["step_ms"], pred, "ms", "below blocking's "
                         f"{blocking['step_ms']:.0f}", ov["step_ms"] < blocking["step_ms"]))
    for label, who in named.items():
        out.append(Claim(f"slow node2 link, {label}: the straggler named",
                         "none" if who is None else f"rank {who['rank']}", "rank 2 or 3", "",
                         "node2's ranks", who is not None and who["rank"] in (2, 3)))
    for label in (lb for lb in (slow or {}) if lb in med):
        pred = 1e3 * link_bytes(med[label]) * (1 / slow_rate - 1 / rate)
        got = slow[label]["inflight_ms"] - med[label]["inflight_ms"]
        out.append(Claim(f"slow node2 link, {label}: comm/step grows by (pred.: link bytes "
                         "at the slower rate)", got, pred, "ms", f"within {TOLERANCE:.0%}",
                         within(got, pred)))
    return out


def claims_table(rows: list[Claim]) -> str:
    """The claims as a Markdown table."""
    def fmt(v: float | str, unit: str) -> str:
        if isinstance(v, str):
            return v
        return f"{v:.3f}" if unit == "x" else f"{v:.1f} {unit}"

    lines = ["| claim | measured | predicted | target | met |", "| --- | ---: | ---: | --- | --- |"]
    lines += [f"| {c.name} | {fmt(c.measured, c.unit)} | {fmt(c.predicted, c.unit)} "
              f"| {c.target} | {'yes' if c.ok else 'NO'} |" for c in rows]
    return "\n".join(lines)


def phase_table(med: dict[str, dict], spread: dict[str, tuple[float, float]]) -> str:
    """One phase's medians per configuration, Markdown."""
    lines = ["| configuration | time/step ms (min-max) | compute ms | in-flight comm ms "
             "| exposed comm ms | MB sent/step | MB to node2/step |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for label, m in med.items():
        cross = m.get("cross_bytes")
        lo, hi = spread[label]
        lines.append(f"| {label} | {m['step_ms']:.0f} ({lo:.0f}-{hi:.0f}) | {m['compute_ms']:.0f} "
                     f"| {m['inflight_ms']:.0f} | {m['exposed_ms']:.0f} "
                     f"| {m['sent_bytes'] / 1e6:.2f} "
                     f"| {'-' if cross is None else f'{cross / 1e6:.2f}'} |")
    return "\n".join(lines)


def summarise(rows: list[dict], phase: str, link: str) -> tuple[dict, dict]:
    """Medians per label of one phase's rounds, key by key (None where
    the sync does not record it: cross_bytes), and each label's (min,
    max) time/step."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        if r["phase"] == phase and r["link"] == link:
            by.setdefault(r["label"], []).append(r["figures"])

    def median(values: list) -> Optional[float]:
        return None if None in values else statistics.median(values)

    med = {label: {k: median([f[k] for f in runs]) for k in runs[0]} for label, runs in by.items()}
    spread = {k: (min(f["step_ms"] for f in v), max(f["step_ms"] for f in v))
              for k, v in by.items()}
    return med, spread


def straggler_named(rows: list[dict]) -> dict[str, Optional[dict]]:
    """label -> the rank the straggler report names over all the
    straggler phase's steps."""
    from ddp_lab.timing import StragglerTally

    out: dict[str, Optional[dict]] = {}
    tallies: dict[str, Any] = {}
    for r in (r for r in rows if r["phase"] == "straggler"):
        tally = StragglerTally.from_waits(r["waits"])
        if r["label"] in tallies:
            tallies[r["label"]].merge(tally)
        else:
            tallies[r["label"]] = tally
    for label, tally in tallies.items():
        out[label] = tally.named()
        ev = tally.evidence()
        print(f"straggler phase, {label}: {ev['steps_compared']} steps, last at "
              f"{ev['last_share']} of them, late by {ev['late_ms']} ms (ranks 0..3)")
    return out


# ------------------------------------------------------------------- the plots
def _spans(values: list[list[float]], mids: list[float]) -> list[list[float]]:
    """Error bars from each point's rounds: [median - min, max -
    median], never below 0."""
    return [[max(0.0, m - min(v)) for v, m in zip(values, mids)],
            [max(0.0, max(v) - m) for v, m in zip(values, mids)]]


def _by(rows: list[dict], phase: str, key: str) -> dict[tuple[str, str], list[float]]:
    """(link, label) -> one figure of every round of a phase."""
    out: dict[tuple[str, str], list[float]] = {}
    for r in (r for r in rows if r["phase"] == phase):
        out.setdefault((r["link"], r["label"]), []).append(r["figures"][key])
    return out


def epoch_vs_link(args: argparse.Namespace, rows: list[dict]):
    """Time per epoch against the link's rate, one line per synchroniser
    (error bars: the rounds' min-max at the claims' link, where there
    are several)."""
    from ddp_lab.report.plots import _plt

    plt = _plt()
    steps = {**_by(rows, "sweep", "step_ms"), **_by(rows, "main", "step_ms")}
    fig, ax = plt.subplots(figsize=(7.5, 4), layout="constrained")
    info = {}
    for i, label in enumerate(SWEEP):
        pts = sorted((rate_bytes(link), v) for (link, lb), v in steps.items() if lb == label)
        x = [r / 1e6 for r, _ in pts]
        per_epoch = [[args.steps * ms / 1e3 for ms in v] for _, v in pts]
        y = [statistics.median(v) for v in per_epoch]
        ax.errorbar(x, y, yerr=_spans(per_epoch, y), marker="o", capsize=3, color=f"C{i}",
                    label=label)
        info[label] = {"MB/s": x, "epoch_s": y}
    ax.set_xscale("log")
    ticks = sorted({rate_bytes(link) for link, _ in steps})
    ax.set_xticks([t / 1e6 for t in ticks], [f"{t / 1e6:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_ylim(bottom=0)
    ax.set_xlabel("link rate, each way of each node's link (MB/s, log scale)")
    ax.set_ylabel(f"time per epoch of {args.steps} steps (s)")
    ax.set_title("2 nodes x 2 ranks: a slower link, a longer epoch", fontsize=10)
    fig.legend(loc="outside right upper", title="sync")
    return fig, info


def exposed_vs_inflight(args: argparse.Namespace, rows: list[dict]):
    """At the claims' link: in-flight and exposed comm per step, and
    compute, per config."""
    from ddp_lab.report.plots import _plt

    plt = _plt()
    labels = ["ring", "hierarchical", "allreduce", "allreduce+overlap", "ddp"]
    series = {"compute": "compute_ms", "in-flight comm": "inflight_ms",
              "exposed comm": "exposed_ms"}
    fig, ax = plt.subplots(figsize=(8.5, 4), layout="constrained")
    info = {}
    width = 0.27
    for j, (name, key) in enumerate(series.items()):
        got = _by(rows, "main", key)
        vals = [got[(args.link, lb)] for lb in labels]
        mids = [statistics.median(v) for v in vals]
        ax.bar([i + (j - 1) * width for i in range(len(labels))], mids, width,
               yerr=_spans(vals, mids), capsize=2, label=name, color=f"C{j + 4}")
        info[name] = dict(zip(labels, mids))
    ax.set_xticks(range(len(labels)), labels)
    ax.set_ylabel("ms per step (rank 0)")
    ax.set_title(f"link {args.link}: comm in flight, and the part of it exposed "
                 "(waited for after backward)", fontsize=10)
    fig.legend(loc="outside right upper")
    return fig, info


def compression(args: argparse.Namespace, rows: list[dict]):
    """At the claims' link: bytes sent and comm time per step for each
    sync.compress."""
    from ddp_lab.report.plots import _plt

    plt = _plt()
    labels = ["ddp", *COMPRESSED]
    names = ["none", "fp16", "bf16", f"powersgd\n(rank {args.powersgd_rank})"]
    sent, comm = _by(rows, "main", "sent_bytes"), _by(rows, "main", "inflight_ms")
    mb = [statistics.median(sent[(args.link, lb)]) / 1e6 for lb in labels]
    ms_v = [comm[(args.link, lb)] for lb in labels]
    ms = [statistics.median(v) for v in ms_v]
    # none's time, scaled by the bytes
    pred = [ms[0] * b / mb[0] for b in mb]
    fig, (ax_b, ax_t) = plt.subplots(1, 2, figsize=(9, 3.8), layout="constrained")
    ax_b.bar(names, mb, color="C0")
    ax_b.set_ylabel("MB sent per step (rank 0)")
    ax_t.bar(names, ms, yerr=_spans(ms_v, ms), capsize=3, color="C1", label="measured")
    ax_t.plot(names, pred, "_", color="tab:red", markersize=30, mew=3, ls="none",
              label="predicted: none's time x bytes ratio")
    ax_t.set_ylabel("comm in flight per step (ms)")
    for ax in (ax_b, ax_t):
        ax.set_xlabel("sync=ddp sync.compress=")
    fig.suptitle(f"link {args.link}: fewer bytes, less time", fontsize=10)
    fig.legend(loc="outside lower center", ncols=2)
    return fig, {"labels": labels, "MB_sent": mb, "comm_ms": ms, "predicted_ms": pred}


def draw(args: argparse.Namespace, rows: list[dict], folder: Path) -> None:
    from ddp_lab.report.plots import save

    folder.mkdir(parents=True, exist_ok=True)
    for name, make in (("epoch_vs_link", epoch_vs_link), ("exposed_inflight", exposed_vs_inflight),
                       ("compression", compression)):
        fig, info = make(args, rows)
        save(fig, info, folder / f"network_{name}.png")
        print(f"plot: {folder / f'network_{name}.png'}")
