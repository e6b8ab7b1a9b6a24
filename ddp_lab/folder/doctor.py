"""doctor.json: the doctor's verdicts kept in their own folder under run.root
(`doctor_<date>_<time>/doctor.json`, written atomically), with the allocation's fingerprint id, so
that a run on the same fingerprint, and the report, find them. No torch, nothing of the ranks: the
trainer's rank 0, the report and the doctor's submitting side all read it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

from .files import read_json_or_empty, write_json

FILE = "doctor.json"
KIND = "doctor"


def write(folder: Path, doc: dict) -> Path:
    path = Path(folder) / FILE
    write_json(path, {"kind": KIND, **doc})
    return path


def find(roots: Iterable[Path]) -> list[tuple[Path, dict]]:
    """Every doctor.json directly under each root (or a root that is a doctor folder itself),
    oldest first by its `finished` time."""
    found = {}
    for root in roots:
        root = Path(root)
        paths = [root / FILE] if (root / FILE).is_file() else sorted(root.glob(f"*/{FILE}"))
        for path in paths:
            doc = read_json_or_empty(path)
            if doc.get("kind") == KIND:
                found[path.resolve()] = doc
    return sorted(found.items(), key=lambda kv: str(kv[1].get("finished", "")))


def failing(doc: dict) -> list[str]:
    """The lines of the doctor's checks that failed."""
    return [c["line"] for c in doc.get("checks", []) if not c.get("ok")]


def run_warnings(root: Path, fingerprint_id: Optional[str]) -> list[str]:
    """What a run starting on this fingerprint says first when the newest doctor of it under
    `root` failed a check (nothing when it passed, or no doctor ran)."""
    if not fingerprint_id:
        return []
    same = [(p, d) for p, d in find([root]) if d.get("fingerprint_id") == fingerprint_id]
    bad = failing(same[-1][1]) if same else []
    if not bad:
        return []
    path, doc = same[-1]
    return [f"this allocation (fingerprint {fingerprint_id}) failed {len(bad)} doctor "
            f"check(s) at {doc.get('finished', '?')} ({path}):", *(f"  {b}" for b in bad)]
