"""A student's functions checked, world by world: each case's ranks turned into pass, wrong,
crash, hang or unsupported, and the table and check.json that say so.

`check_function` runs `fn`'s cases (cases.py) on worlds of 1 to 7 real gloo ranks (world.py),
stops a world at its first failure, and keeps the first failure over all worlds as the verdict.
The bytes each rank sent and received and its rounds come from the watched calls of the largest
passing case, beside what no algorithm can beat (`ddp_lab.predict.costmodel.lower_bound`).
"""

from __future__ import annotations

import html
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

from . import diagnose as D
from ..config.student import StudentFunction
from ..folder.files import write_json
from ..predict.costmodel import lower_bound
from .cases import Case, cases, LARGE
from .world import CaseRun, World


WORLDS = (1, 2, 3, 4, 5, 6, 7)


@dataclass
class Failure:
    verdict: str
    case: Case
    detail: str
    ranks: list[dict] = field(default_factory=list)
    #: the world can take the next case (every rank returned)
    sound: bool = False


@dataclass
class FunctionResult:
    name: str
    collective: str
    path: str
    verdict: str = "pass"
    worlds_passed: list[int] = field(default_factory=list)
    worlds_checked: list[int] = field(default_factory=list)
    first_failure: Optional[dict] = None
    ranks: list[dict] = field(default_factory=list)
    detail: str = ""
    bytes: Optional[dict] = None
    unsupported: list[str] = field(default_factory=list)
    cases: int = 0
    cases_passed: int = 0
    seconds: float = 0.0


def limit_s(case: Case, base_s: float) -> float:
    """A case's time limit: `base_s`, more for large tensors on many ranks."""
    return base_s + 2e-6 * case.numel * case.world_size


def check_function(fn: Callable, info: StudentFunction, namespaces: list, log_dir: Path,
                   worlds=WORLDS, base_s: float = 3.0) -> FunctionResult:
    """`fn` checked on each of `worlds`: the first failure is the verdict (a one-rank world's
    only when no larger world fails)."""
    res = FunctionResult(info.name, info.collective, info.path)
    t0 = time.monotonic()
    first: Optional[Failure] = None
    unsupported: set[str] = set()
    for w in worlds:
        todo = list(enumerate(cases(info, w)))
        before = res.cases_passed
        failure = _run_world(fn, info, namespaces, log_dir, w, todo, base_s, unsupported, res)
        res.worlds_checked.append(w)
        if failure is None and res.cases_passed > before:
            res.worlds_passed.append(w)
        elif first is None or (first.case.world_size == 1 and w > 1):
            # a world of one rank sends nothing: its failure is the verdict only when no larger
            # world fails
            first = failure
    res.seconds = round(time.monotonic() - t0, 2)
    res.unsupported = sorted(unsupported)
    if first is not None:
        res.verdict = first.verdict
        res.first_failure = first.case.as_dict()
        res.detail = first.detail
        res.ranks = first.ranks
    elif unsupported:
        res.verdict = "unsupported"
        res.detail = ("raised NotImplementedError for "
                      + ", ".join(f"op {u}" if u != "*" else "every case" for u in res.unsupported))
    return res


def _run_world(fn, info, namespaces, log_dir, w, todo, base_s, unsupported, res
               ) -> Optional[Failure]:
    world: Optional[World] = None
    try:
        for index, case in todo:
            if (case.op or "*") in unsupported or "*" in unsupported:
                continue
            if world is None:
                world = World(fn, info, w, namespaces, log_dir).start()
            run = world.run(index, case, limit_s(case, base_s))
            res.cases += 1
            failure = classify(run, info)
            if failure is None:
                res.cases_passed += 1
                _keep_bytes(res, run, info)
                continue
            if failure.verdict == "unsupported":
                unsupported.add(case.op or "*")
                if failure.sound:
                    continue
            world.kill()
            world = None
            if failure.verdict != "unsupported":
                return failure
        return None
    finally:
        if world is not None:
            world.close()


def _members(case: Case) -> list[int]:
    return list(case.group or range(case.world_size))


