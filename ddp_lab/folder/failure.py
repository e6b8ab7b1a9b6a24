"""Which rank stopped the others, and the one line that says so.

When a collective fails, every surviving rank and the launcher read the ranks' progress records
(ddp_lab.folder.heartbeat) and `diagnose` who stopped: a dead or frozen local process (/proc), a
node that no longer answers (`ddp_lab.world.ports.answers`), the live rank behind in collectives,
or the first that failed (docs/failures.md, "A rank dies"). `failure_line` says it, `end_stuck`
kills local culprits.
"""

from __future__ import annotations

import os
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

from ..world.ports import PROBE_S, answers
from .heartbeat import mark_killed, process_state, read_all

REMOTE_STALE_S = 40.0  # see `diagnose`


def silent_nodes(records: list[dict], me: Optional[int]) -> list[dict]:
    """The ranks of the other nodes that no longer answer `me`'s node, each with `why` and
    `silent_node` added; [] when every node answers or nothing says where the nodes are."""
    mine = next((r for r in records if r["rank"] == me), None)
    if mine is None or not mine.get("node"):
        return []
    nodes: dict[str, str] = {}
    for r in records:
        if r.get("node") and r.get("addr") and r["node"] != mine["node"]:
            nodes.setdefault(r["node"], r["addr"])
    with ThreadPoolExecutor(max(1, min(16, len(nodes)))) as pool:
        quiet = {n for n, ok in zip(nodes, pool.map(answers, nodes.values())) if not ok}
    found = [r for r in records if r.get("node") in quiet]
    for r in found:
        r["silent_node"], r["why"] = r["node"], (
            f"went silent: {r['addr']} sends no reply (a connection attempt from {mine['node']} "
            f"timed out after {PROBE_S:.0f} s)")
    return found


def diagnose(run_dir: Path, me: Optional[int] = None, stale_s: float = 0.0,
             probe: bool = False) -> list[dict]:
    """The rank(s) that stopped the others, each with `why`, by evidence: local ranks dead, frozen
    or killed; with `probe`, the ranks of silent nodes; else live ranks behind in collectives,
    still for `stale_s`; else the first that failed (unless `me`). [] if none."""
    records = read_all(run_dir)
    others = [r for r in records if r["rank"] != me]
    found = []
    for r in others:
        if r["state"] == "killed":
            r["why"] = r["message"] or "killed"
            found.append(r)
        elif r["state"] in ("starting", "running") and r["process"] in ("dead", "frozen"):
            r["why"] = "dead (no process)" if r["process"] == "dead" else "frozen (SIGSTOP)"
            found.append(r)
    if found:
        return found
    found = silent_nodes(records, me) if probe else []
    if found:
        return found
    live = [r for r in others if r["state"] in ("starting", "running")]
    counts = [r["collective"] for r in live + [r for r in records if r["rank"] == me]]
    if live and min(counts) < max(counts):
        # another machine's record reaches a shared folder when its kernel writes the page back (up
        # to ~35 s later on NFS): only a longer silence counts against it
        behind = [r for r in live if r["collective"] == min(counts)
                  and r["age_s"] >= (stale_s if r["local"] else max(stale_s, REMOTE_STALE_S))]
        for r in behind:
            r["why"] = f"no progress for {r['age_s']:.0f} s"
        if behind:
            return behind
    failed = [r for r in records if r["state"] == "failed"]
    if failed:
        first = min(failed, key=lambda r: r["updated"])
        if first["rank"] != me:
            first["why"] = f"failed ({first['message'] or 'see its log'})"
            return [first]
    return []


def failure_line(culprits: list[dict]) -> str:
    """'rank 1 (pid P on host H) stopped at epoch E step S phase sync collective #C: frozen
    (SIGSTOP)', one clause per rank, joined by '; '. The ranks of a silent node make one clause:
    'node node2 (ranks 2-3, last at ...) went silent: ...'."""
    clauses, named = [], set()
    for r in culprits:
        node = r.get("silent_node")
        if not node:
            clauses.append(f"rank {r['rank']} (pid {r['pid']} on host {r['host']}) stopped at "
                           f"{r['where']}: {r['why']}")
        elif node not in named:  # the node's first rank speaks for it
            named.add(node)
            ranks = rank_list([c["rank"] for c in culprits if c.get("silent_node") == node])
            clauses.append(f"node {node} (ranks {ranks}, last at {r['where']}) {r['why']}")
    return "; ".join(clauses)


def rank_list(ranks: list[int]) -> str:
    """[2, 3, 5] -> '2-3, 5'."""
    ranks, parts = sorted(ranks), []
    for r in ranks:
        if parts and parts[-1][1] == r - 1:
            parts[-1][1] = r
        else:
            parts.append([r, r])
    return ", ".join(f"{a}-{b}" if b > a else f"{a}" for a, b in parts)


def end_stuck(culprits: list[dict], run_dir: Path, by: str = "") -> list[int]:
    """SIGKILL this machine's culprits that cannot end themselves (frozen or hung) and whose
    command line names the run folder; the pids killed."""
    killed = []
    for r in culprits:
        if not r.get("local") or r.get("process") not in ("frozen", "running"):
            continue
        if r["process"] == "running" and not r.get("why", "").startswith("no progress"):
            continue
        if process_state(r["pid"], Path(run_dir).resolve()) == "dead":
            continue
        mark_killed(run_dir, r["rank"], f"{r['why']}, killed by {by}" if by else r["why"])
        try:
            os.kill(r["pid"], signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
        killed.append(r["pid"])
    return killed
