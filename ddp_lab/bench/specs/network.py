"""What a slow network does to DDP: the project's claims about
communication, measured on a shaped link, each printed beside its
prediction and its target.

    python -m ddp_lab.bench.suite network     # its own lab + SLURM cluster
    python -m ddp_lab.bench.suite network --lab netlab   # a lab and cluster already up

One SLURM job of 2 nodes x 2 ranks
(`run.entry=ddp_lab.bench.specs.network`: this module is the ranks'
entry too) times every configuration per phase; rank 0 reshapes the
links between phases (netlab.sh shape). The phases, options and figures:
docs/network_ddp.md, "How the script measures".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, Optional

from .. import suite
from ..network_claims import (STRAGGLER, SWEEP, Claim, claims, claims_table, draw,
                              hierarchy_claim, phase_table, rate_bytes, straggler_named, summarise)
from ..suite import REPO, Spec

SPEC = Spec(compares="every sync, overlap and compression on a shaped 2-node link, then the "
                     "link swept and one node slowed", rounds=3,
            ratios="each claim: measured / predicted, against its target")
NETLAB_SH = REPO / "scripts" / "netlab.sh"
# netlab.sh's NAME.env of every lab up
NETLAB_RECORDS = Path("/run/ddp_lab_netlab")
# the job's ranks find their plan (a JSON file) here
PLAN_ENV = "NET_CLAIMS_PLAN"

#: label -> the trainer's overrides; the first four are also drawn
#: against the link rate
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
    ap.add_argument("--steps", type=int, default=16, help="steps per epoch (default 16)")
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
    if args.sweep_rounds < 0:
        raise suite.UsageError(f"--sweep-rounds {args.sweep_rounds}: must be 0 (no sweep) or more")
    if args.bucket_mb <= 0:
        raise suite.UsageError(f"--bucket-mb {args.bucket_mb:g}: must be above 0")
    if not re.fullmatch(r"\d+(,\d+)*", args.hidden):
        raise suite.UsageError(f"--hidden '{args.hidden}': use layer widths such as 1024,1024")
    if args.lab and not (NETLAB_RECORDS / f"{args.lab}.env").is_file():
        raise suite.UsageError(f"--lab {args.lab}: no such lab is up (scripts/netlab.sh status --name "
                 f"{args.lab})")
    if args.lab and not os.environ.get("SLURM_CONF"):
        raise suite.UsageError(f"--lab {args.lab}: export SLURM_CONF of the cluster that runs on it first")
    if args.from_json and not Path(args.from_json).is_file():
        raise suite.UsageError(f"--from {args.from_json}: no such file (an --out of an earlier run)")
    if not args.from_json and not (Path(args.data_root) / "MNIST").is_dir():
        raise suite.UsageError(f"--data-root {args.data_root}: no MNIST folder there")


def overrides(args: argparse.Namespace) -> list[str]:
    """What every configuration trains with (the trainer's keys)."""
    return [f"data.root={Path(args.data_root).resolve()}", "model=mlp",
            f"model.hidden=[{args.hidden}]", f"train.batch_size={args.batch}", "optim=sgd",
            "train.lr=0.05"]


def config_overrides(args: argparse.Namespace) -> dict[str, list[str]]:
    """label -> its sync's overrides, the same bucket size for all
    (DDP's own key)."""
    def bucket(ov: list[str]) -> list[str]:
        if "sync=ddp" in ov:
            return [f"sync.bucket_cap_mb={args.bucket_mb}",
                    f"sync.powersgd_rank={args.powersgd_rank}"]
        return [f"sync.bucket_mb={args.bucket_mb}"]

    return {label: [*ov, *bucket(ov)] for label, ov in CONFIGS.items()}


def phases(args: argparse.Namespace) -> list[dict]:
    """The job's phases: (name, link, node2's link or None,
    configurations, rounds)."""
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
    """netlab.sh shape, run in the submitting process's network
    namespace (where the lab's bridge ends are): every link at `link`,
    or node `node`'s alone."""
    cmd = ["nsenter", f"--net={plan['root_netns']}", "bash", str(NETLAB_SH), "shape",
           "--name", plan["lab"], "--link", link, *(["--node", str(node)] if node else [])]
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=120)


def measure(ctx, plan: dict) -> list[dict]:
    """On every rank: every phase's configurations, one epoch each per
    round; rank 0 keeps the figures (its own: rank 0 leads node1) and
    every rank's comm waits per step."""
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
    """(lab name, environment with SLURM_CONF): the --lab given, or a
    lab and a cluster made here on a name and ports of their own,
    removed on the way out."""
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
    lines = [f"export {PLAN_ENV}={work / 'plan.json'}"]
    setup = "[" + ",".join(f'"{line}"' for line in lines) + "]"
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
        saved = json.loads(Path(args.from_json).read_text())
        args = argparse.Namespace(**{**saved["args"], **{k: v for k, v in vars(args).items()
                                                         if k in ("plots", "out")}})
        res = saved
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


if __name__ == "__main__":  # a rank of the job (run.entry)
    from ...rank.main import rank_main

    sys.exit(rank_main(None, "ddp_lab.bench.specs.network", "python -m ddp_lab.bench.suite network", rank))
