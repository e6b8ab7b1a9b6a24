"""What a slow network does to DDP: the project's claims about
communication, measured on a shaped link, each printed beside its
prediction and its target.

    python -m ddp_lab.bench.suite network     # its own lab + SLURM cluster
    python -m ddp_lab.bench.suite network --lab netlab   # a lab and cluster already up

One SLURM job of 2 nodes x 2 ranks (`run.entry=ddp_lab.bench.specs.network`: this module is the
ranks' entry too) times every configuration per phase; rank 0 reshapes the links between phases
(netlab.sh shape). The phases, options and figures: docs/network_ddp.md, "How the script measures".
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Iterator, Optional

from .. import suite
from ..suite import Benchmark, REPO, Spec


# The claims, tables and plots from the rows the job's rank 0 measured: pure arithmetic and
# matplotlib, no lab, no cluster, no process group (tests/test_net_claims.py checks them).

SWEEP = ["ring", "hierarchical", "ddp", "allreduce"]
STRAGGLER = ["ddp", "hierarchical"]
COMPRESSED = ["ddp fp16", "ddp bf16", "ddp powersgd"]
TOLERANCE = 0.20  # a prediction is met within 20%
RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)$")
RATE_UNITS = {"bit": 0.125, "kbit": 125, "mbit": 125e3, "gbit": 125e6,  # tc's, in bytes/s
              "bps": 1, "kbps": 1e3, "mbps": 1e6, "gbps": 1e9}


def rate_bytes(text: str) -> float:
    """A tc rate (200mbit, 1gbit, 25mbps = 25 MB/s) in bytes/s; ValueError if it is none."""
    m = RATE_RE.match(text)
    if not m or float(m[1]) <= 0:
        raise ValueError(f"'{text}' is not a tc rate such as 200mbit, 1gbit or 25mbps")
    return float(m[1]) * RATE_UNITS[m[2]]


# ------------------------------------------------------------------- the predictions
@dataclasses.dataclass
class Claim:
    name: str
    measured: float | str  # a number in `unit`, or words (the rank named)
    predicted: float | str
    unit: str
    target: str
    ok: bool


def within(measured: float, predicted: float, tol: float = TOLERANCE) -> bool:
    return predicted != 0 and abs(measured / predicted - 1) <= tol


def hierarchy_saving_s(payload_bytes: float, rate: float) -> float:
    """Seconds per step a 2x2 hierarchy saves over the flat ring on a link of `rate` bytes/s (the
    cost model's bandwidth term, alpha 0: the link sets the pace): the flat ring of 4 sends
    2(n-1)/n = 1.5 buffers over each link that crosses nodes, the leaders' ring of 2 one buffer;
    the in-node phases run on the nodes' loopback and are not counted."""
    from ddp_lab.report.alpha_beta import Fit, call_time

    fit = Fit(alpha_s=0.0, beta_s_per_byte=1 / rate, points=0, impl="link", algorithm="ring",
              group="", n=0, rel_rms=0.0)
    return (call_time("all_reduce", "ring", payload_bytes, 4, fit)
            - call_time("all_reduce", "ring", payload_bytes, 2, fit))


def link_bytes(m: dict) -> float:
    """Bytes per step over the busiest link between the nodes: the hierarchy's leader sends all it
    sends (`cross_bytes`) to the other node; in a flat ring of 4 (ours, or the library's, modelled
    as one) each link between nodes carries what one rank sends."""
    return m["cross_bytes"] if m.get("cross_bytes") is not None else m["sent_bytes"]


def hierarchy_claim(med: dict[str, dict], rate: float, where: str = "") -> list[Claim]:
    """The hierarchy's saving over the flat ring at `rate`, if both were run."""
    ring, hier = med.get("ring"), med.get("hierarchical")
    if not (ring and hier):
        return []
    pred = 1e3 * hierarchy_saving_s(hier["payload_bytes"], rate)
    got = ring["step_ms"] - hier["step_ms"]
    return [Claim(f"hierarchical saves over ring (time/step){where}", got, pred, "ms",
                  f"within {TOLERANCE:.0%}", within(got, pred))]


def claims(med: dict[str, dict], rate: float, named: dict[str, Optional[dict]],
           slow: Optional[dict[str, dict]] = None, slow_rate: float = 0.0) -> list[Claim]:
    """The claims from the medians at the claims' link (`med`: label -> figures per step), the
    straggler phase's findings (`named`: label -> the rank named, or None) and medians (`slow`,
    node2's link at `slow_rate` bytes/s)."""
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
    def fmt(v: float | str, unit: str) -> str:
        if isinstance(v, str):
            return v
        return f"{v:.3f}" if unit == "x" else f"{v:.1f} {unit}"

    return suite.table(["claim", "measured", "predicted", "target", "met"],
                       [(c.name, fmt(c.measured, c.unit), fmt(c.predicted, c.unit), c.target,
                         "yes" if c.ok else "NO") for c in rows], "lrrll")


def phase_table(med: dict[str, dict], spread: dict[str, tuple[float, float]]) -> str:
    """One phase's medians per configuration, Markdown."""
    return suite.table(
        ["configuration", "time/step ms (min-max)", "compute ms", "in-flight comm ms",
         "exposed comm ms", "MB sent/step", "MB to node2/step"],
        [(label, f"{m['step_ms']:.0f} ({spread[label][0]:.0f}-{spread[label][1]:.0f})",
          *(f"{m[k]:.0f}" for k in ("compute_ms", "inflight_ms", "exposed_ms")),
          f"{m['sent_bytes'] / 1e6:.2f}",
          "-" if m.get("cross_bytes") is None else f"{m['cross_bytes'] / 1e6:.2f}")
         for label, m in med.items()])


def summarise(rows: list[dict], phase: str, link: str) -> tuple[dict, dict]:
    """Medians per label of one phase's rounds, key by key (None where the sync does not record it:
    cross_bytes), and each label's (min, max) time/step."""
    by: dict[str, list[dict]] = {}
    for r in rows:
        if r["phase"] == phase and r["link"] == link:
            by.setdefault(r["label"], []).append(r["figures"])
    med = suite.medians(by)
    spread = {k: (min(f["step_ms"] for f in v), max(f["step_ms"] for f in v))
              for k, v in by.items()}
    return med, spread


def straggler_named(rows: list[dict]) -> dict[str, Optional[dict]]:
    """label -> the rank the straggler report names over all the straggler phase's steps."""
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
    """Error bars from each point's rounds: [median - min, max - median], never below 0."""
    return [[max(0.0, m - min(v)) for v, m in zip(values, mids)],
            [max(0.0, max(v) - m) for v, m in zip(values, mids)]]


def _by(rows: list[dict], phase: str, key: str) -> dict[tuple[str, str], list[float]]:
    """(link, label) -> one figure of every round of a phase."""
    out: dict[tuple[str, str], list[float]] = {}
    for r in (r for r in rows if r["phase"] == phase):
        out.setdefault((r["link"], r["label"]), []).append(r["figures"][key])
    return out


def epoch_vs_link(plt, args: argparse.Namespace, rows: list[dict]):
    """Time per epoch against the link's rate, one line per synchroniser (error bars: the rounds'
    min-max at the claims' link, where there are several)."""
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


def exposed_vs_inflight(plt, args: argparse.Namespace, rows: list[dict]):
    """At the claims' link: in-flight and exposed comm per step, and compute, per config."""
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


def compression(plt, args: argparse.Namespace, rows: list[dict]):
    """At the claims' link: bytes sent and comm time per step for each sync.compress."""
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
    from ddp_lab.report.plots import _plt, save

    plt = _plt()
    folder.mkdir(parents=True, exist_ok=True)
    for name, make in (("epoch_vs_link", epoch_vs_link), ("exposed_inflight", exposed_vs_inflight),
                       ("compression", compression)):
        fig, info = make(plt, args, rows)
        save(fig, info, folder / f"network_{name}.png")
        print(f"plot: {folder / f'network_{name}.png'}")


SPEC = Spec(compares="every sync, overlap and compression on a shaped 2-node link, then the "
                     "link swept and one node slowed", rounds=3, steps=16,
            ratios="each claim: measured / predicted, against its target")
NETLAB_SH = REPO / "scripts" / "netlab.sh"
NETLAB_RECORDS = Path("/run/ddp_lab_netlab")  # netlab.sh's NAME.env of every lab up
PLAN_ENV = "NET_CLAIMS_PLAN"  # the job's ranks find their plan (a JSON file) here

#: label -> the trainer's overrides; the first four are also drawn against the link rate
CONFIGS: dict[str, list[str]] = {
    "ring": ["sync=ring"],
    "hierarchical": ["sync=hierarchical"],
    "ddp": ["sync=ddp"],
    "allreduce": ["sync=allreduce", "sync.overlap=false"],
    "allreduce+overlap": ["sync=allreduce", "sync.overlap=true"],
    "ddp fp16": ["sync=ddp", "sync.compress=fp16"],
    "ddp bf16": ["sync=ddp", "sync.compress=bf16"],
    "ddp powersgd": ["sync=ddp", "sync.compress=powersgd"],
}
# ------------------------------------------------------------------- the command line
def add_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--link", default="200mbit", help="the rate of the claims (default 200mbit)")
    ap.add_argument("--rates", default="1gbit,500mbit,100mbit",
                    help="more rates for the epoch-vs-link plot, comma-separated")
    ap.add_argument("--slow-link", default="100mbit", help="node2's rate in the straggler phase")
    ap.add_argument("--sweep-rounds", type=int, default=1, help="rounds at each of --rates")
    ap.add_argument("--hidden", default="1024,1024", help="the MLP's hidden layers")
    ap.add_argument("--batch", type=int, default=128, help="batch per rank (default 128)")
    ap.add_argument("--bucket-mb", type=float, default=2.0, help="bucket size, MB (default 2)")
    ap.add_argument("--powersgd-rank", type=int, default=32, help="sync.powersgd_rank")
    ap.add_argument("--lab", default="", help="a lab already up, its cluster's SLURM_CONF "
                    "exported (default: make both, remove both)")
    ap.add_argument("--plots", default="", help="draw network_*.png into this folder")
    ap.add_argument("--from", dest="from_json", default="",
                    help="no measuring: the tables, claims and plots of an --out file")


def check(args: argparse.Namespace) -> None:
    for opt in ("link", "slow_link", *(["rates"] if args.rates else [])):
        for r in getattr(args, opt).split(","):
            try:
                rate_bytes(r)
            except ValueError as e:
                raise suite.UsageError(f"--{opt.replace('_', '-')}: {e}")
    for opt in ("rounds", "steps", "batch", "powersgd_rank"):
        if getattr(args, opt) < 1:
            raise suite.UsageError(f"--{opt.replace('_', '-')} {getattr(args, opt)}: must be 1 or more")
    for bad, why in [
            (args.sweep_rounds < 0, f"--sweep-rounds {args.sweep_rounds}: must be 0 (no sweep) or more"),
            (args.bucket_mb <= 0, f"--bucket-mb {args.bucket_mb:g}: must be above 0"),
            (not re.fullmatch(r"\d+(,\d+)*", args.hidden),
             f"--hidden '{args.hidden}': use layer widths such as 1024,1024"),
            (args.lab and not (NETLAB_RECORDS / f"{args.lab}.env").is_file(),
             f"--lab {args.lab}: no such lab is up (scripts/netlab.sh status --name {args.lab})"),
            (args.lab and not os.environ.get("SLURM_CONF"),
             f"--lab {args.lab}: export SLURM_CONF of the cluster that runs on it first"),
            (args.from_json and not Path(args.from_json).is_file(),
             f"--from {args.from_json}: no such file (an --out of an earlier run)"),
            (not args.from_json and not (Path(args.data_root) / "MNIST").is_dir(),
             f"--data-root {args.data_root}: no MNIST folder there")]:
        if bad:
            raise suite.UsageError(why)


def overrides(args: argparse.Namespace) -> list[str]:
    """What every configuration trains with (the trainer's keys)."""
    return [f"data.root={Path(args.data_root).resolve()}", "model=mlp",
            f"model.hidden=[{args.hidden}]", f"train.batch_size={args.batch}", "optim=sgd",
            "train.lr=0.05"]


def config_overrides(args: argparse.Namespace) -> dict[str, list[str]]:
    """label -> its sync's overrides, the same bucket size for all (and PowerSGD's rank for ddp)."""
    return {label: [*suite.with_bucket(ov, args.bucket_mb), *([f"sync.powersgd_rank="
                    f"{args.powersgd_rank}"] if "sync=ddp" in ov else [])]
            for label, ov in CONFIGS.items()}


def phases(args: argparse.Namespace) -> list[dict]:
    """The job's phases: (name, link, node2's link or None, configurations, rounds)."""
    out = [{"phase": "main", "link": args.link, "node2": None, "labels": list(CONFIGS),
            "rounds": args.rounds}]
    if args.sweep_rounds:
        out += [{"phase": "sweep", "link": r, "node2": None, "labels": SWEEP,
                 "rounds": args.sweep_rounds} for r in args.rates.split(",") if r]
    out.append({"phase": "straggler", "link": args.link, "node2": args.slow_link,
                "labels": STRAGGLER, "rounds": args.rounds})
    return out


# ------------------------------------------------------------------- the ranks
def shape(plan: dict, link: str, node: Optional[int] = None) -> None:
    """netlab.sh shape, run in the submitting process's network namespace (where the lab's bridge
    ends are): every link at `link`, or node `node`'s alone."""
    cmd = ["nsenter", f"--net={plan['root_netns']}", "bash", str(NETLAB_SH), "shape",
           "--name", plan["lab"], "--link", link, *(["--node", str(node)] if node else [])]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)


