"""Process groups from the detected topology: global, intra-node, cross-node, leaders.

From every rank's node: `global`, `intra_node` (0-3, 4-7 on 4x4), `cross_node` (the j-th rank of
every node: 0,4,8,12), `leaders` (the first rank of every node; the others' `GroupSet.mine` is
None). `node_size=k` pretends every k consecutive ranks are a node. `new_group` is collective over
the world: `build_groups` has every rank create every group, in the same order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch.distributed as dist

from .distributed import DistContext
from .env import hostname


@dataclass(frozen=True)
class Topology:
    nodes: tuple[tuple[int, ...], ...]  # global ranks of each node, nodes in order
    hosts: tuple[str, ...]  # host name of each rank
    simulated: bool = False  # nodes come from a node_size setting, not from the launcher
    simulated_by: str = "bench.node_size"  # that setting's key, for describe()

    @property
    def world_size(self) -> int:
        return len(self.hosts)

    def groups(self, kind: str) -> list[tuple[int, ...]]:
        """The rank lists of every group of `kind` (`leaders`: one rank per node)."""
        if kind == "global":
            return [tuple(range(self.world_size))]
        if kind == "intra_node":
            return [tuple(n) for n in self.nodes]
        if kind == "cross_node":
            width = max(len(n) for n in self.nodes)
            return [tuple(n[j] for n in self.nodes if j < len(n)) for j in range(width)]
        if kind == "leaders":
            return [tuple(n[0] for n in self.nodes)]
        raise ValueError(f"unknown group kind {kind!r}: choose global, intra_node, cross_node or leaders")

    def pairs(self) -> dict[str, Optional[tuple[int, int]]]:
        """Ping-pong partners of rank 0: a rank on its node, the next node's first (or None)."""
        node0 = self.nodes[0]
        return {"same_node": (node0[0], node0[1]) if len(node0) > 1 else None,
                "cross_node": (node0[0], self.nodes[1][0]) if len(self.nodes) > 1 else None}

    def describe(self) -> str:
        sizes = sorted({len(n) for n in self.nodes})
        per = str(sizes[0]) if len(sizes) == 1 else "-".join(map(str, (sizes[0], sizes[-1])))
        how = f" (simulated, {self.simulated_by})" if self.simulated else ""
        nodes = len(self.nodes)
        return (f"{nodes} node{'s' if nodes != 1 else ''} x {per} "
                f"rank{'s' if per != '1' else ''}{how}")


def topology_from_table(node_of_rank: list[int], hosts: list[str], simulated: bool = False,
                        simulated_by: str = "bench.node_size") -> Topology:
    """Group ranks by node id (nodes ordered by id, ranks ascending within a node)."""
    by_node: dict[int, list[int]] = {}
    for rank, node in enumerate(node_of_rank):
        by_node.setdefault(node, []).append(rank)
    nodes = tuple(tuple(by_node[k]) for k in sorted(by_node))
    return Topology(nodes=nodes, hosts=tuple(hosts), simulated=simulated,
                    simulated_by=simulated_by)


def detect_topology(ctx: DistContext, node_size: int = 0,
                    key: str = "bench.node_size") -> Topology:
    """Collective: every rank's node (`rank // node_size` when simulating) and host."""
    table = ctx.gather_objects((ctx.env.node_rank, hostname()))
    hosts = [h for _, h in table]  # one table row per rank of the process group
    if node_size > 0:
        return topology_from_table([r // node_size for r in range(len(table))], hosts, True, key)
    return topology_from_table([n for n, _ in table], hosts)


@dataclass
class GroupSet:
    """The groups of one kind, and the one this rank belongs to."""

    kind: str
    members: list[tuple[int, ...]]
    handles: list  # ProcessGroup per member list (None = the default group)
    mine: Optional[int]  # index of this rank's group in `members`; None: in none (leaders)

    @property
    def ranks(self) -> tuple[int, ...]:
        return self.members[self.mine] if self.mine is not None else ()

    @property
    def handle(self):
        return self.handles[self.mine] if self.mine is not None else None

    @property
    def measured(self) -> list[int]:
        """Indices of the groups that have anything to communicate (size >= 2)."""
        return [i for i, m in enumerate(self.members) if len(m) > 1]


def build_groups(topo: Topology, kinds: list[str], rank: int) -> dict[str, GroupSet]:
    """Collective: create the process groups of every kind, in one order on every rank."""
    out: dict[str, GroupSet] = {}
    for kind in kinds:
        members = topo.groups(kind)
        handles = []
        for ranks in members:
            # the default group needs no new communicator; a group of one is never used
            if kind == "global" or len(ranks) in (1, topo.world_size):
                handles.append(None)
            else:  # load-bearing: called by every rank, for every group, in the same order
                handles.append(dist.new_group(list(ranks)))
        mine = next((i for i, m in enumerate(members) if rank in m), None)
        out[kind] = GroupSet(kind, members, handles, mine)
    return out
