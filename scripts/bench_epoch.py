"""Time per epoch: the course notebook's loop against ddp_lab's, side by side in one run.

    .venv/bin/python scripts/bench_epoch.py                 # notebook vs ours (1 rank) vs ours (2 ranks)
    .venv/bin/python scripts/bench_epoch.py --epochs 3 --ranks 1 2 4
    .venv/bin/python scripts/bench_epoch.py --epochs 1 --ranks 1 --max-steps 20   # a quick check

The notebook's workload: MLP 784-50-10, batch 64, Adam lr 1e-3, CPU. The notebook loop is
its own code (ToTensor + DataLoader with shuffle, DDP over a one-process gloo group); ours is
`python -m ddp_lab` (tensor pipeline, DDP over gloo) with N ranks, each epoch timed
between barriers. Prints a table and the speed-up against the notebook.
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
    return {"epochs": [r["epoch_time_s"] for r in records], "acc": records[-1]["test_accuracy"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=3, help="epochs per configuration (median reported)")
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2], help="ddp_lab world sizes to time")
    p.add_argument("--no-notebook", action="store_true", help="skip the notebook loop")
    p.add_argument("--extra", nargs="*", default=[], help="more overrides for ddp_lab runs")
    p.add_argument("--max-steps", type=int, default=0,
                   help="steps per epoch, for a quick check (0 = full epochs: the real figure)")
    p.add_argument("--threads", type=int, nargs="+", default=[0, 1],
                   help="train.threads values for the 1-rank runs (0 = cores / local ranks)")
    args = p.parse_args()

    from ddp_lab.data import fetch_mnist

    with tempfile.TemporaryDirectory() as tmp:
        root = str(Path(tmp) / "data")
        fetch_mnist(root, ["embedded"])
        rows = []
        if not args.no_notebook:
            t = notebook_epochs(root, args.epochs, args.max_steps)
            rows.append(("notebook loop (ToTensor + DataLoader), 1 process", statistics.median(t), t, None))
        for n in args.ranks:
            for th in (args.threads if n == 1 else [0]):
                r = ours(root, str(Path(tmp) / "runs"), n, args.epochs,
                         [*args.extra, f"train.threads={th}",
                          f"train.max_steps_per_epoch={args.max_steps}"])
                label = "cores/ranks" if th == 0 else str(th)
                rows.append((f"ddp_lab sync=ddp, {n} rank(s), threads {label}",
                             statistics.median(r["epochs"]), r["epochs"], r["acc"]))

    base = rows[0][1]
    print(f"\nMLP 784-50-10, batch 64/rank, Adam, CPU ({os.cpu_count()} cores), "
          f"{args.epochs} epochs each, median epoch time\n")
    print("| configuration | median epoch (s) | epochs (s) | speed-up vs first row | test acc |")
    print("| --- | ---: | --- | ---: | ---: |")
    for name, med, all_t, acc in rows:
        acc_s = f"{acc:.4f}" if acc is not None else "-"
        print(f"| {name} | {med:.3f} | {', '.join(f'{x:.2f}' for x in all_t)} | {base / med:.1f}x | {acc_s} |")


if __name__ == "__main__":
    main()
