"""The loops the epoch benchmark (ddp_lab/bench/specs/epoch.py) times ddp_lab against: the tightest
loop over the same work, on 1 process and on 2, and the course notebook's own. Each takes the
settings that are not ddp_lab's (threads, OpenMP's wait, Adam's implementation) as arguments: the
benchmark searches them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ADAMS = ("fused", "foreach", "for-loop")  # torch.optim.Adam's three implementations
OMP_KEYS = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


def warm_model(impl: str, x_all, labels, device: str = "cpu", ddp: bool = False):
    """The MLP 784-50-10 (seed 0; in torch's DDP if `ddp`) and torch.optim.Adam, lr 1e-3, in
    implementation `impl` (one of ADAMS), after one untimed warm-up step (as ddp_lab's preflight)
    that leaves the weights untouched."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 50), nn.ReLU(), nn.Linear(50, 10)).to(device)
    if ddp:
        model = torch.nn.parallel.DistributedDataParallel(model)
    kw = {"fused": {"fused": True}, "foreach": {"foreach": True}, "for-loop": {"foreach": False}}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, **kw[impl])
    F.cross_entropy(model(x_all[:64]), labels[:64]).backward()
    model.zero_grad(set_to_none=True)
    return model, optimizer


def tight_epochs(root: str, epochs: int, max_steps: int = 0, threads: int = 0,
                 adams: tuple[str, ...] = ("fused",), device: str = "cpu") -> dict[str, list[float]]:
    """The tightest loop, 1 process: for each Adam in `adams`, `epochs` epochs timed one by one;
    {adam: [seconds]}. `threads` 0: torch's default. The OpenMP settings are this process's
    environment's."""
    import torch

    from ..data import load_split, normalise

    if threads:
        torch.set_num_threads(threads)
    images, labels = load_split(root, train=True)
    # [60000, 784], once, outside every epoch
    x_all = normalise(images).flatten(1).to(device)
    labels = labels.to(device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = {}
    for impl in adams:
        model, optimizer = warm_model(impl, x_all, labels, device)
        times = []
        for _ in range(epochs):
            sync()
            t0 = time.perf_counter()
            one_epoch(model, optimizer, x_all, labels, torch.randperm(len(labels), device=device),
                      max_steps)
            sync()
            times.append(time.perf_counter() - t0)
        out[impl] = times
    return out


def floor_epochs(root: str, epochs: int, max_steps: int = 0, device: str = "cpu") -> list[float]:
    """The tight loop with fused Adam and torch's default threads (scripts/gpu_check.sh's floor row
    on the GPU, where no CPU setting matters)."""
    return tight_epochs(root, epochs, max_steps, device=device)["fused"]


def one_epoch(model, optimizer, x_all, labels, order, max_steps: int = 0, batch: int = 64,
              reduce=None) -> None:
    """One epoch of the tight loop over the samples `order` names, in batches of `batch`;
    `reduce(model)` between backward and the optimiser step (2 ranks: the gradient sum)."""
    import torch.nn.functional as F

    for step, i in enumerate(range(0, len(order), batch)):
        if max_steps and step == max_steps:
            break
        idx = order[i:i + batch]
        loss = F.cross_entropy(model(x_all[idx]), labels[idx])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if reduce is not None:
            reduce(model)
        optimizer.step()


def ranks_epochs(ctx, args) -> dict[str, list[float]]:
    """The tight loop on each rank of a local gloo group (ddp_lab.bench.scaffold.run_ranks), each
    on its strided half of every epoch's permutation, its gradient summed one of two ways: torch's
    DDP, or one hand-written all-reduce of the flattened gradient per step. {way: rank 0's
    [seconds]}, every epoch between barriers as ddp_lab times its own."""
    import torch
    import torch.distributed as dist

    from ..data import load_split, normalise

    root, epochs, max_steps, threads, impl = args
    rank, world = ctx.env.rank, ctx.env.world_size
    torch.set_num_threads(threads)
    images, labels = load_split(root, train=True)
    x_all = normalise(images).flatten(1)

    # one call for the whole gradient: the fewest latencies
    def flat_all_reduce(model):
        grads = [p.grad for p in model.parameters()]
        flat = torch.cat([g.reshape(-1) for g in grads]).div_(world)
        dist.all_reduce(flat)
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()

    out = {}
    for way in ("torch DDP", "one flat all_reduce"):
        model, optimizer = warm_model(impl, x_all, labels, ddp=way == "torch DDP")
        reduce = None if way == "torch DDP" else flat_all_reduce
        times = []
        for _ in range(epochs):
            # same seed: one permutation
            order = torch.randperm(len(labels))[rank::world]
            ctx.barrier()
            t0 = time.perf_counter()
            one_epoch(model, optimizer, x_all, labels, order, max_steps, reduce=reduce)
            ctx.barrier()
            times.append(time.perf_counter() - t0)
        out[way] = times
    return out


def notebook_epochs(root: str, epochs: int, max_steps: int = 0) -> list[float]:
    """The notebook's training loop, verbatim in substance (001_*.txt, first cell)."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F
    import torchvision.datasets as datasets
    import torchvision.transforms as transforms
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader

    from ..world.ports import free_port

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
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    # the notebook's 12355 may be taken
    os.environ.setdefault("MASTER_PORT", str(free_port()))
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


def in_child(fn: str, *args, env: dict[str, str]):
    """`fn(*args)` of this module in a fresh interpreter whose environment adds `env`: the OpenMP
    settings are read once, when torch loads, so each setting needs its own process."""
    code = ("import json, sys; import ddp_lab.bench.loops as m; "
            f"print(json.dumps(m.{fn}(*json.loads(sys.argv[1]))))")
    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    # only what `env` says, not ours
    for key in OMP_KEYS:
        if key not in env:
            full.pop(key, None)
    proc = subprocess.run([sys.executable, "-c", code, json.dumps(args)], capture_output=True,
                          text=True, env=full, cwd=REPO)
    if proc.returncode != 0:
        sys.exit(f"{fn} failed:\n{proc.stdout}\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
