"""What a check prints and keeps: a table of at most a screen, one line
per failure saying where to look, and check.json."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Optional, Sequence

from ..folder.files import write_json
from . import diagnose as D
from .verdicts import FunctionResult

COLUMNS = ("function", "collective", "verdict", "worlds passed", "bytes sent (busiest rank)",
           "rounds")


def _worlds(r: FunctionResult) -> str:
    if not r.worlds_checked:
        return "-"
    if r.worlds_passed == r.worlds_checked:
        return f"all ({r.worlds_checked[0]}-{r.worlds_checked[-1]})"
    return ",".join(map(str, r.worlds_passed)) or "none"


def _bytes(r: FunctionResult) -> str:
    b = r.bytes
    if not b or b["world_size"] < 2:
        return "-"
    most = max(b["sent"])
    if not b["bound_bytes"]:
        return f"{most} B (world {b['world_size']})"
    return f"{most / b['bound_bytes']:.2f}x the bound (world {b['world_size']})"


def _rounds(r: FunctionResult) -> str:
    b = r.bytes
    if not b or b["world_size"] < 2:
        return "-"
    return f"{b['rounds']} (bound {b['bound_rounds']})"


def rows(results: Sequence[FunctionResult]) -> list[tuple[str, ...]]:
    return [(r.name, r.collective, r.verdict, _worlds(r), _bytes(r), _rounds(r))
            for r in results]


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
    case = [f"world {f['world_size']}", f"{f['numel']} elements", f["dtype"]]
    if f.get("op"):
        case.append(f"op {f['op']}")
    if f.get("root") is not None:
        case.append(f"root {f['root']}")
    if f.get("group"):
        case.append(f"group {f['group']}")
    return f"{r.name}: {r.verdict} ({', '.join(case)}): {r.detail}"


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
    d = r.as_dict()
    d["ranks"] = [{**x, "where": D.short(x["where"]) if x.get("where") else None,
                   "file": x.get("where")} for x in r.ranks]
    return d
