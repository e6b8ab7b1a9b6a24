"""Why a case did not end: every rank's pending call, read off the board, turned into one
sentence a student can act on.

The causes, in the order they are looked for:

- a cycle of blocked sends: on gloo (and on nccl for large messages) a
  blocking send waits until its peer posts the receive, so ranks that
  all send first wait for each other forever;
- a receive from a rank that already returned (it never sends);
- a cycle of receives: every rank waits to hear first;
- a rank left in a collective the others never called (each rank's
  count of it: "rank 0 called barrier 3 times, ranks 1 and 2 twice");
- a send and its receive of different sizes;
- a peer that is no rank of the world.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from ..collectives.watch import COLLECTIVE_CALLS

_TIMES = {0: "never", 1: "once", 2: "twice"}


def short(where: Optional[str]) -> str:
    """`file.py:12` for a full path."""
    if not where:
        return "?"
    path, _, line = where.rpartition(":")
    return f"{os.path.basename(path)}:{line}"


def times(n: int) -> str:
    return _TIMES.get(n, f"{n} times")


def ranks_text(ranks: list[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks[:-1])) + f" and {ranks[-1]}"


def describe(call: Optional[dict]) -> str:
    if call is None:
        return "returned"
    if call["op"] in COLLECTIVE_CALLS:
        return f"in {call['op']} at {short(call['where'])}"
    to = "to" if call["op"] in ("send", "isend") else "from"
    return f"in {call['op']} {to} rank {call['peer']} ({call['numel']} elements) at " \
           f"{short(call['where'])}"


def peer_note(call: dict, world: int) -> str:
    """What is wrong with a call's peer, if anything ("" if nothing)."""
    peer = call.get("peer")
    if call["op"] not in ("send", "isend", "recv", "irecv") or peer is None:
        return ""
    if isinstance(peer, str) and peer.replace(".", "", 1).lstrip("-").isdigit():
        return f": peer {peer} is a float (ranks are ints: use // to divide them)"
    if not isinstance(peer, int):
        return f": peer {peer} is not a rank (ranks are the ints 0..{world - 1})"
    if not 0 <= peer < world:
        return f": rank {peer} does not exist in a world of {world} (ranks 0..{world - 1})"
    return ""


def hang(members: list[int], states: dict[int, dict], returned: set[int],
         world: int) -> tuple[str, list[dict]]:
    """(the diagnosis, each member's pending call as a record: rank, op, peer, numel, where)."""
    # the call each rank waits in (the innermost), None where it returned or runs
    calls = {r: None if r in returned else (states.get(r, {}).get("pending") or [None])[-1]
             for r in members}
    records = [{"rank": r, "op": c["op"] if c else "returned" if r in returned else "running",
                **{k: c[k] if c else None for k in ("peer", "numel", "where")}}
               for r, c in calls.items()]
    sends = {r: c["peer"] for r, c in calls.items() if c and c["op"] in ("send", "isend")}
    recvs = {r: c["peer"] for r, c in calls.items() if c and c["op"] in ("recv", "irecv")}
    for text in (_cycle(sends, "sends to", "send first, neither receives",
                        "send first and none receives"),
                 _from_returned(recvs, returned, calls),
                 _cycle(recvs, "receives from", "receive first, neither sends",
                        "receive first and none sends"),
                 _collective(members, calls, states),
                 _sizes(calls),
                 _bad_peer(calls, world)):
        if text:
            return text, records
    waits = "; ".join(f"rank {r} {describe(calls[r])}" for r in members)
    return f"no rank moves: {waits}", records


def _cycle(edges: dict[int, Any], verb: str, two: str, many: str) -> Optional[str]:
    for start in sorted(edges):
        seen, r = [start], edges[start]
        while isinstance(r, int) and r in edges and r not in seen:
            seen.append(r)
            r = edges[r]
        if r == start and len(seen) >= 2:
            if len(seen) == 2:
                a, b = seen
                return (f"rank {a} {verb} {b} and rank {b} {verb} {a}: both {two} (a blocking "
                        "send waits for its receive; let one of them receive first, or use "
                        "isend/irecv and wait on both)")
            chain = " -> ".join(map(str, [*seen, start]))
            return (f"ranks {chain}: each {verb} the next, all {many} (a blocking send waits "
                    "for its receive; alternate by rank parity, or post isend/irecv and wait "
                    "on both)")
    return None


def _from_returned(recvs: dict[int, Any], returned: set[int], calls: dict) -> Optional[str]:
    for r, peer in sorted(recvs.items()):
        if peer in returned:
            c = calls[r]
            return (f"rank {r} waits to receive from rank {peer} at {short(c['where'])}, but "
                    f"rank {peer} already returned from the function without sending it")
    return None


