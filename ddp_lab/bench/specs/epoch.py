"""Time per epoch: ddp_lab's default against the floor, the fastest loop
the machine runs.

    python -m ddp_lab.bench.suite epoch                  # idle and under a CPU hog, 1 and 2 ranks
    python -m ddp_lab.bench.suite epoch --waits default passive spin:0 --threads 1 2
    python -m ddp_lab.bench.suite epoch --epochs 1 --max-steps 20 --rounds 1   # a quick check, not a figure
    python -m ddp_lab.bench.suite epoch --load late --ranks 1            # a hog that comes mid-run
    python -m ddp_lab.bench.suite epoch --load idle --ranks 1 --pinned   # + train.threads=T, timing on/off

The notebook's workload per load: the search (the tight loop of ddp_lab/bench/loops.py under every
setting ddp_lab does not own; the floor is the fastest), then `--rounds` interleaved rounds of the
floor against `python -m ddp_lab` (docs/performance.md, "The floor: the fastest loop the machine
runs, idle and loaded").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack, contextmanager, nullcontext
from pathlib import Path
from typing import Iterator, Optional, Sequence

from ...world import cpu
from .. import loops
from ..suite import Benchmark, REPO, Spec, trained

SPEC = Spec(compares="the tight loop under every thread count, OpenMP wait and Adam (the floor: "
                     "the fastest) and `python -m ddp_lab` with its defaults, on 1 and 2 ranks, "
                     "idle and under a CPU hog", rounds=3, data=False,
            ratios="ddp_lab / floor, per load and world (goals: 1.15 idle on 1 rank, 1.2 on "
                   "2 ranks, 1.3 under the hog)")


def add_args(p: argparse.ArgumentParser) -> None:
    cores = cpu.cores()
    p.add_argument("--load", nargs="+", default=["idle", "hog"], choices=["idle", "hog", "late"],
                   help="idle, and/or hog: one busy process per core during the whole measure, "
                        "and/or late: ddp_lab's runs with a hog that starts mid-run")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2], choices=[1, 2])
    p.add_argument("--epochs", type=int, default=2, help="epochs per setting, search and rounds")
    p.add_argument("--threads", type=int, nargs="+", default=list(range(1, cores + 1)),
                   help="torch threads searched (per rank on 2 ranks: at most cores / 2)")
    p.add_argument("--waits", nargs="+", default=["default", "passive", "spin:1000", "spin:30000"],
                   help="OpenMP waits searched: default | passive | active | spin:N")
    p.add_argument("--max-steps", type=int, default=0,
                   help="steps per epoch, for a quick check (0 = full epochs: the real figure)")
    p.add_argument("--extra", nargs="*", default=[], help="overrides for the ddp_lab runs")
    p.add_argument("--pinned", action="store_true",
                   help="add ddp_lab on 1 rank at train.threads=T for every searched T, with "
                        "timing on and with timing.enabled=false, to the rounds: ratios to the "
                        "T-thread floor and timing on / off")
    p.add_argument("--notebook", action="store_true",
                   help="add the course notebook's own loop (ToTensor + DataLoader) to the rounds")


def omp_env(wait: str) -> dict[str, str]:
    """The environment OpenMP setting `wait` names (see the module docstring)."""
    if wait == "default":
        return {}
    if wait in ("passive", "active"):
        return {"OMP_WAIT_POLICY": wait.upper()}
    if wait.startswith("spin:") and wait[5:].isdigit():
        return {"GOMP_SPINCOUNT": wait[5:]}
    raise SystemExit(f"--waits {wait}: use default, passive, active or spin:N")


def run(args: argparse.Namespace) -> dict:
    from ...data_fetch import fetch_mnist

    for w in args.waits:
        # a bad one: one line, before anything runs
        omp_env(w)
    inherited = {k: os.environ.pop(k) for k in loops.OMP_KEYS if k in os.environ}
    # ddp_lab's default is what is measured, and each loop's setting its own
    if inherited:
        print(f"(ignoring this shell's {inherited}: every row sets its own)", file=sys.stderr)
    figures: dict = {"ratios": {}}
    with tempfile.TemporaryDirectory() as tmp:
        root = str(Path(tmp) / "data")
        fetch_mnist(root, ["embedded"])
        for load in args.load:
            if load == "late":
                figures[load] = late(root, tmp, args)
                continue
            with (cpu_hog() if load == "hog" else nullcontext()):
                figures[load] = measure(load, root, tmp, args)
            figures["ratios"].update(figures[load]["ratios"])
    return figures


def late(root: str, tmp: str, args) -> dict:
    """ddp_lab on 1 rank, `args.epochs` epochs idle and as many under a hog that starts when the
    last idle one ends: its defaults, then every core's threads under each spinning wait of
    `args.waits`. {row: {"idle": [s], "hog": [s]}}, each row printed as it ends."""
    n = cpu.cores()
    rows = {"defaults": ([], {})}
    for w in args.waits:
        # libgomp's default, 300000 spins (its manual), set explicitly: whatever ddp_lab chooses
        if w != "passive" and n > 1:
            env = {"GOMP_SPINCOUNT": "300000"} if w == "default" else omp_env(w)
            rows[f"train.threads={n}, {w} wait ({' '.join(f'{k}={v}' for k, v in env.items())})"
                 ] = ([f"train.threads={n}"], env)
    print(f"\n## late: a hog starts after epoch {args.epochs} of {2 * args.epochs} (1 rank, "
          f"{n} cores, load average {os.getloadavg()[0]:.2f})\n\n| ddp_lab, 1 rank | epochs idle "
          "(s) | epochs under the hog (s) | hog / idle |\n| --- | --- | --- | ---: |", flush=True)
    out = {}
    for name, (overrides, env) in rows.items():
        epochs, chosen = ours(root, tmp, 1, args, overrides, env, hog_after=args.epochs)
        idle, hog = epochs[:args.epochs], epochs[args.epochs:]
        out[name] = {"idle": idle, "hog": hog, "cpu": chosen}
        label = _chosen(chosen) if not overrides else name
        print(f"| {label} | {', '.join(f'{t:.2f}' for t in idle)} | "
              f"{', '.join(f'{t:.2f}' for t in hog)} | "
              f"{statistics.median(hog) / statistics.median(idle):.1f}x |", flush=True)
    return out


def measure(load: str, root: str, tmp: str, args) -> dict:
    """The search, then the rounds: for each world, the best setting of each thread count (the
    search's winner alone would carry its lucky draw) against ddp_lab's defaults, side by side; the
    floor is the fastest of them over the rounds."""
    cores = cpu.cores()
    print(f"\n## {load}: MLP 784-50-10, batch 64/rank, Adam lr 1e-3, {cores} cores, load average "
          f"{os.getloadavg()[0]:.2f}; median of {args.epochs} epoch(s) per setting", flush=True)
    # the tight loop, 1 process, under every (threads, wait) x Adam
    adams = loops.ADAMS
    one = search("| 1 process: threads, OpenMP wait | " + " | ".join(f"{a} Adam" for a in adams)
                 + " |\n| --- |" + " ---: |" * len(adams), args.threads, args,
                 lambda t, w: loops.in_child("tight_epochs", root, args.epochs, args.max_steps, t,
                                             list(adams), env=omp_env(w)))
    adam = min(one, key=one.get)[2]
    out: dict = {"search_1": {f"{t} threads, {w}, {a}": s for (t, w, a), s in one.items()},
                 "ratios": {}}
    runs: dict[str, tuple] = {f"tight loop, {t} thread{'s' if t > 1 else ''}, {w}, {a} Adam":
                              (1, t, w, a) for t, w, a in _best_per_threads(one)}
    if args.notebook:
        runs["the notebook's loop (ToTensor + DataLoader, DDP on 1 process)"] = (1, "notebook")
    if 1 in args.ranks:
        runs["ddp_lab, 1 rank"] = (1, None)
        for t in args.threads if args.pinned else ():
            runs[f"ddp_lab, 1 rank, train.threads={t}"] = (1, None, (f"train.threads={t}",))
            runs[f"ddp_lab, 1 rank, train.threads={t}, timing.enabled=false"] = (
                1, None, (f"train.threads={t}", "timing.enabled=false"))
    if 2 in args.ranks:
        # the tight loop on 2 ranks under every (threads per rank, wait) x way of summing
        two = search(f"\n| 2 ranks ({adam} Adam): threads/rank, wait | torch DDP | one flat "
                     "all_reduce |\n| --- | ---: | ---: |",
                     [t for t in args.threads if t <= cpu.equal_share(2)] or [1], args,
                     lambda t, w: two_ranks(root, args, t, w, adam))
        out["search_2"] = {f"{t} thread(s)/rank, {w}, {way}": s for (t, w, way), s in two.items()}
        runs.update({f"tight loop on 2 ranks, {t} thread{'s' if t > 1 else ''}/rank, {w}, "
                     f"{way}": (2, t, w, way) for t, w, way in _best_per_threads(two)})
        runs["ddp_lab, 2 ranks"] = (2, None)
    print(f"\nside by side, {args.rounds} interleaved round(s):", flush=True)
    rows: dict[str, list[float]] = {name: [] for name in runs}
    # each round's median epoch of each row: timing on / off is taken round by round (its two
    # rows run one after the other), so a neighbour that comes between rounds cancels
    per_round: dict[str, list[float]] = {name: [] for name in runs}
    # row -> what ddp_lab chose (its last run)
    chosen: dict[str, dict] = {}
    # a pinned row (timing on) at T threads: each run's median epoch over the T-thread loop's
    # run just beside it (before it in odd rounds, after it in even ones), so that a slow spell
    # of the VM, which lasts tens of seconds, falls on both of a pair or on neither
    beside_loop = {t: (t, w, a) for t, w, a in _best_per_threads(one)}
    beside: dict[str, list[float]] = {}

    def tight(t: int, w: str, a: str) -> list[float]:
        """The tight loop, 1 process, at `t` threads, wait `w`, Adam `a`: its epochs."""
        return loops.in_child("tight_epochs", root, args.epochs, args.max_steps, t, [a],
                              env=omp_env(w))[a]

    for rnd in range(args.rounds):
        before = {name: len(v) for name, v in rows.items()}
        for name, (world, *setting) in runs.items():
            if setting[0] is None:
                overrides = setting[1] if len(setting) > 1 else ()
                t = _pinned(overrides)
                loop = tight(*beside_loop[t]) if t in beside_loop and rnd % 2 == 0 else None
                epochs, share = ours(root, tmp, world, args, overrides)
                if t in beside_loop:
                    if loop is None:
                        loop = tight(*beside_loop[t])
                    beside.setdefault(name, []).append(
                        statistics.median(epochs) / statistics.median(loop))
                chosen[name] = share
                rows[name] += epochs
            elif setting[0] == "notebook":
                # its own threads and wait, as its code runs it
                rows[name] += loops.in_child("notebook_epochs", root, args.epochs,
                                             args.max_steps, env={})
            elif world == 1:
                rows[name] += tight(*setting)
            else:
                t, w, way = setting
                rows[name] += two_ranks(root, args, t, w, adam)[way]
        for name, v in rows.items():
            per_round[name].append(statistics.median(v[before[name]:]))
        print(f"  round {rnd + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    med = {name: statistics.median(v) for name, v in rows.items()}
    # the floor's candidates: the tight loops (a thread count; not ddp_lab, not the notebook)
    floor = {w: min(m for name, m in med.items() if runs[name][0] == w
                    and isinstance(runs[name][1], int)) for w in {r[0] for r in runs.values()}}
    print(f"\n| {load} | median epoch (s) | x the floor |\n| --- | ---: | ---: |")
    goals: dict[str, float] = {}
    how: dict[str, str] = {}  # how a ratio was taken, where not the medians divided
    for name, m in med.items():
        world = runs[name][0]
        pinned = runs[name][2] if len(runs[name]) > 2 else ()
        label = name if runs[name][1] is not None else name + ": " + (
            _waited(chosen.get(name)) if pinned else _chosen(chosen.get(name)))
        print(f"| {label} | {m:.3f} | {m / floor[world]:.2f}x |")
        if runs[name][1] is not None:
            continue
        if not pinned:
            key = f"{load}, {name[9:]}: ddp_lab / floor"
            out["ratios"][key] = m / floor[world]
            goals[key] = 1.3 if load == "hog" else 1.2 if world == 2 else 1.15
        elif len(pinned) == 1:
            # against the same thread count's floor, and against itself without timing
            t = int(pinned[0].partition("=")[2])
            if name in beside:
                key = f"{load}, 1 rank, train.threads={t}: ddp_lab / the {t}-thread floor"
                out["ratios"][key], goals[key] = statistics.median(beside[name]), 1.1
                out.setdefault("beside", {})[name] = beside[name]
                how[key] = (f"the median of {len(beside[name])} runs, each over the loop run "
                            "beside it; the table divides medians")
            key = f"{load}, 1 rank, train.threads={t}: timing on / off"
            out["ratios"][key] = paired(per_round[name], per_round[f"{name}, timing.enabled=false"])
            goals[key] = 1.03
            how[key] = f"the median of {len(per_round[name])} rounds' own ratios"
    for key, r in out["ratios"].items():
        print(f"{key} = {r:.2f} (goal <= {goals[key]}{'; ' + how[key] if key in how else ''})")
    out["epochs_s"] = rows
    return out


def _pinned(overrides: Sequence[str]) -> Optional[int]:
    """T where `overrides` is train.threads=T alone (a pinned row with timing on), else None."""
    if len(overrides) == 1 and overrides[0].startswith("train.threads="):
        return int(overrides[0].partition("=")[2])
    return None


def paired(a: list[float], b: list[float]) -> float:
    """The median over rounds of a round's `a` / the same round's `b`."""
    return statistics.median(x / y for x, y in zip(a, b))


def _best_per_threads(found: dict) -> list[tuple]:
    """The fastest setting of each thread count in a search's results {(t, w, x): s}."""
    best: dict[int, tuple] = {}
    for key, sec in found.items():
        if key[0] not in best or sec < found[best[key[0]]]:
            best[key[0]] = key
    return [best[t] for t in sorted(best)]


def search(head: str, threads: list[int], args, measure) -> dict[tuple[int, str, str], float]:
    """Every (threads, wait) of the search, `measure(t, w)` -> {column: [s/epoch]}: the median of
    each (t, w, column), a table row printed as each ends."""
    found = {}
    print(head)
    for t in threads:
        # 1 thread: no OpenMP team to wait
        for w in (args.waits if t > 1 else args.waits[:1]):
            times = measure(t, w)
            for col, ts in times.items():
                found[(t, w, col)] = statistics.median(ts)
            print(f"| {t}, {w if t > 1 else '(1 thread: none)'} | "
                  + " | ".join(f"{found[(t, w, c)]:.3f}" for c in times) + " |", flush=True)
    return found


def _chosen(share: dict | None) -> str:
    """ddp_lab's defaults, as its run chose them (summary.json segments[0].cpu)."""
    if not share:
        return "its defaults"
    n = share.get("threads")
    return f"its defaults: {n} thread{'s' if n != 1 else ''} a rank ({share.get('why')})"


def _waited(share: dict | None) -> str:
    """How a pinned run's threads waited, and why (summary.json segments[0].cpu)."""
    return f"waiting threads {share['wait']}" if share and share.get("wait") else "?"


def two_ranks(root: str, args, threads: int, wait: str, adam: str) -> dict[str, list[float]]:
    from ..scaffold import run_ranks

    # the spawned ranks read it when torch loads (run() cleared the shell's)
    os.environ.update(omp_env(wait))
    try:
        return run_ranks(loops.ranks_epochs, 2, (root, args.epochs, args.max_steps, threads, adam))[0]
    finally:
        for k in loops.OMP_KEYS:
            os.environ.pop(k, None)


def ours(root: str, tmp: str, ranks: int, args, overrides: Sequence[str] = (),
         env: Optional[dict] = None, hog_after: int = 0) -> tuple[list[float], dict]:
    """`python -m ddp_lab` with its defaults on `ranks` ranks (plus `overrides`, and `env` added to
    its environment): each epoch as its records say, and what its defaults chose (summary.json
    `segments[0].cpu`). `hog_after` > 0: as many epochs again, with a hog started when epoch
    `hog_after` ends."""
    epochs = args.epochs + hog_after
    s = trained([f"launcher.nproc_per_node={ranks}", f"train.epochs={epochs}",
                 f"data.root={root}", f"run.root={tmp}/runs", "train.checkpoint=false",
                 f"train.max_steps_per_epoch={args.max_steps}", *args.extra, *overrides], REPO,
                env=env, on_line=_hog_from(f"epoch {hog_after}/{epochs} ") if hog_after else None)
    records = Path(s["run_dir"], "metrics.jsonl").read_text().splitlines()
    return [json.loads(x)["epoch_time_s"] for x in records], s["segments"][0].get("cpu") or {}


@contextmanager
def cpu_hog(seconds: float = 3600) -> Iterator[list[int]]:
    """One busy process per core while the block runs (each dies with this process, and ends itself
    after `seconds` in any case): the load a shared login node or a neighbour's job puts on the
    cores."""
    code = ("import ctypes, os, time\n"
            "ctypes.CDLL('libc.so.6').prctl(1, 9)  # PR_SET_PDEATHSIG: SIGKILL when we die\n"
            "end = time.monotonic() + %r\n"
            "while time.monotonic() < end and os.getppid() == %d:\n"
            "    for _ in range(100000): pass\n" % (seconds, os.getpid()))
    procs = [subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
             for _ in range(cpu.cores())]
    try:
        yield [p.pid for p in procs]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def _hog_from(marker: str):
    """A line reader for `trained`: starts `cpu_hog` at the first line containing `marker` and ends
    it when the run ends (called with None)."""
    hog, started = ExitStack(), []

    def on_line(line: Optional[str]) -> None:
        if line is None:
            hog.close()
        elif marker in line and not started:
            started.append(hog.enter_context(cpu_hog()))
    return on_line


BENCHMARKS = {"epoch": Benchmark(__doc__, SPEC, add_args, run)}
