"""Stop 0: all of data-parallel training in one file (docs/tour.md starts here).

    torchrun --nproc-per-node 2 -m ddp_lab.one_file --sync naive --max-steps 50 --save w.pt
    python -m ddp_lab run.entry=ddp_lab.one_file sync=ring   # the same, launched by ddp_lab

Each rank trains the same model on its own shard, then averages the gradients with the
others, so all take the same step: the weights equal `python -m ddp_lab sync=naive` and
`sync=ring` bit for bit (tests/test_one_file.py)."""
import argparse
import gzip
import math
import os
import time
from collections import OrderedDict

import torch
import torch.distributed as dist
import torch.nn.functional as F
import yaml
from torch import nn


def read_idx(name: str, header: int) -> torch.Tensor:
    """One archive every data.root is fetched from: after a header, one uint8 per value."""
    with gzip.open(os.path.join(os.path.dirname(__file__), "assets", "mnist", name)) as f:
        data = bytearray(f.read())
    return torch.frombuffer(data, dtype=torch.uint8, offset=header)


def shard(epoch: int, rank: int, world: int, seed: int) -> torch.Tensor:
    """This rank's samples, as DistributedSampler deals them: rank r takes r, r+world, ..."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)  # the same order on every rank, a new one each epoch
    order = torch.randperm(60_000, generator=g)
    per_rank = math.ceil(len(order) / world)  # every rank gets as many:
    padding = per_rank * world - len(order)  # the first few samples again
    order = torch.cat([order, order[:padding]])
    return order[rank::world]


def all_reduce_naive(model: nn.Module) -> None:
    world = dist.get_world_size()
    for p in model.parameters():  # one call, so one latency, per parameter
        p.grad /= world  # each rank's share first: then the sum is the average
        dist.all_reduce(p.grad)  # the sum over ranks, in place


def ring_sum(flat: torch.Tensor) -> None:
    """The textbook ring, in place: `flat` in `world` chunks; at step s each rank sends chunk
    rank-s to rank+1 and receives chunk rank-s-1 from rank-1: world-1 steps add what arrives
    (rank r then holds chunk r+1's sum), world-1 pass the sums round. 2(world-1)/world sent."""
    rank = dist.get_rank()
    world = dist.get_world_size()
    chunks = flat.tensor_split(world)
    buf = torch.empty_like(chunks[0])
    for s in range(2 * (world - 1)):
        send = chunks[(rank - s) % world]
        mine = chunks[(rank - s - 1) % world]
        reducing = s < world - 1  # the reduce-scatter, then the all-gather
        incoming = dist.irecv(buf if reducing else mine, (rank - 1) % world)  # posted first
        outgoing = dist.isend(send, (rank + 1) % world)
        incoming.wait()
        outgoing.wait()  # the chunk sent is not touched until it has left
        if reducing:
            mine += buf


def all_reduce_ring(model: nn.Module) -> None:
    world = dist.get_world_size()
    grads = [p.grad for p in model.parameters()]
    sizes = [g.numel() for g in grads]
    n = sum(sizes)
    flat = torch.zeros(math.ceil(n / world) * world)  # one buffer, `world` equal chunks
    torch.cat([g.flatten() for g in grads], out=flat[:n])
    flat[:n].div_(world)  # each rank's share first, as naive
    ring_sum(flat)
    for g, part in zip(grads, flat[:n].split(sizes)):
        g.copy_(part.view_as(g))


SYNCS = {"naive": all_reduce_naive, "ring": all_reduce_ring}


def main(args: argparse.Namespace) -> None:
    dist.init_process_group("gloo")  # rank, world and rendezvous from torchrun's variables
    rank = dist.get_rank()  # who am I,
    world = dist.get_world_size()  # among how many
    x = read_idx("train-images-idx3-ubyte.gz", 16).view(-1, 784).float()
    x = x.div_(255).sub_(0.1307).div_(0.3081)  # normalised as ddp_lab/data.py does
    y = read_idx("train-labels-idx1-ubyte.gz", 8).long()
    torch.manual_seed(args.seed)  # the same initial weights on every rank
    layers = OrderedDict(fc1=nn.Linear(784, 50), relu=nn.ReLU(), fc2=nn.Linear(50, 10))
    model = nn.Sequential(layers)  # the course notebook's MLP
    try:  # one fused update kernel, as ddp_lab's optim.fused=null picks it
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr, fused=True)
    except RuntimeError:  # torch < 2.4: no fused Adam on CPU, the per-tensor loop
        optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    sync = SYNCS[args.sync]
    for epoch in range(args.epochs):
        order = shard(epoch, rank, world, args.seed)
        starts = range(0, len(order), args.batch_size)  # batch_size samples per rank a step
        if args.max_steps:
            starts = starts[:args.max_steps]
        sync_s = 0.0
        for start in starts:
            idx = order[start:start + args.batch_size]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # this rank's gradients, from its own samples
            t0 = time.perf_counter()  # on CPU the sync is over when the call returns
            sync(model)
            sync_s += time.perf_counter() - t0
            optimizer.step()  # the same average on every rank: the same step
        ms = sync_s / len(starts) * 1e3
        print(f"[rank {rank}] epoch {epoch + 1}/{args.epochs}: loss {loss.item():.4f}, "
              f"sync ({args.sync}) {ms:.2f} ms/step", flush=True)
    if args.save and rank == 0:
        torch.save(model.state_dict(), args.save)
    dist.destroy_process_group()


def settings_of_run(run_dir: str) -> dict:
    """`python -m ddp_lab run.entry=ddp_lab.one_file`: the run folder's config.yaml decides."""
    with open(os.path.join(run_dir, "config.yaml")) as f:
        cfg = yaml.safe_load(f)
    train = cfg["train"]
    return dict(sync=cfg["sync"]["name"], seed=train["seed"], lr=train["lr"],
                batch_size=train["batch_size"], epochs=train["epochs"],
                max_steps=train["max_steps_per_epoch"] or 0,
                save=os.path.join(run_dir, "model.pt"))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="data-parallel MNIST in one file",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("run_dir", nargs="?", help="a ddp_lab run folder: its config decides")
    parser.add_argument("--sync", choices=list(SYNCS), default="ring", help="the all-reduce")
    parser.add_argument("--seed", type=int, default=0, help="the weights' and the shuffles'")
    parser.add_argument("--lr", type=float, default=1e-3, help="Adam's learning rate")
    parser.add_argument("--batch-size", type=int, default=64, help="samples per rank a step")
    parser.add_argument("--epochs", type=int, default=1, help="passes over the data")
    parser.add_argument("--max-steps", type=int, default=0, help="steps per epoch (0: all)")
    parser.add_argument("--save", default="", help="rank 0 saves the final weights here")
    args = parser.parse_args()
    if args.run_dir:  # the run's settings replace the flags'
        vars(args).update(settings_of_run(args.run_dir))
    if args.sync not in SYNCS:
        parser.error(f"sync={args.sync}: stop 0 has sync=naive and sync=ring")
    main(args)