def measure(ctx, plan: dict) -> list[dict]:
    """On every rank: every phase's configurations, one epoch each per round; rank 0 keeps the
    figures (its own: rank 0 leads node1) and every rank's comm waits per step."""
    from ddp_lab.bench.scaffold import Bench
    from ddp_lab.bench.suite import rounds

    bench = Bench(ctx, plan["overrides"])
    cfgs = {label: bench.compose(ov) for label, ov in plan["configs"].items()}
    steps = bench.steps(plan["steps"])
    boss = ctx.env.rank == 0

    def one_epoch(label: str, epoch: int, n: int) -> dict:
        ms, st, comm = bench.split_epoch(cfgs[label], epoch, n)
        waits = ctx.gather_objects(comm.per_step_seconds(st))
        cross = comm.bytes_cross_node
        return {"figures": {
            **ms, "sent_bytes": comm.bytes_sent / n, "payload_bytes": comm.payload_bytes / n,
            "cross_bytes": None if cross is None else cross / n}, "waits": waits}

    def reshape(link: str, node2: Optional[str]) -> None:
        if boss:
            shape(plan, link)
            if node2:
                shape(plan, node2, node=2)
        ctx.barrier()

    rows = []
    reshape(plan["phases"][0]["link"], None)
    # warm-up: connections, allocations, PowerSGD's first steps
    for label in cfgs:
        one_epoch(label, 0, min(3, steps))
    for ph in plan["phases"]:
        reshape(ph["link"], ph["node2"])
        for r, label in rounds(ph["labels"], ph["rounds"]):
            row = {"phase": ph["phase"], "link": ph["link"], "round": r, "label": label,
                   **one_epoch(label, r, steps)}
            rows.append(row)
            if boss:
                f = row["figures"]
                print(f"{ph['phase']} {ph['link']}{' node2 ' + ph['node2'] if ph['node2'] else ''}"
                      f" round {r} {label:18s} {f['step_ms']:7.0f} ms/step, in flight "
                      f"{f['inflight_ms']:6.0f}, exposed {f['exposed_ms']:6.0f}", flush=True)
    reshape(plan["phases"][0]["link"], None)
    if boss:
        Path(plan["out"]).write_text(json.dumps({"steps": steps, "rows": rows}) + "\n")
    return rows


