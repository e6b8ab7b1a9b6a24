"""sync=hierarchical on real gloo worlds: the same weights as DDP, the bytes the cost model
says, rank by rank, and the bytes that cross nodes counted at the sends themselves.

4 ranks as 2 nodes of 2 (sync.node_size=2), 6 ranks as 2 nodes of 3 and as 3 nodes of 2,
and 4 ranks on two *launcher* nodes of unequal size (3 + 1, torchrun's GROUP_RANK /
LOCAL_WORLD_SIZE as a real launcher sets them). Every rank also trains the same steps with
DDP in the same process; each hierarchical variant must end with DDP's parameters (within
1e-6) and with bitwise identical parameters on every rank. Each send is counted by its
destination (helpers.count_p2p_bytes), so "bytes to another node" is measured, not
derived: it must equal what the synchroniser recorded and ddp_lab.predict.costmodel's formula.
The loopback SLURM cluster (2 nodes x 2 ranks, the trainer end to end) is
tests/test_hierarchical_slurm.py.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from ddp_lab.predict import costmodel
from ddp_lab.collectives import ALL_REDUCE, REDUCE
from ddp_lab.config import CONF_DIR, SCHEMAS
from ddp_lab.models import MLP
from ddp_lab.config import check_sync
from ddp_lab.sync import build_sync
from ddp_lab.sync.hierarchical import HierarchicalSync

from helpers import count_p2p_bytes, run_cli, run_world

STEPS, BATCH, HIDDEN, LR, MOMENTUM = 4, 8, 16, 0.1, 0.9
SMALL_BUCKET_MB = 0.004  # two buckets: fc1.weight alone, then the rest
ATOL, RTOL = 1e-6, 1e-5

# (label, overrides, launcher nodes as GROUP_RANK per rank or None)
VARIANTS = {
    4: [
        ("k2", {"node_size": 2}, None),  # defaults: intra=library, inter=ring (preposted)
        ("k2_tree", {"node_size": 2, "intra": "tree"}, None),  # every byte ours: exact
        ("k2_library", {"node_size": 2, "inter": "library"}, None),
        ("k2_no_prepost", {"node_size": 2, "intra": "tree", "prepost": False}, None),
        ("k2_per_param", {"node_size": 2, "intra": "tree", "bucket_mb": 0}, None),
        ("env_3_1", {"intra": "tree"}, [0, 0, 0, 1]),  # the launcher's nodes, unequal
    ],
    6: [
        ("k3_tree", {"node_size": 3, "intra": "tree"}, None),
        ("k2", {"node_size": 2}, None),  # three leaders: a real ring among them
        ("k2_tree", {"node_size": 2, "intra": "tree"}, None),
    ],
}


class NoBroadcastSync(HierarchicalSync):
    """Broken on purpose: the leaders' result never reaches the rest of their node."""

    def all_reduce(self, flat):
        REDUCE[self.intra_algo](flat, self.leader, group=self.node_group)
        if self.is_leader:
            ALL_REDUCE[self.inter_algo](flat, group=self.leader_group)


def sync_cfg(name: str, **overrides):
    raw = OmegaConf.load(CONF_DIR / "sync" / f"{name}.yaml")
    raw.pop("defaults", None)
    return OmegaConf.merge(OmegaConf.structured(SCHEMAS["sync"][name]), raw, overrides)


def global_batches(world: int):
    g = torch.Generator().manual_seed(1234)
    return (torch.randn(STEPS, world * BATCH, 784, generator=g),
            torch.randint(0, 10, (STEPS, world * BATCH), generator=g))


class launcher_nodes:
    """torchrun's variables for node `nodes[rank]` (GROUP_RANK, LOCAL_*), as on a real
    multi-node launch, while the synchroniser reads them (ddp_lab.world.env.detect_env)."""

    KEYS = ("GROUP_RANK", "GROUP_WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")

    def __init__(self, nodes, rank):
        self.nodes, self.rank = nodes, rank

    def __enter__(self):
        self.saved = {k: os.environ.get(k) for k in self.KEYS}
        if self.nodes is not None:
            mine = [r for r, n in enumerate(self.nodes) if n == self.nodes[self.rank]]
            os.environ.update(GROUP_RANK=str(self.nodes[self.rank]),
                              GROUP_WORLD_SIZE=str(len(set(self.nodes))),
                              LOCAL_RANK=str(mine.index(self.rank)),
                              LOCAL_WORLD_SIZE=str(len(mine)))

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _train(syncer, model, rank, xs, ys):
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for k in range(STEPS):
        x, y = xs[k, rank * BATCH:(rank + 1) * BATCH], ys[k, rank * BATCH:(rank + 1) * BATCH]
        opt.zero_grad(set_to_none=True)
        F.cross_entropy(syncer.wrapped(x), y).backward()
        syncer.sync()
        syncer.step(opt)


