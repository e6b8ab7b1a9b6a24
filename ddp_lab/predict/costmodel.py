"""The one cost model: bytes per rank, latency steps and busbw factor of every collective.
Synchronisers record their traffic with it, the bench and the report take their busbw factors and
alpha-beta predictions from it; nothing else computes a cost (docs/collectives.md, "Algorithms and
alpha-beta costs"; the fit: docs/report.md). `"torch"`, the library's collective, is modelled
(`exact` false) on what gloo runs (all_reduce, all_gather, reduce_scatter: the ideal ring;
broadcast: the binomial tree; reduce: a ring reduce-scatter, then a gather to the root). With it,
the small arithmetic the collectives, the clocks and the report share. No torch.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace
from typing import Sequence

#: collective -> the algorithms the model knows (= the registries of ddp_lab.collectives)
ALGORITHMS: dict[str, tuple[str, ...]] = {
    "broadcast": ("linear", "tree", "ring", "torch"),
    "reduce": ("linear", "tree", "torch"),
    "all_reduce": ("linear", "tree", "butterfly", "ring", "torch"),
    "all_gather": ("ring", "torch"),
    "reduce_scatter": ("ring", "torch"),
}

#: Default piece size of the pipelined ring broadcast.
DEFAULT_RING_CHUNK_BYTES = 1 << 20


def ceil_log2(n: int) -> int:
    """Number of binomial-tree rounds for ``n`` ranks (0 for n <= 1)."""
    return 0 if n <= 1 else (n - 1).bit_length()


def num_pipeline_chunks(numel: int, element_size: int, chunk_bytes: int | None) -> int:
    """How many pieces a pipelined transfer of ``numel`` elements is cut into."""
    if not chunk_bytes or chunk_bytes <= 0 or numel == 0:
        return 1
    return max(1, min(numel, math.ceil(numel * element_size / chunk_bytes)))


def pow2_label(n: int) -> str:
    """2^k for powers of two, else the number."""
    return f"2^{n.bit_length() - 1}" if n > 0 and n & (n - 1) == 0 else str(n)


def union_length(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length covered by (start, end) intervals, overlaps counted once."""
    total, reach = 0.0, -math.inf
    for s, e in sorted(intervals):
        if e > reach:
            total += e - max(s, reach)
            reach = e
    return total


#: a sharded call's shards are whole multiples of this many elements: sync=zero1 pads each bucket
#: to world x SHARD_ALIGN (sync/zero1.py), so its calls split evenly
SHARD_ALIGN = 64
SHARDED = ("all_gather", "reduce_scatter")

#: what the library's ("torch") collectives are modelled as, for labels
TORCH_MODELLED_AS = {"all_reduce": "ring", "all_gather": "ring", "reduce_scatter": "ring",
                     "broadcast": "tree", "reduce": "ring reduce-scatter + gather"}


@dataclass(frozen=True)
class Cost:
    """One collective call (or several phases of one, joined by `then`) on a group of
    ``len(sent)`` ranks: `steps` the alpha term, `path_bytes` the beta term."""

    steps: int
    sent: tuple[int, ...]  # bytes each group rank sends (exact for our send/recv algorithms)
    recv: tuple[int, ...]  # bytes each group rank receives
    path_bytes: float
    exact: bool = True  # False: the library's collective, modelled

    @property
    def max_sent(self) -> int:
        return max(self.sent, default=0)

    def time(self, alpha: float, beta: float) -> float:
        """Predicted seconds: ``steps * alpha + path_bytes * beta`` (beta = seconds/byte)."""
        return self.steps * alpha + self.path_bytes * beta

    def then(self, other: "Cost") -> "Cost":
        """This call followed by ``other`` on the same ranks (phases add up)."""
        if len(other.sent) != len(self.sent):
            raise ValueError(f"cannot join costs of {len(self.sent)} and {len(other.sent)} ranks")
        return Cost(self.steps + other.steps,
                    tuple(a + b for a, b in zip(self.sent, other.sent)),
                    tuple(a + b for a, b in zip(self.recv, other.recv)),
                    self.path_bytes + other.path_bytes, self.exact and other.exact)


def nothing(world: int) -> Cost:
    """The cost of no communication on ``world`` ranks."""
    zeros = (0,) * max(world, 1)
    return Cost(0, zeros, zeros, 0.0)