def rank(run_dir: Path) -> int:
    from ddp_lab.config import load_run_config
    from ddp_lab.rank.main import run_rank

    cfg = load_run_config(run_dir)
    plan = json.loads(Path(os.environ[PLAN_ENV]).read_text())
    return run_rank(run_dir, cfg, lambda ctx: measure(ctx, plan), cfg.train.threads)


# ------------------------------------------------------------------- the submitting side
@contextlib.contextmanager
def lab_and_cluster(args: argparse.Namespace) -> Iterator[tuple[str, dict]]:
    """(lab name, environment with SLURM_CONF): the --lab given, or a lab and a cluster made here
    on a name and ports of their own, removed on the way out."""
    if args.lab:
        yield args.lab, dict(os.environ)
        return
    # the tests' helpers: up, down, free ports
    sys.path.insert(0, str(REPO / "tests"))
    from netlab_fixture import lab_down, lab_up, unique_name
    from slurm_fixture import start_cluster, stop_cluster

    lab = lab_up(unique_name(), nodes=2, link=args.link)
    try:
        with tempfile.TemporaryDirectory(prefix="net_claims_slurm_") as state:
            cluster = start_cluster(Path(state) / "cluster", netlab=lab)
            try:
                print(f"lab {lab.name}, SLURM cluster {cluster.conf}", flush=True)
                yield lab.name, cluster.env
            finally:
                stop_cluster(cluster)
    finally:
        lab_down(lab.name)


