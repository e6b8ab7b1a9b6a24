"""A student's function checked before a run that uses it starts:
`sync=custom sync.all_reduce=FILE.py:fn` and `bench.impl=[FILE.py:fn]`
run `python -m ddp_lab.check` on it at the run's world size, in a
process of its own (the submitting side imports no torch), and a
function that does not pass is refused in one line naming its verdict.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from ..config.student import one_function

#: the most ranks the check forks on this machine for a larger run
MOST_RANKS = 16


def refusal(spec: str, collective: str, world: int, key: str,
            ops: tuple[str, ...] = ("SUM",)) -> Optional[str]:
    """None when `spec`'s function passes its check at `world` ranks
    for `ops` (one it does not implement at all is fine: a run uses
    SUM); else the one-line refusal."""
    f = one_function(spec, collective, key)
    w = max(1, min(world, MOST_RANKS))
    with tempfile.TemporaryDirectory(prefix="ddp_lab_precheck_") as tmp:
        cmd = [sys.executable, "-m", "ddp_lab.check", f"{f.path}:{f.name}={collective}",
               f"check.worlds=[{w}]", f"run.root={tmp}"]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return f"{key}={spec}: its check at world {w} did not end in 600 s"
        found = list(Path(tmp).glob("*/check.json"))
        if not found:
            err = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return f"{key}={spec}: the check could not run: {err}"
        record = json.loads(found[0].read_text())["functions"][0]
    verdict = record["verdict"]
    if verdict == "pass" or (verdict == "unsupported" and not set(ops) & set(
            record.get("unsupported") or [])):
        return None
    return (f"{key}={spec}: {f.name} does not pass its check at world {w}: {verdict}: "
            f"{record.get('detail', '')} (python -m ddp_lab.check {f.path}:{f.name} shows every "
            "case)")
