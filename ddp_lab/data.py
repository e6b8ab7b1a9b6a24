"""MNIST: the idx files read into tensors, then fast on-device shards.

The files are fetched and verified before any rank reads them
(`prepare_mnist`, in data_fetch.py: one fetcher per shared root, MD5s
checked at every start).

Batches: `TensorShards` holds a whole split as one normalised tensor on
the training device and reads each rank's shard with
DistributedSampler's semantics (same permutation on every rank for a
seed and epoch, disjoint strided shards, padded to equal length).
`data.pipeline=dataloader` keeps the classic per-sample DataLoader to
compare against.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch
from torch.utils.data import DataLoader, DistributedSampler

from .config import DataConfig, TrainConfig, batch_plan
from .data_fetch import DataError, raw_folder
from .world.env import DistEnv

MEAN, STD = 0.1307, 0.3081


def read_idx(path: Path) -> torch.Tensor:
    """One idx file (MNIST's format: a magic number whose 4th byte is
    the number of dimensions, the 3rd the type, 0x08 = uint8; then each
    dimension as a big-endian int32; then the values) as a uint8 tensor
    of those dimensions."""
    data = path.read_bytes()
    ndim = data[3]
    if data[:3] != b"\x00\x00\x08" or len(data) < 4 + 4 * ndim:
        raise DataError(
            f"{path} is not an idx file of uint8 values "
            f"(fix: delete {path.parent} and run again)"
        )
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    if len(data) != 4 + 4 * ndim + math.prod(dims):
        raise DataError(
            f"{path} holds {len(data)} bytes, its header says "
            f"{4 + 4 * ndim + math.prod(dims)} (fix: delete {path.parent} and run again)"
        )
    return torch.frombuffer(
        bytearray(data), dtype=torch.uint8, offset=4 + 4 * ndim
    ).view(dims)


def load_split(
    root: str | Path, train: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(images uint8 [N,28,28], labels int64 [N]): the extracted idx
    files, read directly. (torchvision.datasets.MNIST reads the same
    bytes into the same tensors, but importing torchvision pulls in
    torch._dynamo and sympy: about 2 s more start-up on every rank.)"""
    prefix = "train" if train else "t10k"
    raw = raw_folder(root)
    try:
        images = read_idx(raw / f"{prefix}-images-idx3-ubyte")
        labels = read_idx(raw / f"{prefix}-labels-idx1-ubyte").long()
    except OSError as e:
        raise DataError(
            f"cannot read MNIST from {raw}: {e} "
            f"(fix: delete {raw} and run again)"
        ) from None
    if len(images) != len(labels):
        raise DataError(
            f"{raw}: {len(images)} {prefix} images but {len(labels)} labels "
            f"(fix: delete {raw} and run again)"
        )
    return images, labels


def normalise(images: torch.Tensor, standardise: bool = True) -> torch.Tensor:
    # [N,1,28,28] in [0, 1], like ToTensor; standardised (data.normalize)
    # to MNIST's mean and standard deviation
    x = images.to(torch.float32).div_(255.0).unsqueeze(1)
    return x.sub_(MEAN).div_(STD) if standardise else x


def shard_indices(
    n: int,
    world_size: int,
    rank: int,
    epoch: int,
    seed: int,
    shuffle: bool = True,
    device: torch.device | None = None,
) -> torch.Tensor:
    """This rank's sample indices for an epoch, exactly as
    DistributedSampler orders them (drop_last=False: padded by wrapping
    around so every rank gets ceil(n/world) samples)."""
    if shuffle:
        g = torch.Generator()
        g.manual_seed(seed + epoch)
        indices = torch.randperm(n, generator=g)
    else:
        indices = torch.arange(n)
    per_rank = math.ceil(n / world_size)
    total = per_rank * world_size
    if total > n:
        reps = math.ceil((total - n) / n)
        indices = torch.cat([indices] + [indices] * reps)[:total]
    return indices[rank:total:world_size].to(device or "cpu")