def submit(args: argparse.Namespace, lab: str, env: dict, work: Path) -> dict:
    """The one SLURM job; what its rank 0 wrote."""
    plan = {"lab": lab, "root_netns": f"/proc/{os.getpid()}/ns/net", "steps": args.steps,
            "overrides": overrides(args), "configs": config_overrides(args), "phases": phases(args), "out": str(work / "out.json")}
    (work / "plan.json").write_text(json.dumps(plan, indent=1))
    # the ranks find their plan
    setup = f'["export {PLAN_ENV}={work / "plan.json"}"]'
    cmd = [sys.executable, "-m", "ddp_lab", "launcher=slurm", "launcher.nodes=2",
           "launcher.nproc_per_node=2", "launcher.wait=true", "launcher.poll_s=1",
           "launcher.wait_timeout_s=3000", f"launcher.setup={setup}", "run.entry=ddp_lab.bench.specs.network",
           f"run.root={work / 'runs'}", "log.progress=lines", "dist.timeout_s=300",
           *overrides(args)]
    env = dict(env, PYTHONPATH=f"{REPO}{os.pathsep}{env.get('PYTHONPATH', '')}")
    load = [round(os.getloadavg()[0], 2)]
    p = subprocess.run(cmd, env=env, cwd=work, capture_output=True, text=True)
    load.append(round(os.getloadavg()[0], 2))
    log = next(Path(work / "runs").glob("*/logs/*.out"), None)
    if log:
        print(log.read_text(errors="replace"), end="")
    if p.returncode != 0 or not (work / "out.json").exists():
        sys.exit(f"net_claims: the job failed ({p.returncode}):\n{p.stdout[-3000:]}\n"
                 f"{p.stderr[-3000:]}")
    return {**json.loads((work / "out.json").read_text()), "load": load,
            "cpus": os.cpu_count(), "when": time.strftime("%Y-%m-%d %H:%M %Z")}