def classify(run: CaseRun, info: StudentFunction) -> Optional[Failure]:
    """None when every member returned torch's answer; else the failure."""
    case, results, states = run.case, run.results, run.states
    members = _members(case)
    got = {r: results[r] for r in members if r in results}
    raised = [r for r in members if got.get(r, {}).get("status") == "raised"]
    if raised:
        return _crash(run, raised, members)
    unsup = [r for r in members if got.get(r, {}).get("status") == "unsupported"]
    if unsup:
        return Failure("unsupported", case, got[unsup[0]].get("message", ""),
                       sound=len(got) == len(members))
    if run.dead:
        r = run.dead[0]
        code = run.exitcodes.get(r)
        how = (f"killed by {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exit code {code}")
        last = (states.get(r, {}).get("pending") or states.get(r, {}).get("history") or [None])[-1]
        text = f"rank {r} died ({how}, inside torch: no Python exception)"
        if last:
            text += f" in its call {D.describe(last).removeprefix('in ')}"
            text += D.peer_note(last, case.world_size)
        sizes = D.sizes_of_crash(states)
        if sizes:
            text = f"sizes differ: {sizes}: a send and its receive must have one size; {text}"
        return Failure("crash", case, text, [{"rank": r, "op": "died", "peer": None, "where": None,
                                              **({k: last[k] for k in ("op", "peer", "where")}
                                                 if last else {})}])
    if len(got) < len(members):
        returned = set(got)
        text, records = D.hang(members, states, returned, case.world_size)
        return Failure("hang", case, text, records)
    counts = {r: got[r].get("counts", {}) for r in members}
    if len({tuple(sorted(c.items())) for c in counts.values()}) > 1:
        return _unpaired(case, counts, members)
    pairing = D.pairing({r: got[r].get("p2p", []) for r in members})
    if pairing:
        return Failure("wrong", case, pairing + " (gloo let it pass; nccl and MPI need a send "
                       "and its receive of one size)", sound=True)
    wrong = [r for r in members if got[r].get("status") == "wrong"]
    if wrong:
        return _wrong(case, got, wrong, members, info)
    return None


def _crash(run: CaseRun, raised: list[int], members: list[int]) -> Failure:
    r = raised[0]
    res = run.results[r]
    where = res.get("where")
    text = f"rank {r} raised {res['type']}"
    if res.get("message"):
        text += f": {res['message']}"
    if where:
        text += f" at {D.short(where)}"
        if res.get("source"):
            text += f" ({res['source']})"
    records = [{"rank": q, "op": "raised", "peer": None, "where": run.results[q].get("where"),
                "error": f"{run.results[q]['type']}: {run.results[q].get('message', '')}"}
               for q in raised]
    sizes = D.sizes_of_crash(run.states)
    if sizes:
        return Failure("crash", run.case, f"sizes differ: {sizes}: a send and its receive must "
                       f"have one size (then {text})", records)
    last = (run.states.get(r, {}).get("history") or [None])[-1]
    note = D.peer_note(last, run.case.world_size) if last else ""
    if note:
        text += f"; its call {D.describe(last).removeprefix('in ')}{note}"
    if len(raised) > 1:
        text += f" (also {D.ranks_text(raised[1:])})"
    return Failure("crash", run.case, text, records)


def _unpaired(case: Case, counts: dict[int, dict], members: list[int]) -> Failure:
    ops = sorted({op for c in counts.values() for op in c})
    op = next(o for o in ops if len({c.get(o, 0) for c in counts.values()}) > 1)
    by = D.ranks_by_count({r: counts[r].get(op, 0) for r in members})
    text = (D.counts_text(op, by) + ": every rank returned only because gloo paired the calls "
            f"anyway; with another schedule, backend or the next collective, the extra {op} "
            "waits forever (every rank must make the same collective calls)")
    return Failure("hang", case, text,
                   [{"rank": r, "op": op, "peer": None, "where": None,
                     "count": counts[r].get(op, 0)} for r in members])


def _wrong(case: Case, got: dict[int, dict], wrong: list[int], members: list[int],
           info: StudentFunction) -> Failure:
    r = wrong[0]
    d = got[r]["difference"]
    if "message" in d:
        text = f"rank {r}: {d['message']}"
    else:
        text = (f"rank {r} holds {d['got']!r} at element {d['index']} where torch gives "
                f"{d['expected']!r} ({d['differing']} of {max(case.numel, 1)} elements differ)")
    right = [q for q in members if q not in wrong and got[q].get("status") == "ok"
             and got[q].get("compared", True)]
    if len(wrong) > 1:
        text += f"; {D.ranks_text(wrong[1:])} wrong too"
    if right:
        text += f"; {D.ranks_text(right)} right"
    res = got[r]
    if res.get("untouched"):
        note = "the tensor passed in was not written"
        if res.get("returned_right"):
            note += ", but the returned value is right"
        bound = [f"`{b['argument']}` in {b['function']}" for b in res.get("rebound", [])]
        lines = [f"line {ln}" for name, ln in info.rebinds
                 if any(b["argument"] == name for b in res.get("rebound", []))]
        if bound:
            note += (f": the function rebinds its argument {', '.join(bound)}"
                     + (f" ({', '.join(lines)})" if lines else "")
                     + ", so the result stays in a local; write into it in place "
                       "(tensor.copy_(...), torch.maximum(tensor, buff, out=tensor))")
        elif res.get("returned_right"):
            note += " (did the function rebind its argument?)"
        else:
            note = f"rank {r}'s tensor was never written"
        text += f"; {note}"
    records = [{"rank": q, "op": "wrong", "peer": None, "where": None,
                **{k: got[q]["difference"].get(k) for k in ("index", "expected", "got")}}
               for q in wrong]
    return Failure("wrong", case, text, records, sound=True)


