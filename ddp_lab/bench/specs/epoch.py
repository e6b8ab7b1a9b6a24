"""Time per epoch: the floor, the course notebook's loop and ddp_lab's, side by side in one run.

    python -m ddp_lab.bench.suite epoch                # 3 interleaved rounds, 1 and 2 ranks: the figures
    python -m ddp_lab.bench.suite epoch --ranks 1 --notebook-passive
    python -m ddp_lab.bench.suite epoch --compile --threads 0 1
    python -m ddp_lab.bench.suite epoch --epochs 1 --max-steps 20 --rounds 1   # a quick check, not a figure

The workload: MLP 784-50-10, batch 64 per rank, Adam lr 1e-3, CPU. Per round, one after
the other (interleaved, so the machine's drift hits every row alike):
- the floor: a tight loop over preloaded tensors (the same model, optimiser, batch, threads
  and OMP wait policy; no process group, no timers): what ddp_lab cannot beat;
- the notebook's loop, its own code (ToTensor + DataLoader with shuffle, DDP over a
  one-process gloo group);
- `python -m ddp_lab` (sync=ddp) on each of --ranks, with timing.enabled true and false,
  each epoch timed between barriers as the run records it;
- with 2 in --ranks, the floor's loop under torch's DDP on 2 processes (no ddp_lab in the
  step: what a 2-rank ddp_lab run is measured against), and the median of one
  gradient-sized gloo all_reduce between 2 processes: the 2-rank latency floor is steps x
  (that all_reduce + the floor's step), a sum of parts measured apart.
Prints one table (median epoch over all epochs and rounds, and each round's ratio to the
floor measured in the same round) and the two ratios the goals are about.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..suite import REPO, Spec, trained

SPEC = Spec(compares="the floor (a tight loop), the notebook's loop and `python -m ddp_lab` "
                     "(timing on and off) on 1 and 2 ranks", rounds=3, data=False,
            ratios="ddp_lab / floor on 1 rank (goal <= 1.2); on 2 ranks ddp_lab / latency "
                   "floor (goal <= 1.2) and torch's DDP loop / latency floor")


def notebook_epochs(root: str, epochs: int, max_steps: int = 0) -> list[float]:
    """The notebook's training loop, verbatim in substance (001_*.txt, first cell)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    import torchvision.datasets as datasets
    import torchvision.transforms as transforms
    from torch.utils.data import DataLoader

    torch.set_num_threads(os.cpu_count() or 1)

    class NN(nn.Module):
        def __init__(self, input_size, num_classes):
            super().__init__()
            self.fc1 = nn.Linear(input_size, 50)
            self.fc2 = nn.Linear(50, num_classes)

        def forward(self, x):
            return self.fc2(F.relu(self.fc1(x)))

    train_dataset = datasets.MNIST(root=root, train=True, transform=transforms.ToTensor(), download=False)
    train_loader = DataLoader(dataset=train_dataset, batch_size=64, shuffle=True)
    # the notebook wraps its model in DDP over a one-process gloo group: so do we here
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ...launch.ports import free_port

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))  # the notebook's 12355 may be taken
    dist.init_process_group("gloo", rank=0, world_size=1)
    model = DDP(NN(784, 10))
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.001)
    times = []
    for _ in range(epochs):
        t0 = time.perf_counter()
        for step, (data, targets) in enumerate(train_loader):
            if max_steps and step == max_steps:
                break
            data = data.reshape(data.shape[0], -1)
            loss = criterion(model(data), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        times.append(time.perf_counter() - t0)
    dist.destroy_process_group()
    return times


def floor_epochs(root: str, epochs: int, max_steps: int = 0, device: str = "cpu") -> list[float]:
    """The floor: the tightest loop over the same work. MNIST preloaded as one normalised
    float tensor, a fresh permutation per epoch, batches by index, the same MLP 784-50-10,
    fused Adam lr 1e-3, batch 64, as many torch threads as a 1-rank ddp_lab run uses (all cores)
    and the same OMP wait policy (the caller's environment). No process group, no timers,
    no records: what remains of an epoch when everything ddp_lab adds is taken away.
    `device="cuda"`: the same on the GPU (scripts/gpu_check.sh's floor row), each epoch
    timed after a synchronize, as ddp_lab's."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from ...data import load_split, normalise

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    torch.manual_seed(0)
    images, labels = load_split(root, train=True)
    x_all = normalise(images).flatten(1).to(device)  # [60000, 784], once, outside every epoch
    labels = labels.to(device)
    model = nn.Sequential(nn.Linear(784, 50), nn.ReLU(), nn.Linear(50, 10)).to(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    # fused, as ddp_lab's optim=adam is by default (optim.fused): the same update kernel
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    n, batch = len(labels), 64
    # one forward and backward before the clock, as ddp_lab's preflight does (the thread
    # pool and autograd's first-call set-up are no epoch's); the weights are untouched
    F.cross_entropy(model(x_all[:batch]), labels[:batch]).backward()
    model.zero_grad(set_to_none=True)
    times = []
    for _ in range(epochs):
        sync()
        t0 = time.perf_counter()
        tight_epoch(model, optimizer, x_all, labels, torch.randperm(n, device=device), batch, max_steps)
        sync()
        times.append(time.perf_counter() - t0)
    return times


def tight_epoch(model, optimizer, x_all, labels, order, batch: int, max_steps: int) -> None:
    """One epoch of the floor's loop over the samples `order` names, in batches of `batch`."""
    import torch.nn.functional as F

    for step, i in enumerate(range(0, len(order), batch)):
        if max_steps and step == max_steps:
            break
        idx = order[i:i + batch]
        loss = F.cross_entropy(model(x_all[idx]), labels[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


def ddp_floor_epochs(root: str, epochs: int, max_steps: int, ranks: int) -> list[float]:
    """The floor on `ranks` processes: the floor's tight loop, each rank on its half of every
    epoch's permutation, under torch's DDP on a local gloo group (no ddp_lab in the step),
    as many torch threads per rank as a ddp_lab rank gets (cores / ranks) and OMP passive.
    Every epoch between barriers, as ddp_lab times its own; rank 0's times."""
    from ..scaffold import run_ranks

    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # the spawned ranks read it when torch loads
    out = run_ranks(_ddp_floor_rank, ranks, (root, epochs, max_steps))
    if out is None:
        sys.exit("the DDP floor failed (the rank's error is above)")
    return out[0]


def _ddp_floor_rank(ctx, args) -> list[float]:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    from ...data import load_split, normalise

    root, epochs, max_steps = args
    rank, world = ctx.env.rank, ctx.env.world_size
    torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // world))
    torch.manual_seed(0)
    images, labels = load_split(root, train=True)
    x_all = normalise(images).flatten(1)
    model = DDP(nn.Sequential(nn.Linear(784, 50), nn.ReLU(), nn.Linear(50, 10)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
    n, batch = len(labels), 64
    F.cross_entropy(model(x_all[:batch]), labels[:batch]).backward()  # warm-up, as the floor's
    model.zero_grad(set_to_none=True)
    times = []
    for _ in range(epochs):
        order = torch.randperm(n)[rank::world]  # the same seed: one permutation, split
        ctx.barrier()
        t0 = time.perf_counter()
        tight_epoch(model, optimizer, x_all, labels, order, batch, max_steps)
        ctx.barrier()
        times.append(time.perf_counter() - t0)
    return times


def allreduce_latency(ranks: int, numel: int, calls: int = 300) -> float:
    """Median seconds of one all_reduce of `numel` float32 (one step's gradient) between
    `ranks` local gloo processes: the part of a step no synchroniser can avoid."""
    from ..scaffold import run_ranks

    out = run_ranks(_latency_rank, ranks, (numel, calls))
    if out is None:
        sys.exit("all_reduce latency failed (the rank's error is above)")
    return out[0]


def _latency_rank(ctx, args) -> float:
    import torch
    import torch.distributed as dist

    numel, calls = args
    grad = torch.ones(numel)
    times = []
    for i in range(calls + 20):  # 20 warm-up calls
        ctx.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(grad)
        if i >= 20:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def ours(root: str, out: str, ranks: int, epochs: int, extra: list[str]) -> dict:
    s = trained([f"launcher.nproc_per_node={ranks}", f"train.epochs={epochs}", f"data.root={root}",
                 f"run.root={out}", "train.checkpoint=false", "dist.device=cpu", *extra], REPO)
    records = [json.loads(x) for x in (Path(s["run_dir"]) / "metrics.jsonl").read_text().splitlines()]
    return {"epochs": [r["epoch_time_s"] for r in records], "acc": records[-1]["test_accuracy"],
            "compile_s": s.get("compile_s")}


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--epochs", type=int, default=2, help="epochs per configuration and round")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="ddp_lab world sizes to time")
    p.add_argument("--no-notebook", action="store_true", help="skip the notebook loop")
    p.add_argument("--notebook-passive", action="store_true",
                   help="run the notebook with OMP_WAIT_POLICY=PASSIVE too, as the trainer's ranks "
                        "run (on a busy machine its spinning threads otherwise dominate its time)")
    p.add_argument("--compile", action="store_true", help="add a 1-rank train.compile=true row")
    p.add_argument("--no-compile", action="store_true", help=argparse.SUPPRESS)  # the old default
    p.add_argument("--extra", nargs="*", default=[], help="more overrides for ddp_lab runs")
    p.add_argument("--max-steps", type=int, default=0,
                   help="steps per epoch, for a quick check (0 = full epochs: the real figure)")
    p.add_argument("--threads", type=int, nargs="+", default=[0],
                   help="train.threads values for the 1-rank runs (0 = the trainer's default)")


def run(args: argparse.Namespace) -> dict:
    from ...data_fetch import fetch_mnist

    configs: list[tuple[str, int, list[str]]] = []  # (label, ranks, overrides)
    for n in args.ranks:
        for th in (args.threads if n == 1 else [0]):
            label = "" if th == 0 else f", threads {th}"
            for timing in ("true", "false"):
                configs.append((f"ddp_lab sync=ddp, {n} rank(s){label}, timing {timing}", n,
                                [f"train.threads={th}", f"timing.enabled={timing}"]))
    if args.compile:
        configs.append(("ddp_lab sync=ddp, 1 rank(s), train.compile=true", 1,
                        ["train.compile=true"]))
    notebook = NOTEBOOK + (", OMP_WAIT_POLICY=PASSIVE" if args.notebook_passive else "")
    names = ([FLOOR] + ([FLOOR2] if 2 in args.ranks else [])
             + ([notebook] if not args.no_notebook else []) + [c[0] for c in configs])
    epochs: dict[str, list[float]] = {n: [] for n in names}
    per_repeat: dict[str, list[float]] = {n: [] for n in names}  # median epoch of each round
    acc: dict[str, float] = {}
    compile_s: dict[str, list[float]] = {n: [] for n in names}
    latency: list[float] = []  # one gradient all_reduce between 2 ranks, per round
    grad_numel = 784 * 50 + 50 + 50 * 10 + 10
    with tempfile.TemporaryDirectory() as tmp:
        root = str(Path(tmp) / "data")
        fetch_mnist(root, ["embedded"])
        for rep in range(args.rounds):
            t = _in_child("floor_epochs", root, args.epochs, args.max_steps, passive=True)
            epochs[FLOOR] += t
            per_repeat[FLOOR].append(statistics.median(t))
            if 2 in args.ranks:
                t = ddp_floor_epochs(root, args.epochs, args.max_steps, 2)
                epochs[FLOOR2] += t
                per_repeat[FLOOR2].append(statistics.median(t))
            if not args.no_notebook:
                # a fresh process per round: the notebook's own process group each time
                t = _in_child("notebook_epochs", root, args.epochs, args.max_steps,
                              passive=args.notebook_passive)
                epochs[notebook] += t
                per_repeat[notebook].append(statistics.median(t))
            for name, n, over in configs:
                r = ours(root, str(Path(tmp) / "runs"), n, args.epochs,
                         [*args.extra, *over, f"train.max_steps_per_epoch={args.max_steps}"])
                epochs[name] += r["epochs"]
                per_repeat[name].append(statistics.median(r["epochs"]))
                acc[name] = r["acc"]
                if r["compile_s"] is not None:
                    compile_s[name].append(r["compile_s"])
            if 2 in args.ranks:
                latency.append(allreduce_latency(2, grad_numel))
            print(f"round {rep + 1}/{args.rounds} done", file=sys.stderr, flush=True)

    base = statistics.median(epochs[FLOOR])
    print(f"\nMLP 784-50-10, batch 64/rank, Adam lr 1e-3, CPU ({os.cpu_count()} cores), "
          f"{args.epochs} epochs x {args.rounds} round(s) each, interleaved; median epoch "
          f"time over all of them (the first epoch included); load average before: "
          f"{os.getloadavg()[0]:.2f}\n")
    print("| configuration | median epoch (s) | per-round medians (s) | x floor "
          "| per-round x floor | compile (s) | test acc |")
    print("| --- | ---: | --- | ---: | --- | ---: | ---: |")
    for name in names:
        med = statistics.median(epochs[name])
        reps = per_repeat[name]
        ratios = [m / f for f, m in zip(per_repeat[FLOOR], reps)]
        comp = f"{statistics.median(compile_s[name]):.1f}" if compile_s[name] else "-"
        acc_s = f"{acc[name]:.4f}" if name in acc else "-"
        print(f"| {name} | {med:.3f} | {', '.join(f'{x:.3f}' for x in reps)} | {med / base:.2f}x "
              f"| {', '.join(f'{x:.2f}x' for x in ratios)} | {comp} | {acc_s} |")
    steps1, found = _steps(1, args.max_steps), {}
    if 1 in args.ranks:
        ours1 = statistics.median(epochs["ddp_lab sync=ddp, 1 rank(s), timing true"])
        found["1 rank: ddp_lab (timing on) / floor"] = ours1 / base
        print(f"\n1 rank: ddp_lab (timing on) / floor = {ours1 / base:.2f} (goal <= 1.2)")
    if 2 in args.ranks:
        # each of 2 ranks computes its half of the epoch at the floor's pace, then waits for
        # one all_reduce of the whole gradient per step: nothing can do less
        steps2 = _steps(2, args.max_steps)
        lat = statistics.median(latency)
        floor2 = steps2 * (lat + base / steps1)
        ours2 = statistics.median(epochs["ddp_lab sync=ddp, 2 rank(s), timing true"])
        tight2 = statistics.median(epochs[FLOOR2])
        print(f"2 ranks: latency floor = {steps2} steps x ({lat * 1e3:.3f} ms all_reduce of "
              f"{grad_numel * 4 / 1e3:.0f} kB + {base / steps1 * 1e3:.3f} ms floor step) = "
              f"{floor2:.3f} s; ddp_lab (timing on) / latency floor = {ours2 / floor2:.2f} "
              f"(goal <= 1.2); torch's DDP tight loop / latency floor = {tight2 / floor2:.2f}; "
              f"ddp_lab (timing on) / torch's DDP tight loop = {ours2 / tight2:.2f}")
        found.update({"2 ranks: ddp_lab (timing on) / latency floor": ours2 / floor2,
                      "2 ranks: torch's DDP tight loop / latency floor": tight2 / floor2})
    return {"epochs_s": epochs, "round_medians_s": per_repeat, "test_accuracy": acc,
            "compile_s": compile_s, "ratios": found}


def _steps(ranks: int, max_steps: int) -> int:
    """Steps of one epoch per rank: 60,000 samples split over `ranks`, batches of 64."""
    steps = -(-(-(-60_000 // ranks)) // 64)
    return min(steps, max_steps) if max_steps else steps


FLOOR = "floor: tight loop over preloaded tensors, 1 process"
FLOOR2 = "floor on 2 ranks: the same loop under torch DDP, 2 processes"
NOTEBOOK = "notebook loop (ToTensor + DataLoader), 1 process"


def _in_child(fn: str, root: str, epochs: int, max_steps: int, passive: bool) -> list[float]:
    """One of this file's loops (notebook_epochs, floor_epochs) in a process of its own: its
    threads (and the notebook's gloo group) its own, as a run's rank has."""
    code = ("import json; import ddp_lab.bench.specs.epoch as b; "
            "print(json.dumps(b.%s(%r, %d, %d)))" % (fn, root, epochs, max_steps))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"  # read when torch loads in the child
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"{fn} failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