def _worker(rank: int, world: int) -> dict:
    torch.set_num_threads(1)
    xs, ys = global_batches(world)
    counter = {"sent": 0, "recv": 0, "to": {}}
    count_p2p_bytes(counter)
    out = {}
    runs = [("ddp", "ddp", {"bucket_cap_mb": SMALL_BUCKET_MB}, None)]
    runs += [(label, "hierarchical", {"bucket_mb": SMALL_BUCKET_MB, **ov}, nodes)
             for label, ov, nodes in VARIANTS[world]]
    runs += [("broken_no_broadcast", "hierarchical", {"bucket_mb": SMALL_BUCKET_MB, "node_size": 2},
              None)]
    for label, name, overrides, nodes in runs:
        torch.manual_seed(0)
        model = MLP(hidden=HIDDEN)
        cls = NoBroadcastSync if label.startswith("broken") else None
        with launcher_nodes(nodes, rank):
            cfg = sync_cfg(name, **overrides)
            syncer = (cls(cfg, model, torch.device("cpu"), world) if cls
                      else build_sync(cfg, model, torch.device("cpu"), world))
        counter.update(sent=0, recv=0, to={})
        _train(syncer, model, rank, xs, ys)
        comm = syncer.collect_comm()
        counted = dict(counter, to=dict(counter["to"]))
        syncer.close()
        rec = {"params": [p.detach().numpy().copy() for p in model.parameters()],
               "sent": comm.bytes_sent, "recv": comm.bytes_recv, "calls": comm.calls,
               "payload": comm.payload_bytes, "cross": comm.bytes_cross_node,
               "counted": counted, "exact": syncer.bytes_exact,
               "grad_bytes": sum(p.numel() * p.element_size() for p in model.parameters())}
        if name == "hierarchical":
            rec.update(nodes=syncer.topology.nodes, leader=syncer.leader, rings=len(syncer.rings),
                       wire=([p.numel() for p in syncer.params] if syncer.per_param
                             else [b.buffer.numel() for b in syncer.buckets]),
                       intra=syncer.intra_algo, inter=syncer.inter_algo)
        out[label] = rec
    return out


@pytest.fixture(scope="module", params=[4, pytest.param(6, marks=pytest.mark.slow)],
                ids=lambda w: f"world{w}")
def world_run(request):
    world = request.param
    return world, run_world(_worker, world, timeout=240)


def _params(rec):
    return [torch.from_numpy(a) for a in rec["params"]]


@pytest.mark.dist
def test_weights_equal_ddps_and_every_rank_holds_the_same(world_run):
    world, results = world_run
    ddp = _params(results[0]["ddp"])
    for label, _, _ in VARIANTS[world]:
        mine = [_params(r[label]) for r in results]
        for rank, params in enumerate(mine):
            diff = max((a - b).abs().max().item() for a, b in zip(params, ddp))
            assert all(torch.allclose(a, b, rtol=RTOL, atol=ATOL) for a, b in zip(params, ddp)), \
                f"{label} rank {rank}: {diff:.3g} from DDP's weights"
            # the broadcast hands every rank its leader's bits, the leaders' ring agrees bitwise
            assert all(torch.equal(a, b) for a, b in zip(params, mine[0])), (label, rank)


@pytest.mark.dist
def test_a_hierarchy_without_its_broadcast_fails_that_check(world_run):
    """Negative control: non-leaders keep their own (partial) gradients, the check sees it."""
    _, results = world_run
    ddp = _params(results[0]["ddp"])
    for rank, r in enumerate(results):
        if rank != r["broken_no_broadcast"]["leader"]:
            params = _params(r["broken_no_broadcast"])
            assert not all(torch.allclose(a, b, rtol=RTOL, atol=ATOL) for a, b in zip(params, ddp))


@pytest.mark.dist
def test_nodes_come_from_node_size_or_the_launcher(world_run):
    world, results = world_run
    expected = {(4, "k2"): ((0, 1), (2, 3)), (4, "env_3_1"): ((0, 1, 2), (3,)),
                (6, "k3_tree"): ((0, 1, 2), (3, 4, 5)), (6, "k2"): ((0, 1), (2, 3), (4, 5))}
    for (w, label), nodes in expected.items():
        if w == world:
            for rank, r in enumerate(results):
                assert r[label]["nodes"] == nodes
                assert r[label]["leader"] == next(n[0] for n in nodes if rank in n)
    # on gloo the leaders' ring preposts (one plan per bucket), the others have none
    for rank, r in enumerate(results):
        rec = r["k2_tree" if world == 6 else "k2"]
        assert rec["rings"] == (len(rec["wire"]) if rank == rec["leader"] else 0)
        if world == 4:
            assert r["k2_no_prepost"]["rings"] == r["k2_library"]["rings"] == 0