def _keep_bytes(res: FunctionResult, run: CaseRun, info: StudentFunction) -> None:
    """The bytes of the largest whole-world case (float32, SUM or no op, the first root): the
    biggest world that passed it wins."""
    c = run.case
    if c.numel != LARGE or c.dtype != "float32" or c.group or c.op not in (None, "SUM") or (
            c.root not in (None, 0)):
        return
    if res.bytes is not None and res.bytes["world_size"] > c.world_size:
        return
    members = _members(c)
    sent = [run.results[r].get("sent", 0) for r in members]
    recv = [run.results[r].get("recv", 0) for r in members]
    bound, rounds = lower_bound(info.collective, c.numel, c.world_size, 4)
    res.bytes = {"world_size": c.world_size, "numel": c.numel, "dtype": c.dtype,
                 "sent": sent, "recv": recv,
                 "rounds": max(run.results[r].get("rounds", 0) for r in members),
                 "bound_bytes": bound, "bound_rounds": rounds,
                 "collectives": dict(run.results[members[0]].get("counts", {}))}


# What a check prints and keeps: a table of at most a screen, one line per failure saying where
# to look, and check.json.

COLUMNS = ("function", "collective", "verdict", "worlds passed", "bytes sent (busiest rank)",
           "rounds")


def _worlds(r: FunctionResult) -> str:
    if not r.worlds_checked:
        return "-"
    if r.worlds_passed == r.worlds_checked:
        return f"all ({r.worlds_checked[0]}-{r.worlds_checked[-1]})"
    return ",".join(map(str, r.worlds_passed)) or "none"


def _traffic(r: FunctionResult) -> tuple[str, str]:
    """The bytes and rounds columns ("-" below two ranks)."""
    b = r.bytes
    if not b or b["world_size"] < 2:
        return "-", "-"
    most = max(b["sent"])
    sent = f"{most / b['bound_bytes']:.2f}x the bound" if b["bound_bytes"] else f"{most} B"
    return f"{sent} (world {b['world_size']})", f"{b['rounds']} (bound {b['bound_rounds']})"


def rows(results: Sequence[FunctionResult]) -> list[tuple[str, ...]]:
    return [(r.name, r.collective, r.verdict, _worlds(r), *_traffic(r)) for r in results]


def table(results: Sequence[FunctionResult]) -> str:
    body = rows(results)
    widths = [max(len(c), *(len(row[i]) for row in body)) for i, c in enumerate(COLUMNS)]
    line = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
    return "\n".join([line(COLUMNS), line(["-" * w for w in widths]), *map(line, body)])


def failure_line(r: FunctionResult) -> Optional[str]:
    """One line: what failed, where, what to look at."""
    if r.verdict == "pass":
        return None
    f = r.first_failure
    if f is None:
        return f"{r.name}: {r.verdict}: {r.detail}"
    return f"{r.name}: {r.verdict} ({Case(**f).label()}): {r.detail}"


def text(results: Sequence[FunctionResult]) -> str:
    lines = [table(results)]
    fails = [ln for ln in map(failure_line, results) if ln]
    if fails:
        lines += ["", *fails]
    return "\n".join(lines)


def html_table(results: Sequence[FunctionResult]) -> str:
    """The same table for a notebook's cell."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>"
                   for row in rows(results))
    notes = "".join(f"<li>{html.escape(ln)}</li>" for ln in map(failure_line, results) if ln)
    return (f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"
            + (f"<ul>{notes}</ul>" if notes else ""))


def write(run_dir: Path, results: Sequence[FunctionResult], **extra) -> Path:
    path = run_dir / "check.json"
    write_json(path, {"functions": [_record(r) for r in results], **extra})
    return path


def _record(r: FunctionResult) -> dict:
    d = asdict(r)
    d["ranks"] = [{**x, "where": D.short(x["where"]) if x.get("where") else None,
                   "file": x.get("where")} for x in r.ranks]
    return d