def ranks_by_count(counts: dict[int, int]) -> dict[int, list[int]]:
    """{calls: the ranks that made that many} from {rank: calls}."""
    by: dict[int, list[int]] = {}
    for r, n in counts.items():
        by.setdefault(n, []).append(r)
    return by


def counts_text(op: str, by_count: dict[int, list[int]]) -> str:
    """"rank 0 called barrier 3 times, ranks 1 and 2 twice": most first."""
    ordered = sorted(by_count.items(), reverse=True)
    parts = [f"{ranks_text(ordered[0][1])} called {op} {times(ordered[0][0])}"]
    parts += [f"{ranks_text(rs)} {times(n)}" for n, rs in ordered[1:]]
    return ", ".join(parts)


def _collective(members: list[int], calls: dict, states: dict) -> Optional[str]:
    inside = {r: c["op"] for r, c in calls.items() if c and c["op"] in COLLECTIVE_CALLS}
    if not inside:
        return None
    op = sorted(inside.values())[0]
    counts: dict[int, int] = {r: int((states.get(r, {}).get("counts") or {}).get(op, 0))
                              for r in members}
    by_count = ranks_by_count(counts)
    if len(by_count) == 1:
        others = [r for r in members if r not in inside]
        if not others:
            return None
        where = short(calls[sorted(inside)[0]]["where"])
        return (f"{ranks_text(sorted(inside))} wait in {op} at {where}, which "
                f"{ranks_text(others)} never reach: "
                + "; ".join(f"rank {r} {describe(calls[r])}" for r in others))
    stuck = by_count[max(by_count)]
    where = short(calls[stuck[0]]["where"]) if calls.get(stuck[0]) else "?"
    verb = "waits" if len(stuck) == 1 else "wait"
    return (counts_text(op, by_count) + f": {ranks_text(stuck)} {verb} in a {op} ({where}) the "
            "others never call; every rank must make the same collective calls")


def _sizes_differ(send: dict, recv: dict) -> str:
    """"rank a sends N elements to rank b (where) but rank b receives M (where)"."""
    return (f"rank {recv['peer']} sends {send['numel']} elements to rank {send['peer']} "
            f"({short(send['where'])}) but rank {send['peer']} receives {recv['numel']} "
            f"({short(recv['where'])})")


def _sizes(calls: dict) -> Optional[str]:
    for r, c in sorted(calls.items()):
        if not c or c["op"] not in ("send", "isend"):
            continue
        p = calls.get(c["peer"]) if isinstance(c["peer"], int) else None
        if p and p["op"] in ("recv", "irecv") and p["peer"] == r and p["numel"] != c["numel"]:
            return _sizes_differ(c, p) + ": a send and its receive must have the same size"
    return None


def _bad_peer(calls: dict, world: int) -> Optional[str]:
    for r, c in sorted(calls.items()):
        if c and c["op"] in ("send", "isend", "recv", "irecv") and c["peer"] is not None and (
                not isinstance(c["peer"], int) or not 0 <= c["peer"] < world):
            return (f"rank {r} calls {c['op']} with peer {c['peer']!r} at {short(c['where'])}: "
                    f"the ranks are the integers 0..{world - 1}")
    return None


def sizes_of_crash(states: dict[int, dict]) -> Optional[str]:
    """Two ranks whose latest send and receive between them differ in size (what ends in a gloo
    error, or a rank's death), from the board."""
    def calls(st: dict) -> list[dict]:
        return (st.get("history") or []) + (st.get("posted") or []) + (st.get("pending") or [])

    for a in sorted(states):
        sends = {c["peer"]: c for c in calls(states[a])
                 if c["op"] in ("send", "isend") and isinstance(c["peer"], int)}
        for b, c in sorted(sends.items()):
            recvs = [p for p in calls(states.get(b, {}))
                     if p["op"] in ("recv", "irecv") and p["peer"] == a]
            if recvs and recvs[-1]["numel"] != c["numel"]:
                return _sizes_differ(c, recvs[-1])
    return None


def pairing(logs: dict[int, list]) -> Optional[str]:
    """After every rank returned: the k-th message from a to b, and the k-th receive at b from
    a, of different sizes (or counts)."""
    for a in sorted(logs):
        for b in sorted(logs):
            if a == b:
                continue
            sent = [n for d, p, n in logs[a] if d == "sent" and p == b]
            got = [n for d, p, n in logs[b] if d == "recv" and p == a]
            for k, (x, y) in enumerate(zip(sent, got)):
                if x != y:
                    return (f"rank {a}'s message {k + 1} to rank {b} has {x} elements, but "
                            f"rank {b} receives {y}")
            if len(sent) != len(got) and all(p is not None for _, p, _ in logs[b]):
                return (f"rank {a} sent {len(sent)} messages to rank {b}, which received "
                        f"{len(got)} from it")
    return None
