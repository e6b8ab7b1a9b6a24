"""MNIST: the guarded fetch (a real HTTP download race), integrity checks, sharding."""

from __future__ import annotations

import gzip
import hashlib
import http.server
import shutil
import threading
from pathlib import Path

import pytest
import torch
from torch.utils.data import DistributedSampler

from ddp_lab.data import TensorShards, load_split, normalise, shard_indices
from ddp_lab.data_fetch import (EMBEDDED, RESOURCES, DataError, fetch_mnist, idx_is_valid,
                                prepare_mnist, raw_folder)
from ddp_lab.world.distributed import DistContext
from ddp_lab.world.env import DistEnv
from helpers import run_world


def test_embedded_copy_matches_torchvision_resources():
    from torchvision.datasets import MNIST

    assert [(n, m) for n, m in MNIST.resources] == RESOURCES
    for name, md5 in RESOURCES:
        assert hashlib.md5((EMBEDDED / name).read_bytes()).hexdigest() == md5
    assert "CC BY-SA" in (EMBEDDED / "README.md").read_text()


@pytest.fixture(scope="module")
def mnist_root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mnist")
    assert fetch_mnist(root, ["embedded"]) == 4
    return root


def test_fetch_from_embedded_then_read_as_torchvision_reads_it(mnist_root):
    from torchvision.datasets import MNIST

    for train, n in ((True, 60000), (False, 10000)):
        x, y = load_split(mnist_root, train=train)
        assert x.shape == (n, 28, 28) and x.dtype == torch.uint8 and y.shape == (n,)
        ds = MNIST(str(mnist_root), train=train, download=False)  # the reference reader
        assert torch.equal(x, ds.data) and torch.equal(y, ds.targets) and y.dtype == ds.targets.dtype
    assert fetch_mnist(mnist_root, ["embedded"]) == 0  # already there: nothing fetched


def test_an_idx_file_whose_size_disagrees_with_its_header_is_refused(mnist_root, tmp_path):
    root = tmp_path / "copy"
    shutil.copytree(mnist_root, root)
    labels = root / "MNIST" / "raw" / "t10k-labels-idx1-ubyte"
    labels.write_bytes(labels.read_bytes()[:-3])
    with pytest.raises(DataError, match="t10k-labels-idx1-ubyte holds 10005 bytes, its header says 10008"):
        load_split(root, train=False)


def test_corrupt_archive_is_never_left_looking_valid(tmp_path):
    raw = raw_folder(tmp_path)
    raw.mkdir(parents=True)
    bad = raw / "train-labels-idx1-ubyte.gz"
    bad.write_bytes(b"\x1f\x8b truncated")
    mirror = tmp_path / "mirror"  # has every file but the corrupt one
    mirror.mkdir()
    for name, _ in RESOURCES:
        if name != bad.name:
            shutil.copy(EMBEDDED / name, mirror / name)
    with pytest.raises(DataError, match="could not fetch train-labels-idx1-ubyte.gz") as e:
        fetch_mnist(tmp_path, [str(mirror)])
    assert "data.mirrors" in str(e.value)  # the fix is named
    assert not bad.exists() and (raw / "train-labels-idx1-ubyte.gz.corrupt").exists()
    assert not (raw / "train-labels-idx1-ubyte").exists()
    assert not list(raw.glob(".*partial*"))


def test_corrupt_archive_is_refetched(tmp_path):
    raw = raw_folder(tmp_path)
    raw.mkdir(parents=True)
    (raw / "t10k-labels-idx1-ubyte.gz").write_bytes(b"garbage")
    fetch_mnist(tmp_path, ["embedded"])
    assert idx_is_valid(raw / "t10k-labels-idx1-ubyte")


def test_truncated_extracted_file_is_detected_and_rebuilt(tmp_path):
    fetch_mnist(tmp_path, ["embedded"])
    f = raw_folder(tmp_path) / "t10k-images-idx3-ubyte"
    f.write_bytes(f.read_bytes()[:1000])  # a crash half-way through an extraction
    assert not idx_is_valid(f)
    fetch_mnist(tmp_path, ["embedded"])
    assert idx_is_valid(f)


def test_mirror_serving_a_wrong_file_names_it(tmp_path):
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for name, _ in RESOURCES:
        shutil.copy(EMBEDDED / name, mirror / name)
    with gzip.open(mirror / "t10k-labels-idx1-ubyte.gz", "wb") as f:
        f.write(b"\0" * 100)
    with pytest.raises(DataError, match=r"t10k-labels-idx1-ubyte.gz from .*MD5"):
        fetch_mnist(tmp_path / "root", [str(mirror)])
    assert not (raw_folder(tmp_path / "root") / "t10k-labels-idx1-ubyte.gz").exists()


# ----------------------------------------------------------- the download race
class _CountingHandler(http.server.SimpleHTTPRequestHandler):
    requests: list[str] = []

    def do_GET(self):  # noqa: N802
        type(self).requests.append(self.path)
        super().do_GET()

    def log_message(self, *args):
        pass


@pytest.fixture
def http_mirror():
    handler = type("H", (_CountingHandler,), {"requests": []})
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), lambda *a, **k: handler(*a, directory=str(EMBEDDED), **k))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", handler.requests
    server.shutdown()
    server.server_close()


def _ctx(env: DistEnv) -> DistContext:
    return DistContext(env=env, backend="gloo", device=torch.device("cpu"))


def _race(rank, world, root, mirror, node_local, local_world):
    env = DistEnv(rank=rank, local_rank=rank % local_world, world_size=world,
                  local_world_size=local_world, node_rank=rank // local_world,
                  num_nodes=world // local_world, master_addr="127.0.0.1", master_port=1,
                  source="test")
    node_root = Path(root) / (f"node{env.node_rank}" if node_local else "shared")
    prepare_mnist(node_root, [mirror], _ctx(env), node_local=node_local)
    x, y = load_split(node_root, train=True)
    tx, _ = load_split(node_root, train=False)
    digest = hashlib.sha256(x.numpy().tobytes() + y.numpy().tobytes() + tx.numpy().tobytes())
    return digest.hexdigest()