def report(args: argparse.Namespace, res: dict) -> list[Claim]:
    rows = res["rows"]
    load = res.get("load") or ["?", "?"]
    print(f"\n{args.steps} steps/epoch, MLP 784-{args.hidden.replace(',', '-')}-10, batch "
          f"{args.batch}/rank, 2 nodes x 2 ranks (gloo); medians of the rounds; rank 0's "
          f"figures; ended {res.get('when', '?')}, load average {load[0]} before the job, "
          f"{load[1]} after, {res.get('cpus', '?')} CPUs")
    for ph in phases(args):
        med, spread = summarise(rows, ph["phase"], ph["link"])
        node2 = f", node2's link {ph['node2']}" if ph["node2"] else ""
        print(f"\n{ph['phase']}: link {ph['link']}{node2}, {ph['rounds']} round(s)\n")
        print(phase_table(med, spread))
    print()
    med, _ = summarise(rows, "main", args.link)
    slow, _ = summarise(rows, "straggler", args.link)
    found = claims(med, rate_bytes(args.link), straggler_named(rows), slow,
                   rate_bytes(args.slow_link))
    # the same, at each rate
    for ph in (ph for ph in phases(args) if ph["phase"] == "sweep"):
        found += hierarchy_claim(summarise(rows, "sweep", ph["link"])[0], rate_bytes(ph["link"]),
                                 f" at {ph['link']}, {ph['rounds']} round(s)")
    print(f"\nthe claims at {args.link}:\n\n{claims_table(found)}")
    return found


def run(args: argparse.Namespace) -> dict:
    t0 = time.monotonic()
    if args.from_json:
        res = json.loads(Path(args.from_json).read_text())
        args = argparse.Namespace(**{**res["args"], **{k: v for k, v in vars(args).items()
                                                       if k in ("plots", "out")}})
    else:
        with tempfile.TemporaryDirectory(prefix="net_claims_") as tmp, \
                lab_and_cluster(args) as (lab, env):
            res = submit(args, lab, env, Path(tmp))
    found = report(args, res)
    if args.plots:
        draw(args, res["rows"], Path(args.plots))
    print(f"\n{time.monotonic() - t0:.0f} s in all")
    return {"rows": res["rows"], **{k: res[k] for k in ("steps", "load", "cpus", "when") if k in res},
            "claims": [vars(c) for c in found],
            "ratios": {f"{c.name}: measured / predicted": c.measured / c.predicted for c in found
                       if isinstance(c.measured, float) and isinstance(c.predicted, float) and c.predicted}}


BENCHMARKS = {"network": Benchmark(__doc__, SPEC, add_args, run, check)}


if __name__ == "__main__":  # a rank of the job (run.entry)
    from ...rank.main import rank_main

    sys.exit(rank_main(None, "ddp_lab.bench.specs.network", "python -m ddp_lab.bench.suite network", rank))