def busbw_factors(world: int) -> dict[str, float]:
    """nccl-tests' factor from algorithm to bus bandwidth (PERFORMANCE.md) of every op on
    ``world`` ranks (the gathers' and scatters' size: the full buffer); one rank moves nothing
    over a bus."""
    n = world
    spread, both = ((n - 1) / n, 2 * (n - 1) / n) if n > 1 else (0.0, 0.0)
    return {"all_reduce": both, "all_gather": spread, "reduce_scatter": spread, "gather": spread,
            "scatter": spread, "broadcast": 1.0, "reduce": 1.0, "send_recv": 1.0, "p2p": 1.0}


def busbw_factor(collective: str, world: int) -> float:
    """`collective`'s factor (:func:`busbw_factors`)."""
    factor = busbw_factors(world).get(collective)
    if factor is None:
        raise ValueError(f"no bus-bandwidth factor for op {collective!r}")
    return factor


def lower_bound(collective: str, numel: int, world: int, elem_size: int = 4) -> tuple[float, int]:
    """What no algorithm of `collective` can beat on `world` ranks, for `numel` elements a rank
    contributes or holds: (bytes the busiest rank must send, :func:`busbw_factors` times the full
    buffer, `world` x `numel` for the gathers and scatters; the rounds of a binomial tree)."""
    full = numel * elem_size * (world if collective in ("all_gather", "reduce_scatter",
                                                        "gather", "scatter") else 1)
    factor = busbw_factor(collective, world) if world > 1 else 0.0
    return factor * full, ceil_log2(world)