@pytest.mark.dist
def test_download_race_shared_root_one_download(tmp_path, http_mirror):
    url, requests = http_mirror
    digests = run_world(_race, 3, str(tmp_path), url, False, 3)
    assert sorted(requests) == sorted("/" + n for n, _ in RESOURCES)  # exactly one download
    assert len(set(digests)) == 1  # identical data on every rank


@pytest.mark.dist
def test_download_race_node_local_one_download_per_node(tmp_path, http_mirror):
    url, requests = http_mirror
    # 4 ranks as 2 "nodes" x 2, each node with its own root
    digests = run_world(_race, 4, str(tmp_path), url, True, 2)
    assert sorted(requests) == sorted(["/" + n for n, _ in RESOURCES] * 2)
    assert len(set(digests)) == 1


def _failing_fetch(rank, world, root):
    env = DistEnv(rank, rank, world, world, 0, 1, "127.0.0.1", 1, "test")
    try:
        prepare_mnist(root, ["http://127.0.0.1:9/"], _ctx(env), node_local=False)
    except DataError as e:
        return str(e)
    return "no error"


@pytest.mark.dist
def test_failed_fetch_fails_every_rank_without_hanging(tmp_path):
    messages = run_world(_failing_fetch, 3, str(tmp_path), timeout=90)
    assert "could not fetch" in messages[0]
    assert all("rank 0 failed to prepare MNIST" in m for m in messages[1:])
    assert not any(raw_folder(tmp_path).glob("*.gz"))


# ------------------------------------------------------------------ sharding
@pytest.mark.parametrize("n,world", [(60000, 2), (10, 3), (7, 4), (5, 1), (3, 5)])
@pytest.mark.parametrize("epoch", [0, 3])
def test_shards_match_distributed_sampler(n, world, epoch):
    for rank in range(world):
        sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=True, seed=7)
        sampler.set_epoch(epoch)
        assert shard_indices(n, world, rank, epoch, seed=7).tolist() == list(sampler)


def test_shards_are_disjoint_cover_and_reshuffle():
    n, world = 1000, 3
    shards = [shard_indices(n, world, r, 0, seed=1) for r in range(world)]
    allidx = torch.cat(shards)
    assert set(allidx.tolist()) == set(range(n))
    assert len(allidx) - len(set(allidx.tolist())) == 2  # padded by wrap-around to 3 x 334
    assert not torch.equal(shard_indices(n, world, 0, 1, seed=1), shards[0])  # new epoch
    assert torch.equal(shard_indices(n, world, 0, 0, seed=1), shards[0])  # same seed: same


def test_tensor_pipeline_yields_the_dataloader_batches(mnist_root):
    """The fast path and the classic DataLoader + DistributedSampler path agree."""
    from omegaconf import OmegaConf

    from ddp_lab.data import _dataloader

    x, y = load_split(mnist_root, train=True)
    data_cfg = OmegaConf.create({"root": str(mnist_root), "normalize": True, "num_workers": 0})
    train_cfg = OmegaConf.create({"batch_size": 64, "seed": 3})
    env = DistEnv(1, 1, 2, 2, 0, 1, "127.0.0.1", 1, "test")
    fast = TensorShards(normalise(x), y, 64, 2, 1, seed=3)
    slow = _dataloader(data_cfg, train_cfg, 64, env, torch.device("cpu"))
    for epoch in (0, 1):
        fast.set_epoch(epoch)
        slow.set_epoch(epoch)
        assert len(fast) == len(slow) == 469
        for i, ((fx, fy), (sx, sy)) in enumerate(zip(fast, slow)):
            assert torch.equal(fy, sy)
            torch.testing.assert_close(fx, sx, rtol=0, atol=1e-5)
            if i == 20:
                break


@pytest.mark.parametrize("n", [60000, 1000])
def test_a_global_batch_is_the_same_samples_on_every_world_size(n):
    """Strong scaling (train.global_batch): with a per-rank batch of global/world, the ranks
    of step s together hold positions [s*global, (s+1)*global) of the epoch's permutation,
    whatever the world size, in both pipelines (TensorShards; DataLoader batches of the
    DistributedSampler's indices)."""
    from torch.utils.data import DataLoader

    global_batch, epoch, seed = 64, 2, 5
    x = torch.arange(n)
    steps = {}
    for world in (1, 2, 4):
        per_rank = global_batch // world
        tensor = [TensorShards(x, x, per_rank, world, r, seed, epoch=epoch) for r in range(world)]
        samplers = [DistributedSampler(range(n), num_replicas=world, rank=r, shuffle=True, seed=seed)
                    for r in range(world)]
        for s in samplers:
            s.set_epoch(epoch)
        loaders = [DataLoader(range(n), batch_size=per_rank, sampler=s) for s in samplers]
        assert len({len(t) for t in tensor} | {len(dl) for dl in loaders}) == 1
        for name, pipes in (("tensor", [iter(t) for t in tensor]),
                            ("dataloader", [iter(dl) for dl in loaders])):
            got = []
            for step in range(len(tensor[0])):
                batches = [next(p) for p in pipes]
                ids = [b[0] if isinstance(b, tuple) else b for b in batches]
                got.append(sorted(torch.cat(ids).tolist()))
            steps[world, name] = got
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch)).tolist()
    want = [sorted(perm[i:i + global_batch]) for i in range(0, n, global_batch)]
    for key, got in steps.items():
        assert got == want, key
