"""What the doctor's checks read and say: the job's `Facts`, one `Check`
per question."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    finding: str
    fix: str = ""

    def line(self) -> str:
        head = f"{'ok' if self.ok else 'FAIL'} {self.name}: {self.finding}"
        return f"{head} -> {self.fix}" if not self.ok and self.fix else head

    def as_dict(self) -> dict:
        return {**asdict(self), "line": self.line()}


@dataclass
class Facts:
    """What the doctor's job left: `settings` (the launcher's, from the
    resolved config), `ranks` (every rank's facts file, local rank 0's
    with `node`), `measures` (rank -> what it measured once in the
    group), `status` (the job's summary.json status), `rc`."""
    settings: dict
    ranks: list[dict]
    measures: dict[int, dict]
    status: str = ""
    rc: int = 0

    def nodes(self) -> dict[int, list[dict]]:
        """node rank -> its ranks' facts, by rank."""
        out: dict[int, list[dict]] = {}
        for r in sorted(self.ranks, key=lambda r: r.get("rank", -1)):
            out.setdefault(r.get("node_rank", 0), []).append(r)
        return dict(sorted(out.items()))

    def label(self, node_rank: int) -> str:
        """A node's name as the user knows it (SLURMD_NODENAME or
        hostname); nodes of one machine that share a hostname (a network
        lab) get their address, else node rank."""
        by_node = self.nodes()
        first = (by_node.get(node_rank) or [{}])[0]
        name = first.get("node", f"node {node_rank}")
        names = [rs[0].get("node") for rs in by_node.values()]
        if names.count(name) == 1:
            return name
        addresses = [rs[0].get("address") for rs in by_node.values()]
        if first.get("address") and addresses.count(first["address"]) == 1:
            # network namespaces of one machine
            return f"{name}@{first['address']}"
        return f"{name}[{node_rank}]"

    def node_facts(self) -> dict[int, dict]:
        """node rank -> the node facts its local rank 0 gathered."""
        return {n: next((r["node_facts"] for r in rs if r.get("node_facts")), {})
                for n, rs in self.nodes().items()}


def disagree(values: Mapping[str, Any]) -> Optional[str]:
    """"node2 has X, node1 Y" when the nodes' values differ (the odd one
    first), else None."""
    groups: dict[str, list[str]] = {}
    for node, value in values.items():
        groups.setdefault(str(value), []).append(node)
    if len(groups) < 2:
        return None
    # the first node is the reference: the other is odd
    first = next(iter(values), None)
    ordered = sorted(groups.items(), key=lambda kv: (len(kv[1]), first in kv[1]))
    return ", ".join(f"{'/'.join(nodes)} {'has ' if i == 0 else ''}{value}"
                     for i, (value, nodes) in enumerate(ordered))
