"""The report's section on the allocations' doctor checks (`python -m
ddp_lab.doctor`, docs/doctor.md): each doctor.json found beside the
runs, its verdict, and the runs of the same fingerprint, so a slow
series can be read beside what the doctor said of its nodes."""

from __future__ import annotations

from pathlib import Path

from ..folder import doctor as records


def doctor_markdown(runs) -> list[str]:
    """Markdown lines (none when no doctor ran where the runs are)."""
    roots = {Path(r.path).parent for r in runs} | {Path(r.path) for r in runs}
    docs = records.find(roots)
    if not docs:
        return []
    by_fid: dict[str, list[str]] = {}
    for r in runs:
        if r.kind == "train" and r.ok:
            by_fid.setdefault(r.fingerprint_id, []).append(Path(r.path).name)
    lines = ["## The allocations' doctor checks", "",
             "`python -m ddp_lab.doctor` before the runs (docs/doctor.md): each allocation's "
             "checks beside its training runs of the same fingerprint.", "",
             "| fingerprint | doctor | finished | took | verdict | runs of this fingerprint |",
             "| --- | --- | --- | ---: | --- | --- |"]
    for path, doc in docs:
        bad = records.failing(doc)
        verdict = (f"{len(doc.get('checks', []))} checks ok" if not bad else
                   f"{len(bad)} FAIL: " + "; ".join(b.removeprefix("FAIL ") for b in bad))
        fid = doc.get("fingerprint_id") or "?"
        same = by_fid.get(fid, [])
        lines.append(f"| {fid} | {path.parent.name} | {doc.get('finished', '?')} | "
                     f"{doc.get('elapsed_s', 0):.0f} s | {verdict.replace('|', '/')} | "
                     f"{', '.join(same) or '-'} |")
    return lines + [""]