@dataclass
class TensorShards:
    """A whole split resident on the device; batches are index_select'ed
    slices."""

    x: torch.Tensor
    y: torch.Tensor
    batch_size: int
    world_size: int
    rank: int
    seed: int
    shuffle: bool = True
    epoch: int = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return math.ceil(
            math.ceil(len(self.x) / self.world_size) / self.batch_size
        )

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return self.iter_from(0)

    def iter_from(
        self, batch: int
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The epoch's batches from batch number `batch` on (a run
        resumed mid-epoch)."""
        idx = shard_indices(
            len(self.x),
            self.world_size,
            self.rank,
            self.epoch,
            self.seed,
            self.shuffle,
            self.x.device,
        )
        for start in range(batch * self.batch_size, len(idx), self.batch_size):
            b = idx[start : start + self.batch_size]
            yield self.x.index_select(0, b), self.y.index_select(0, b)


@dataclass
class Splits:
    # TensorShards or DataLoader: iterable of (x, y) with set_epoch
    train: object
    # this rank's disjoint share of the test set (no padding)
    test_x: torch.Tensor
    test_y: torch.Tensor


def build_splits(
    data_cfg: DataConfig,
    train_cfg: TrainConfig,
    env: DistEnv,
    device: torch.device,
) -> Splits:
    """The test share and the training batches of this rank. A training
    batch holds the per-rank batch of `config.batch_plan`: with
    train.global_batch (strong scaling) that is global_batch / world,
    and because shards are strided (rank r takes positions r, r+w, ...
    of the epoch's permutation, in both pipelines) step s of every world
    size trains on the same samples, positions [s*global_batch,
    (s+1)*global_batch)."""
    root = data_cfg.root
    batch_size = batch_plan(train_cfg, env.world_size).per_rank
    tx, ty = load_split(root, train=False)
    # evaluation: a strided, unpadded split so each test sample is
    # counted exactly once
    test_x = normalise(tx[env.rank :: env.world_size], data_cfg.normalize).to(
        device
    )
    test_y = ty[env.rank :: env.world_size].to(device)
    if data_cfg.pipeline == "tensor":
        x, y = load_split(root, train=True)
        train = TensorShards(
            normalise(x, data_cfg.normalize).to(device),
            y.to(device),
            batch_size,
            env.world_size,
            env.rank,
            train_cfg.seed,
        )
    elif data_cfg.pipeline == "dataloader":
        train = _dataloader(data_cfg, train_cfg, batch_size, env, device)
    else:
        raise ValueError(
            f"data.pipeline={data_cfg.pipeline!r}: choose tensor or dataloader"
        )
    return Splits(train=train, test_x=test_x, test_y=test_y)


class _DeviceLoader:
    """A DataLoader whose batches land on the device, with set_epoch
    passed through."""

    def __init__(self, loader, sampler, device):
        self.loader, self.sampler, self.device = loader, sampler, device

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        return self.iter_from(0)

    def iter_from(self, batch: int):
        """The epoch's batches from batch number `batch` on: the
        sampler's order is a function of (seed, epoch), so skipping the
        first indices resumes it exactly."""
        nb = self.device.type == "cuda"
        loader = self.loader
        if batch:
            indices = list(self.sampler)[batch * self.loader.batch_size :]
            loader = DataLoader(
                self.loader.dataset,
                batch_size=self.loader.batch_size,
                sampler=indices,
                num_workers=self.loader.num_workers,
                pin_memory=self.loader.pin_memory,
            )
        for x, y in loader:
            yield x.to(self.device, non_blocking=nb), y.to(
                self.device, non_blocking=nb
            )


def _dataloader(
    data_cfg: DataConfig,
    train_cfg: TrainConfig,
    batch_size: int,
    env: DistEnv,
    device: torch.device,
):
    # lazy: see load_split
    from torchvision import transforms
    from torchvision.datasets import MNIST

    tf = [transforms.ToTensor()]
    if data_cfg.normalize:
        tf.append(transforms.Normalize((MEAN,), (STD,)))
    ds = MNIST(
        data_cfg.root,
        train=True,
        download=False,
        transform=transforms.Compose(tf),
    )
    sampler = DistributedSampler(
        ds,
        num_replicas=env.world_size,
        rank=env.rank,
        shuffle=True,
        seed=train_cfg.seed,
    )
    loader = DataLoader(
        ds,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=data_cfg.num_workers,
        pin_memory=device.type == "cuda",
        persistent_workers=data_cfg.num_workers > 0,
    )
    return _DeviceLoader(loader, sampler, device)
