"""Stop 0: data-parallel training in one file (docs/tour.md).

    torchrun --nproc-per-node 2 -m ddp_lab.one_file --sync naive
"""
import argparse
import gzip
import math
import os
import time
from collections import OrderedDict

import torch
import torch.distributed as dist
from torch import nn

MNIST = os.path.join(os.path.dirname(__file__), "assets", "mnist")

def read_idx(name, header):
    """An IDX file: a header, then a byte a value."""
    with gzip.open(os.path.join(MNIST, name)) as f:
        data = bytearray(f.read())
    return torch.frombuffer(data, dtype=torch.uint8, offset=header)

def shard(epoch, rank, world, seed):
    """This rank's samples, as DistributedSampler deals them."""
    # one order on every rank, a new one each epoch
    g = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(60_000, generator=g)
    # as many for every rank: a few samples twice
    pad = math.ceil(len(order) / world) * world - len(order)
    return torch.cat([order, order[:pad]])[rank::world]

def all_reduce_naive(model):
    # one call, so one latency, a parameter
    for p in model.parameters():
        # each rank's share: then the sum is the mean
        p.grad /= dist.get_world_size()
        dist.all_reduce(p.grad)

def all_reduce_ring_textbook(flat):
    """Sums `flat` over the ranks in place. At step s rank r
    sends chunk r-s to r+1 and receives chunk r-s-1 from r-1:
    world-1 steps add what arrives, world-1 pass the sums on."""
    rank, world = dist.get_rank(), dist.get_world_size()
    left, right = (rank - 1) % world, (rank + 1) % world
    chunks = flat.tensor_split(world)
    buf = torch.empty_like(chunks[0])
    for s in range(2 * (world - 1)):
        mine = chunks[(rank - s - 1) % world]
        adding = s < world - 1
        # the receive first: the left rank's chunk lands at once
        incoming = dist.irecv(buf if adding else mine, left)
        outgoing = dist.isend(chunks[(rank - s) % world], right)
        incoming.wait()
        # a later step may write the chunk sent
        outgoing.wait()
        if adding:
            mine += buf

def sync_ring(model):
    world = dist.get_world_size()
    grads = [p.grad for p in model.parameters()]
    sizes = [g.numel() for g in grads]
    n = sum(sizes)
    # one buffer, padded to `world` equal chunks
    flat = torch.zeros(math.ceil(n / world) * world)
    flat[:n] = torch.cat([g.flatten() for g in grads]) / world
    all_reduce_ring_textbook(flat)
    for g, part in zip(grads, flat[:n].split(sizes)):
        g.copy_(part.view_as(g))

SYNCS = {"naive": all_reduce_naive, "ring": sync_ring}

def main(argv=None):
    args = parse(argv)
    # rank, world and rendezvous from torchrun's variables
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    x = read_idx("train-images-idx3-ubyte.gz", 16).view(-1, 784)
    # MNIST's mean and spread: inputs about 0 and 1
    x = x.float().div_(255).sub_(0.1307).div_(0.3081)
    y = read_idx("train-labels-idx1-ubyte.gz", 8).long()
    # the same initial weights on every rank
    torch.manual_seed(args.seed)
    model = nn.Sequential(OrderedDict(fc1=nn.Linear(784, 50),
                          relu=nn.ReLU(), fc2=nn.Linear(50, 10)))
    optimizer = torch.optim.Adam(
        model.parameters(), lr=args.lr, fused=args.fused)
    for epoch in range(args.epochs):
        order = shard(epoch, rank, world, args.seed)
        starts = range(0, len(order), args.batch_size)
        starts = starts[:args.max_steps or None]
        sync_s = 0.0
        for start in starts:
            idx = order[start:start + args.batch_size]
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            # on CPU the sync is over when the call returns
            t0 = time.perf_counter()
            SYNCS[args.sync](model)
            sync_s += time.perf_counter() - t0
            # the same mean on every rank: the same step
            optimizer.step()
        ms = sync_s / len(starts) * 1e3
        print(f"[rank {rank}] epoch {epoch + 1}/{args.epochs}: "
              f"loss {loss.item():.4f}, "
              f"sync ({args.sync}) {ms:.2f} ms/step", flush=True)
    if args.save and rank == 0:
        torch.save(model.state_dict(), args.save)
    dist.destroy_process_group()

def parse(argv=None):
    defaults = argparse.ArgumentDefaultsHelpFormatter
    p = argparse.ArgumentParser(formatter_class=defaults)
    flag = p.add_argument
    flag("--sync", default="ring", choices=SYNCS, help="all-reduce")
    flag("--seed", type=int, default=0, help="weights, shuffles")
    flag("--lr", type=float, default=1e-3, help="Adam's")
    flag("--batch-size", type=int, default=64, help="per rank")
    flag("--epochs", type=int, default=1, help="passes")
    flag("--max-steps", type=int, default=0, help="0: all")
    flag("--fused", action=argparse.BooleanOptionalAction,
         default=True, help="one-kernel Adam (CPU: torch >= 2.4)")
    flag("--save", default="", help="rank 0 saves weights here")
    return p.parse_args(argv)

if __name__ == "__main__":
    main()
