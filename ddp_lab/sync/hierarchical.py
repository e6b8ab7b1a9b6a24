"""sync=hierarchical: per flat bucket, reduce inside each node,
all-reduce among the nodes' leaders, broadcast inside each node
(docs/sync.md, "Hierarchical").

    node 0: ranks 0 1        1. reduce   0 <- 1,   2 <- 3     (inside nodes, side by side)
    node 1: ranks 2 3        2. all-reduce among 0, 2         (the only cross-node traffic)
                             3. broadcast 0 -> 1,  2 -> 3     (inside nodes)

Only one rank per node (its leader, the lowest rank) talks to other
nodes: on L nodes of k ranks, fewer bytes and k times fewer, larger
messages cross nodes than a flat ring's, for two more phases and a
whole-buffer reduce and broadcast inside the node.

- `sync.inter=ring` (default): `ddp_lab.collectives`' ring on the
  leaders' group (on gloo with `sync.prepost`, one
  `PrepostedRingAllReduce` per bucket); `library`: torch's.
- `sync.intra=library` (default): torch's reduce / broadcast on the
  node's group; `tree`: `ddp_lab.collectives`' binomial trees.
- Nodes: the launcher's (`ddp_lab.world.topology`), or every
  `sync.node_size=k` consecutive ranks; nodes of unequal sizes work.

It is AllReduceSync with another `all_reduce(flat)` (bucketing,
averaging, compression, overlap shared); keys and rules:
config/sync.py. Bytes:
`ddp_lab.predict.costmodel.hierarchical_calls`, and those sent to
another node (`comm_bytes_cross_node`); exact with `inter=ring
intra=tree`, else modelled."""

from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

from ..predict import costmodel
from ..collectives import ALL_REDUCE, BROADCAST, REDUCE, PrepostedRingAllReduce, preposted_plans
from ..world.distributed import DistContext
from ..world.env import detect_env
from ..world.topology import Topology, build_groups, detect_topology
from .allreduce import AllReduceSync
from ..config.sync import HIERARCHICAL_INTER, HIERARCHICAL_INTRA

log = logging.getLogger("ddp_lab")


class HierarchicalSync(AllReduceSync):
    name = "hierarchical"
    # set per run in wrap: exact when every phase that runs is ours
    bytes_exact = False

    def wrap(self, module: nn.Module) -> nn.Module:
        module = super().wrap(module)
        self.intra_algo, self.inter_algo = (
            HIERARCHICAL_INTRA[self.cfg.intra],
            HIERARCHICAL_INTER[self.cfg.inter],
        )
        self.rings: dict[int, PrepostedRingAllReduce] = {}
        if self.world_size == 1:
            self.topology = Topology(nodes=((0,),), hosts=("",))
            return module
        # collective: every rank reports its node, then creates every
        # group in one order. A rank's node is known only to its
        # launcher's variables (world/env.py reads them); build_sync
        # hands a synchroniser the device and the world size, not the
        # trainer's DistContext, so wrap reads the same variables again
        ctx = DistContext(env=detect_env(), backend=dist.get_backend(), device=self.device)
        self.topology = detect_topology(ctx, self.cfg.node_size, key="sync.node_size")
        groups = build_groups(self.topology, ["intra_node", "leaders"], self.rank)
        node, leaders = groups["intra_node"], groups["leaders"]
        self.node_ranks, self.node_group = node.ranks, node.handle
        # the lowest rank of the node
        self.leader = node.ranks[0]
        self.is_leader = self.rank == self.leader
        self.leader_ranks, self.leader_group = (leaders.members[0], leaders.handles[0])
        if (
            self.is_leader
            and self.inter_algo == "ring"
            and len(self.leader_ranks) > 1
            and self.cfg.prepost
            and dist.get_backend() == "gloo"
            and self.device.type == "cpu"
        ):
            # one persistent ring per bucket buffer, found by its
            # address (buffers never move); made collectively by the
            # leaders, in bucket order (sync.compress: the ring is the
            # 16-bit copy's, the tensor that goes on the wire)
            wires = [self.wire.buffer(b.buffer) for b in self.buckets]
            self.rings = preposted_plans(wires, group=self.leader_group)
        largest = (
            max((p.numel() for p in self.params), default=1)
            if self.per_param
            else max((b.buffer.numel() for b in self.buckets), default=1)
        )
        self.bytes_exact = all(c.exact for _, c in self._phases(largest, 4))
        log.info(
            "hierarchical all-reduce: %s, leaders %s; inter %s, intra %s",
            self.topology.describe(),
            ",".join(map(str, self.leader_ranks)),
            self.cfg.inter,
            self.cfg.intra,
        )
        return module

    def _phases(self, numel: int, elem_size: int) -> tuple[tuple[str, costmodel.Cost], ...]:
        return costmodel.hierarchical_calls(
            numel, self.topology.nodes, elem_size, intra=self.intra_algo, inter=self.inter_algo
        )

    def traffic(self, op: str, numel: int, elem_size: int) -> tuple[int, int, Optional[int]]:
        """One all-reduce of the world, as nccl-tests counts a
        hierarchical one (busbw): its three phases' bytes joined, and
        the leaders' phase as the bytes that cross nodes."""
        (_, reduce), (_, leaders), (_, broadcast) = self._phases(numel, elem_size)
        whole = reduce.then(leaders).then(broadcast)
        return (whole.sent[self.rank], whole.recv[self.rank], leaders.sent[self.rank])

    def all_reduce(self, flat: torch.Tensor) -> None:
        in_node = len(self.node_ranks) > 1
        if in_node:  # 1. the node's sum onto its leader
            REDUCE[self.intra_algo](flat, self.leader, group=self.node_group)
        # 2. the leaders' sum: every node's
        if self.is_leader and len(self.leader_ranks) > 1:
            ring = self.rings.get(flat.data_ptr())
            if ring is not None:
                ring(flat)
            else:
                ALL_REDUCE[self.inter_algo](flat, group=self.leader_group)
        # 3. the leader's result to the rest of its node
        if in_node:
            BROADCAST[self.intra_algo](flat, self.leader, group=self.node_group)

    def close(self) -> None:
        # (overlapped: its thread, which calls the rings, is closed
        # first)
        super().close()
        # collective among the leaders
        for ring in self.rings.values():
            ring.close()