@pytest.mark.dist
def test_bytes_per_rank_are_the_cost_models(world_run):
    world, results = world_run
    for label, _, _ in VARIANTS[world]:
        for rank, r in enumerate(results):
            rec = r[label]
            calls = [costmodel.hierarchical_calls(n, rec["nodes"], 4, intra=rec["intra"],
                                                  inter=rec["inter"]) for n in rec["wire"]]
            assert rec["calls"] == len(rec["wire"]) * STEPS
            assert rec["payload"] == rec["grad_bytes"] * STEPS
            assert rec["sent"] == STEPS * sum(c.sent[rank] for bucket in calls for _, c in bucket)
            assert rec["recv"] == STEPS * sum(c.recv[rank] for bucket in calls for _, c in bucket)
            cross = STEPS * sum(costmodel.cross_node_sent(n, rec["nodes"], 4, intra=rec["intra"],
                                                          inter=rec["inter"])[rank]
                                for n in rec["wire"])
            assert rec["cross"] == cross, (label, rank)
            assert (cross > 0) == (rank == rec["leader"]), (label, rank)  # leaders only
            assert rec["exact"] == (rec["intra"] == "tree" and rec["inter"] == "ring")
            if rec["exact"]:  # every byte went through our send/recv: the count is the model
                assert (rec["sent"], rec["recv"]) == (
                    rec["counted"]["sent"], rec["counted"]["recv"]), (label, rank)
            if rec["inter"] == "ring":  # sends by destination: what left the node, measured
                node = next(n for n in rec["nodes"] if rank in n)
                off_node = sum(b for dst, b in rec["counted"]["to"].items() if dst not in node)
                assert off_node == rec["cross"], (label, rank)
        # by hand: a ring on L leaders sends 2(L-1) buffers in all, whatever the chunking
        rec = results[0][label]
        leaders = len(rec["nodes"])
        total = sum(r[label]["cross"] for r in results)
        assert total == 2 * (leaders - 1) * rec["grad_bytes"] * STEPS, label
    exact = [label for label, _, _ in VARIANTS[world] if results[0][label]["exact"]]
    assert exact  # the counted comparison above ran


# ------------------------------------------------------------ the cost model by hand
def test_hierarchical_cost_by_hand():
    m, nodes = 1000 * 4, ((0, 1, 2), (3, 4, 5))
    (c1, red), (c2, lead), (c3, bcast) = costmodel.hierarchical_calls(
        1000, nodes, 4, intra="tree", inter="ring")
    assert (c1, c2, c3) == ("reduce", "all_reduce", "broadcast")
    # binomial tree on 3 ranks: the leader is the parent of both others
    assert red.sent == (0, m, m, 0, m, m) and red.recv == (2 * m, 0, 0, 2 * m, 0, 0)
    assert bcast.sent == red.recv and bcast.recv == red.sent
    # a ring of 2 leaders: each sends (and receives) the whole buffer once, to the other node
    assert lead.sent == lead.recv == (m, 0, 0, m, 0, 0)
    assert costmodel.cross_node_sent(1000, nodes, 4, intra="tree", inter="ring") == lead.sent
    assert (red.steps, lead.steps, bcast.steps) == (2, 2, 2) and red.exact and lead.exact
    # the library's phases are modelled, not exact; 3 leaders: uneven ring chunks 334/333/333
    _, (_, lead3), _ = costmodel.hierarchical_calls(1000, ((0, 1), (2, 3), (4, 5)), 4)
    assert lead3.sent == (4 * (2000 - 333 - 333), 0, 4 * (2000 - 333 - 334), 0,
                          4 * (2000 - 334 - 333), 0)
    assert sum(lead3.sent) == 2 * 2 * m  # 2(L-1) buffers cross nodes in all
    assert not costmodel.hierarchical_calls(1000, nodes, 4)[0][1].exact  # library reduce
    with pytest.raises(ValueError, match="do not hold every rank"):
        costmodel.hierarchical_calls(10, ((0, 1), (3,)), 4)
    with pytest.raises(ValueError, match="leader"):
        costmodel.hierarchical_calls(10, ((1, 0), (2,)), 4)


# ------------------------------------------------------------ configurations refused
@pytest.mark.parametrize("overrides,world,message", [
    ({"node_size": 3}, 4, ("sync.node_size=3: must divide the world of 4 ranks into equal "
                           "nodes: use one of 1, 2, 4, or 0 for the launcher's nodes")),
    ({"node_size": -1}, 4, "sync.node_size=-1"),
    ({"inter": "tree"}, 4, "sync.inter=tree: choose ring or library"),
    ({"intra": "ring"}, 4, "sync.intra=ring: choose library or tree"),
    ({"bucket_mb": -1}, 4, "sync.bucket_mb=-1.0: must be >= 0"),
])
def test_bad_hierarchical_config_is_refused(overrides, world, message):
    with pytest.raises(ValueError) as e:
        check_sync(sync_cfg("hierarchical", **overrides), world)
    assert message in str(e.value)


def test_cli_node_size_not_dividing_the_world_is_one_line(tmp_path):
    p = run_cli("sync=hierarchical", "sync.node_size=3", "launcher.nproc_per_node=4",
                cwd=tmp_path, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert ("error: sync.node_size=3: must divide the world of 4 ranks into equal nodes: use "
            "one of 1, 2, 4, or 0 for the launcher's nodes") in p.stderr
    assert "Traceback" not in p.stdout + p.stderr
    assert not (tmp_path / "outputs").exists()  # refused before any run folder or process
