"""Time per epoch: the course notebook's loop against ddp_lab's, side by side in one run.

    .venv/bin/python scripts/bench_epoch.py                 # notebook vs trainer vs trainer+compile (1 rank)
    .venv/bin/python scripts/bench_epoch.py --repeats 3     # the whole set 3 times, interleaved: medians
    .venv/bin/python scripts/bench_epoch.py --notebook-passive   # the notebook's threads sleep too
    .venv/bin/python scripts/bench_epoch.py --epochs 3 --ranks 1 2 4 --threads 0 1
    .venv/bin/python scripts/bench_epoch.py --epochs 1 --max-steps 20 --no-compile  # a quick check

The notebook's workload: MLP 784-50-10, batch 64, Adam lr 1e-3, CPU. The notebook loop is
its own code (ToTensor + DataLoader with shuffle, DDP over a one-process gloo group); ours is
`python -m ddp_lab` (tensor pipeline, DDP over gloo) with N ranks, each epoch timed
between barriers, and the same with `train.compile=true` (its compile time, spent before
the first epoch, is a column of its own). With --repeats R every configuration runs R times,
interleaved (notebook, trainer, compiled, notebook, ...) so that the machine's drift hits
them alike. Prints one table: per configuration the median epoch over all its epochs and
repeats, the speed-up against the notebook's median, and each repeat's own ratio
(trainer / notebook measured in the same repeat, side by side).
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

REPO = Path(__file__).resolve().parent.parent


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

    from ddp_lab.ports import free_port

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


def ours(root: str, out: str, ranks: int, epochs: int, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "ddp_lab", f"launcher.nproc_per_node={ranks}",
           f"train.epochs={epochs}", f"data.root={root}", f"run.root={out}",
           "train.checkpoint=false", "log.progress=lines", "dist.device=cpu", *extra]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"ddp_lab run failed:\n{proc.stdout}\n{proc.stderr}")
    run_dir = Path(proc.stdout.strip().splitlines()[-1].removeprefix("run dir: "))
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    summary = json.loads((run_dir / "summary.json").read_text())
    return {"epochs": [r["epoch_time_s"] for r in records], "acc": records[-1]["test_accuracy"],
            "compile_s": summary.get("compile_s")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=3, help="epochs per configuration and repeat")
    p.add_argument("--repeats", type=int, default=1,
                   help="run every configuration this many times, interleaved (medians over all)")
    p.add_argument("--ranks", type=int, nargs="+", default=[1], help="ddp_lab world sizes to time")
    p.add_argument("--no-notebook", action="store_true", help="skip the notebook loop")
    p.add_argument("--notebook-passive", action="store_true",
                   help="run the notebook with OMP_WAIT_POLICY=PASSIVE too, as the trainer's ranks "
                        "run (on a busy machine its spinning threads otherwise dominate its time)")
    p.add_argument("--no-compile", action="store_true", help="skip the train.compile=true row")
    p.add_argument("--extra", nargs="*", default=[], help="more overrides for ddp_lab runs")
    p.add_argument("--max-steps", type=int, default=0,
                   help="steps per epoch, for a quick check (0 = full epochs: the real figure)")
    p.add_argument("--threads", type=int, nargs="+", default=[0],
                   help="train.threads values for the 1-rank runs (0 = the trainer's default)")
    args = p.parse_args()

    from ddp_lab.data import fetch_mnist

    configs: list[tuple[str, int, list[str]]] = []  # (label, ranks, overrides)
    for n in args.ranks:
        for th in (args.threads if n == 1 else [0]):
            label = "default" if th == 0 else str(th)
            configs.append((f"ddp_lab sync=ddp, {n} rank(s), threads {label}", n,
                            [f"train.threads={th}"]))
    if not args.no_compile:
        th = args.threads[0]
        configs.append((f"ddp_lab sync=ddp, 1 rank(s), threads {'default' if th == 0 else th}, "
                        "train.compile=true", 1, [f"train.threads={th}", "train.compile=true"]))
    notebook = NOTEBOOK + (", OMP_WAIT_POLICY=PASSIVE" if args.notebook_passive else "")
    names = ([notebook] if not args.no_notebook else []) + [c[0] for c in configs]
    epochs: dict[str, list[float]] = {n: [] for n in names}
    per_repeat: dict[str, list[float]] = {n: [] for n in names}  # median epoch of each repeat
    acc: dict[str, float] = {}
    compile_s: dict[str, list[float]] = {n: [] for n in names}
    with tempfile.TemporaryDirectory() as tmp:
        root = str(Path(tmp) / "data")
        fetch_mnist(root, ["embedded"])
        for rep in range(args.repeats):
            if not args.no_notebook:
                # a fresh process per repeat: the notebook's own process group each time
                t = _notebook_in_child(root, args.epochs, args.max_steps, args.notebook_passive)
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
            print(f"repeat {rep + 1}/{args.repeats} done", file=sys.stderr, flush=True)

    base = statistics.median(epochs[names[0]])
    print(f"\nMLP 784-50-10, batch 64/rank, Adam, CPU ({os.cpu_count()} cores), "
          f"{args.epochs} epochs x {args.repeats} repeat(s) each, interleaved; median epoch "
          f"time over all of them (the first epoch included)\n")
    print(f"| configuration | median epoch (s) | per-repeat medians (s) | speed-up vs first row "
          f"| per-repeat ratio vs first row | compile (s) | test acc |")
    print("| --- | ---: | --- | ---: | --- | ---: | ---: |")
    for name in names:
        med = statistics.median(epochs[name])
        reps = per_repeat[name]
        ratios = [b / m for b, m in zip(per_repeat[names[0]], reps)]
        comp = f"{statistics.median(compile_s[name]):.1f}" if compile_s[name] else "-"
        acc_s = f"{acc[name]:.4f}" if name in acc else "-"
        print(f"| {name} | {med:.3f} | {', '.join(f'{x:.2f}' for x in reps)} | {base / med:.1f}x "
              f"| {', '.join(f'{x:.1f}x' for x in ratios)} | {comp} | {acc_s} |")


NOTEBOOK = "notebook loop (ToTensor + DataLoader), 1 process"


def _notebook_in_child(root: str, epochs: int, max_steps: int, passive: bool) -> list[float]:
    """The notebook loop in a process of its own (its gloo group and threads its own)."""
    code = ("import json, sys; sys.path.insert(0, %r); import bench_epoch as b; "
            "print(json.dumps(b.notebook_epochs(%r, %d, %d)))"
            % (str(Path(__file__).resolve().parent), root, epochs, max_steps))
    env = dict(os.environ, PYTHONPATH=str(REPO))
    if passive:
        env["OMP_WAIT_POLICY"] = "PASSIVE"  # read when torch loads in the child
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"notebook loop failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    main()