def padded(collective: str, numel: int, world: int, unit: int = SHARD_ALIGN) -> int:
    """The elements a call of `numel` puts on the wire: a sharded call's buffer padded to `world`
    equal shards of whole `unit`s (sync/zero1.py's buckets), any other call's as is."""
    if collective in SHARDED and world > 1:
        step = world * unit
        return -(-numel // step) * step
    return numel


def _children(v: int, n: int) -> int:
    """Children of relative rank ``v`` in the binomial tree rooted at 0 (our tree and gloo's
    broadcast): ``v + 2^k`` for every ``2^k`` below ``v``'s lowest set bit."""
    low = v & -v if v else 1 << ceil_log2(n)
    return sum(1 for k in range(n.bit_length()) if (1 << k) < low and v + (1 << k) < n)


def _by_root(n: int, root: int, f) -> tuple[int, ...]:
    """``f(v)`` for every group rank, ``v`` its rank relative to ``root``."""
    return tuple(f((r - root) % n) for r in range(n))


@functools.lru_cache(maxsize=4096)
def cost(collective: str, algorithm: str, numel: int, world: int, elem_size: int = 4, *,
         root: int = 0, chunk_bytes: int | None = DEFAULT_RING_CHUNK_BYTES) -> Cost:
    """Cost of one `collective` with `algorithm` on `world` ranks of `numel` elements of
    `elem_size` bytes (all_gather / reduce_scatter: the *full* buffer, as nccl-tests counts);
    `root`: the source / destination; `chunk_bytes`: the ring broadcast's piece. Cached."""
    if algorithm not in ALGORITHMS.get(collective, ()):
        raise KeyError(f"no cost model for {collective}/{algorithm!r}; known: {ALGORITHMS}")
    n, N, e = world, numel * elem_size, elem_size
    if n <= 1 or numel == 0:
        return nothing(n)
    L = ceil_log2(n)
    if collective in ("all_gather", "reduce_scatter"):
        if numel % n:
            raise ValueError(f"{collective}: {numel} elements do not split into {n} pieces")
        b = (n - 1) * (numel // n) * e
        return Cost(n - 1, (b,) * n, (b,) * n, float(b), algorithm != "torch")
    if algorithm == "torch":
        return _torch(collective, n, N, root)
    if collective == "broadcast":
        if algorithm == "linear":
            return Cost(n - 1, _by_root(n, root, lambda v: (n - 1) * N if v == 0 else 0),
                        _by_root(n, root, lambda v: 0 if v == 0 else N), (n - 1) * N)
        if algorithm == "tree":
            return Cost(L, _by_root(n, root, lambda v: _children(v, n) * N),
                        _by_root(n, root, lambda v: N if v else 0), L * N)
        # ring: root -> root+1 -> ... -> root-1, cut into k pieces only when some rank both
        # receives and forwards (n > 2)
        k = num_pipeline_chunks(numel, e, chunk_bytes) if n > 2 else 1
        return Cost(n - 2 + k, _by_root(n, root, lambda v: N if v < n - 1 else 0),
                    _by_root(n, root, lambda v: N if v else 0),
                    (n - 2 + k) * -(-numel // k) * e)
    if collective == "reduce":
        # the broadcast of its algorithm run backwards: what one sends, the other receives
        b = cost("broadcast", algorithm, numel, n, e, root=root)
        return Cost(b.steps, b.recv, b.sent, b.path_bytes)
    # all_reduce
    if algorithm in ("linear", "tree"):
        # a reduce to rank 0, a broadcast from it
        return cost("reduce", algorithm, numel, n, e).then(
            cost("broadcast", algorithm, numel, n, e))
    if algorithm == "butterfly":
        # ranks p..n-1 fold into 0..n-p-1 and get it back
        p = 1 << (n.bit_length() - 1)
        rounds, folded = p.bit_length() - 1, int(n != p)
        msgs = tuple(1 if r >= p else rounds + (r < n - p) for r in range(n))
        b = tuple(m * N for m in msgs)
        return Cost(rounds + 2 * folded, b, b, (rounds + 2 * folded) * N)
    # ring (collectives/ring_optimised.py, shift 1): rank r sends every chunk but r+1, then but
    # r+2; receives every chunk but r, then but r+1
    # the chunks of tensor_split(n): the first numel % n one element longer
    size = [(numel // n + (i < numel % n)) * e for i in range(n)]
    sent = tuple(2 * N - size[(r + 1) % n] - size[(r + 2) % n] for r in range(n))
    recv = tuple(2 * N - size[r] - size[(r + 1) % n] for r in range(n))
    return Cost(2 * (n - 1), sent, recv, 2 * (n - 1) * max(size))


def _torch(collective: str, n: int, N: int, root: int) -> Cost:
    """The library's collective, modelled (see the module docstring)."""
    # what a ring moves through each rank in n-1 steps
    part = (n - 1) * N / n
    if collective == "all_reduce":
        b = int(2 * part)
        return Cost(2 * (n - 1), (b,) * n, (b,) * n, 2 * part, False)
    if collective == "broadcast":
        return replace(cost("broadcast", "tree", N, n, 1, root=root), exact=False)
    # reduce: ring reduce-scatter, then each rank's reduced chunk (N/n) goes to the root, which
    # receives n-1 of them on its link
    return Cost(n, _by_root(n, root, lambda v: int(part) if v == 0 else N),
                _by_root(n, root, lambda v: int(2 * part) if v == 0 else int(part)),
                2 * part, False)


#: synchroniser -> the collective calls it makes per bucket, in order, each as (collective,
#: algorithm): ("all_reduce", "ring"), ("reduce", "torch"), ...
SYNC_COLLECTIVES: dict[str, tuple[tuple[str, str], ...]] = {
    "ddp": (("all_reduce", "torch"),),
    "naive": (("all_reduce", "torch"),),  # per parameter
    "allreduce": (("all_reduce", "torch"),),
    "ring": (("all_reduce", "ring"),),
    "tree": (("all_reduce", "tree"),),
    "butterfly": (("all_reduce", "butterfly"),),
    "reduce_broadcast": (("reduce", "torch"), ("broadcast", "torch")),
    # reduce-scatter the gradients, step the shard, all-gather the weights (nccl: "torch")
    "zero1": (("reduce_scatter", "ring"), ("all_gather", "ring")),
    # a student's all-reduce: its bytes are counted from its own calls (sync/custom.py); a forecast
    # models it as the ideal ring
    "custom": (("all_reduce", "ring"),),
}

#: alpha-beta time of one bucket of m bytes, per synchroniser (n ranks, p = 2^floor(log2 n))
RING = "2(n-1)α + 2(n-1)/n·m·β"
SYNC_FORMULAS: dict[str, str] = {
    "ddp": f"{RING} (library, as ring)",
    "naive": f"{RING} (library, as ring; a bucket = one parameter)",
    "allreduce": f"{RING} (library, as ring)",
    "ring": RING,
    "tree": "2⌈log2 n⌉(α + m·β)",
    "butterfly": "(log2 p + 2[n≠p])(α + m·β)",
    "reduce_broadcast": "nα + 2(n-1)/n·m·β + ⌈log2 n⌉(α + m·β) (library, as gloo)",
    "zero1": f"{RING} (ring reduce-scatter, then all-gather of the weights)",
    "custom": f"yours: its bytes counted from its send/recv (forecast as the ring, {RING})",
    # phases on groups (HIERARCHICAL_PHASES): k ranks per node, L nodes
    "hierarchical": "R_k + A_L + B_k: reduce in each node (tree: ⌈log2 k⌉(α + m·β)), "
                    "all-reduce among the L leaders (ring: 2(L-1)α + 2(L-1)/L·m·β, the only "
                    "bytes that cross nodes), broadcast in each node (tree: ⌈log2 k⌉(α + m·β))",
}


#: sync=hierarchical per bucket: (collective, where: "node", inside every node with sync.intra,
#: root its leader; "leaders", one rank per node with sync.inter)
HIERARCHICAL_PHASES: tuple[tuple[str, str], ...] = (
    ("reduce", "node"), ("all_reduce", "leaders"), ("broadcast", "node"))


def _on_groups(groups: tuple[tuple[int, ...], ...], world: int, collective: str,
               algorithm: str, numel: int, elem_size: int) -> Cost:
    """One collective run side by side on disjoint `groups` (global ranks, roots first) as one
    world-wide Cost: each rank's bytes in its group, the slowest group's steps and bytes."""
    sent, recv = [0] * world, [0] * world
    steps, path, exact = 0, 0.0, True
    for g in groups:
        c = cost(collective, algorithm, numel, len(g), elem_size)
        for i, r in enumerate(g):
            sent[r] += c.sent[i]
            recv[r] += c.recv[i]
        steps, path, exact = max(steps, c.steps), max(path, c.path_bytes), exact and c.exact
    return Cost(steps, tuple(sent), tuple(recv), path, exact)


@functools.lru_cache(maxsize=1024)
def hierarchical_calls(numel: int, nodes: tuple[tuple[int, ...], ...], elem_size: int = 4, *,
                       intra: str = "torch", inter: str = "ring") -> tuple[tuple[str, Cost], ...]:
    """`(collective, Cost)` of the three phases (:data:`HIERARCHICAL_PHASES`) of one hierarchical
    all-reduce, each over the whole world. `nodes`: each node's global ranks, the leader first;
    `intra` / `inter`: the algorithms inside nodes / among the leaders."""
    world = sum(len(n) for n in nodes)
    if sorted(r for n in nodes for r in n) != list(range(world)):
        raise ValueError(f"nodes {nodes} do not hold every rank 0..{world - 1} once")
    if any(n[0] != min(n) for n in nodes):
        raise ValueError(f"nodes {nodes}: each node's leader (listed first) is its lowest rank")
    where = {"node": nodes, "leaders": (tuple(n[0] for n in nodes),)}
    algo = {"node": intra, "leaders": inter}
    return tuple((coll, _on_groups(where[at], world, coll, algo[at], numel, elem_size))
                 for coll, at in HIERARCHICAL_PHASES)


def cross_node_sent(numel: int, nodes: tuple[tuple[int, ...], ...], elem_size: int = 4, *,
                    intra: str = "torch", inter: str = "ring") -> tuple[int, ...]:
    """Bytes each rank sends to another node in one hierarchical all-reduce: the leaders'
    all-reduce is the only phase whose messages leave a node, and all of them do."""
    _, (_, leaders), _ = hierarchical_calls(numel, nodes, elem_size, intra=intra, inter=inter)
    return leaders.sent


def sync_calls(sync: str, wire_numels: list[int], world: int, elem_size: int = 4, *,
               root: int = 0) -> list[tuple[str, Cost]]:
    """`(collective, Cost)` of every call `sync` makes in a step, per bucket's wire numel."""
    phases = SYNC_COLLECTIVES[sync]
    return [(coll, cost(coll, algo, numel, world, elem_size, root=root))
            for numel in wire_numels for coll, algo in phases]


def sync_step(sync: str, wire_numels: list[int], world: int, elem_size: int = 4, *,
              root: int = 0) -> Cost:
    """All of one step's calls joined (see :func:`sync_calls`)."""
    return functools.reduce(Cost.then, (c for _, c in sync_calls(sync, wire_numels, world, elem_size,
                                                                  root=root)), nothing(world))
