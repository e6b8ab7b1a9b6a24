"""Stop 0: all of data-parallel training in one file (docs/tour.md starts here).

    torchrun --nproc-per-node 2 -m ddp_lab.stop0 --sync naive --max-steps 50 --save w.pt
    python -m ddp_lab run.entry=ddp_lab.stop0 sync=ring   # the same, launched by ddp_lab

Each rank trains the same model on its own shard, then averages the gradients with the
others, so all take the same step. Seed, shards and sums are the framework's: the weights
equal `python -m ddp_lab sync=naive` and `sync=ring` bit for bit (tests/test_stop0.py).
"""
import argparse, gzip, os, time
from collections import OrderedDict

import torch, torch.distributed as dist, torch.nn.functional as F, yaml
from torch import nn


def read_idx(name: str, header: int) -> torch.Tensor:
    """The archive every data.root is fetched from: after a header, one uint8 per value."""
    with gzip.open(os.path.join(os.path.dirname(__file__), "assets", "mnist", name)) as f:
        return torch.frombuffer(bytearray(f.read()), dtype=torch.uint8, offset=header)


def shard(epoch: int, rank: int, world: int, seed: int) -> torch.Tensor:
    """This rank's samples, as DistributedSampler deals them: rank r takes r, r+world, ..."""
    g = torch.Generator()
    g.manual_seed(seed + epoch)
    order = torch.randperm(60_000, generator=g)
    return torch.cat([order, order[:-len(order) % world]])[rank::world]


def all_reduce_naive(model: nn.Module) -> None:
    world = dist.get_world_size()
    for p in model.parameters():  # one call, so one latency, per parameter
        p.grad /= world  # each rank's share first: then the sum is the average
        dist.all_reduce(p.grad)  # the sum over ranks, in place


def ring_sum(flat: torch.Tensor) -> None:
    """The textbook ring, in place: `flat` in `world` chunks; at step s each rank sends chunk
    rank-s to rank+1, receives chunk rank-s-1 from rank-1: world-1 steps add what arrives
    (rank r then holds chunk r+1's sum), world-1 copy it round. 2(world-1)/world sent."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = flat.tensor_split(world)
    buf = torch.empty_like(chunks[0])
    for s in range(2 * (world - 1)):
        mine, add = chunks[(rank - s - 1) % world], s < world - 1
        incoming = dist.irecv(buf if add else mine, (rank - 1) % world)  # posted first
        outgoing = dist.isend(chunks[(rank - s) % world], (rank + 1) % world)
        incoming.wait(), outgoing.wait()  # the chunk sent is not touched until it has left
        if add:
            mine += buf


def all_reduce_ring(model: nn.Module) -> None:
    grads, world = [p.grad for p in model.parameters()], dist.get_world_size()
    n = sum(g.numel() for g in grads)  # one buffer for all, padded to `world` equal chunks
    flat = torch.zeros(-(-n // world) * world)
    torch.cat([g.flatten() for g in grads], out=flat[:n]).div_(world)  # shares, as naive
    ring_sum(flat)
    for g, part in zip(grads, flat[:n].split([g.numel() for g in grads])):
        g.copy_(part.view_as(g))


def main(a: argparse.Namespace) -> None:
    dist.init_process_group("gloo")  # rank, world and rendezvous from torchrun's variables
    rank, world = dist.get_rank(), dist.get_world_size()  # who am I, among how many
    x = read_idx("train-images-idx3-ubyte.gz", 16).view(-1, 784).float()
    x = x.div_(255).sub_(0.1307).div_(0.3081)  # normalised as ddp_lab/data.py does
    y = read_idx("train-labels-idx1-ubyte.gz", 8).long()
    torch.manual_seed(a.seed)  # the same initial weights on every rank
    model = nn.Sequential(OrderedDict(fc1=nn.Linear(784, 50), relu=nn.ReLU(),
                                      fc2=nn.Linear(50, 10)))  # the notebook's MLP
    try:  # one fused update kernel, as ddp_lab's optim.fused=null picks it
        optimizer = torch.optim.Adam(model.parameters(), lr=a.lr, fused=True)
    except RuntimeError:  # torch < 2.4: no fused Adam on CPU, the per-tensor loop
        optimizer = torch.optim.Adam(model.parameters(), lr=a.lr)
    sync = {"naive": all_reduce_naive, "ring": all_reduce_ring}[a.sync]
    for epoch in range(a.epochs):
        order, sync_s = shard(epoch, rank, world, a.seed), 0.0
        steps = range(0, len(order), a.batch)[:a.max_steps or None]  # a.batch per rank
        for start in steps:
            idx = order[start:start + a.batch]
            loss = F.cross_entropy(model(x[idx]), y[idx])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # this rank's gradients, from its own samples
            t0 = time.perf_counter()  # on CPU the sync is over when the call returns
            sync(model)
            sync_s += time.perf_counter() - t0
            optimizer.step()  # the same average on every rank: the same step
        print(f"[rank {rank}] epoch {epoch}: loss {loss.item():.4f}, "
              f"sync ({a.sync}) {sync_s / len(steps) * 1e3:.2f} ms/step", flush=True)
    if a.save and rank == 0:
        torch.save(model.state_dict(), a.save)
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="data-parallel MNIST in one file")
    p.add_argument("run_dir", nargs="?", help="a ddp_lab run folder: its config.yaml decides")
    p.add_argument("--sync", choices=["naive", "ring"], default="ring")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=0, help="steps per epoch (0: all)")
    p.add_argument("--save", default="", help="rank 0 saves the final weights here")
    a = p.parse_args(namespace=argparse.Namespace(seed=0, lr=1e-3, batch=64))
    if a.run_dir:  # `python -m ddp_lab run.entry=ddp_lab.stop0`: the run's own settings
        cfg = yaml.safe_load(open(os.path.join(a.run_dir, "config.yaml")))
        t, a.sync, a.save = cfg["train"], cfg["sync"]["name"], os.path.join(a.run_dir, "model.pt")
        a.epochs, a.max_steps, a.seed, a.lr, a.batch = (
            t["epochs"], t["max_steps_per_epoch"], t["seed"], t["lr"], t["batch_size"])
        assert a.sync in ("naive", "ring"), f"sync={a.sync}: stop 0 has naive and ring"
    main(a)
