"""sync=hierarchical's keys (sync/hierarchical.py): ring's, and how each
level runs."""

from __future__ import annotations

from dataclasses import dataclass

from ..help import doc
from .ring import RingSyncConfig


#: sync.inter / sync.intra of sync=hierarchical -> the algorithm that
#: runs it
HIERARCHICAL_INTER = {"ring": "ring", "library": "torch"}
HIERARCHICAL_INTRA = {"library": "torch", "tree": "tree"}


@dataclass
class HierarchicalSyncConfig(RingSyncConfig):
    """Reduce inside each node, all-reduce among the leaders, broadcast
    inside each node."""

    inter: str = doc("ring", "the leaders' all-reduce (the only traffic between nodes): ring "
                             "(ddp_lab.collectives, exact bytes; sync.prepost applies) | "
                             "library (torch.distributed.all_reduce on their group)")
    intra: str = doc("library", "the reduce onto the node's leader and the broadcast from "
                                "it: library (torch.distributed.reduce/broadcast on the "
                                "node's group) | tree (ddp_lab.collectives)")
    node_size: int = doc(0, "0 = the launcher's nodes; k = pretend every k consecutive ranks "
                            "are a node (one machine; must divide the world size)")

    @classmethod
    def check(cls, cfg: HierarchicalSyncConfig, world_size: int) -> None:
        super().check(cfg, world_size)
        for key, allowed in (("inter", HIERARCHICAL_INTER), ("intra", HIERARCHICAL_INTRA)):
            if cfg[key] not in allowed:
                raise ValueError(f"sync.{key}={cfg[key]}: choose {' or '.join(allowed)}")
        k = cfg.node_size
        if k < 0 or (k > 0 and world_size % k):
            divisors = [d for d in range(1, world_size + 1) if world_size % d == 0]
            raise ValueError(
                f"sync.node_size={k}: must divide the world of {world_size} ranks into equal "
                f"nodes: use one of {', '.join(map(str, divisors))}, or 0 for the launcher's nodes")
