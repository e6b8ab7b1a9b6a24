"""Random override sets through `python -m ddp_lab`, one process each, as a user types
them: every one must end in exit 0, or exit 2 with one line `error: ...`, and no traceback.

    python scripts/override_fuzz.py --real 30     # ranks start: 1 epoch of 2 steps each
    python scripts/override_fuzz.py --dry 300     # launcher.dry_run=true (the suite runs
                                                  # these in-process: tests/test_override_fuzz.py)

The sets come from tests/override_sets.py (seeded: --seed). Run by hand, not in the suite:
30 real runs take ~10 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from override_sets import override_sets  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--real", type=int, default=0, help="this many sets started for real")
    ap.add_argument("--dry", type=int, default=0, help="this many sets as dry runs")
    ap.add_argument("--seed", type=int, default=4545)
    ap.add_argument("--timeout", type=float, default=600)
    args = ap.parse_args()
    bad = 0
    with tempfile.TemporaryDirectory(prefix="ddp_lab_fuzz_") as tmp:
        env = dict(os.environ, HYDRA_FULL_ERROR="1",
                   PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        plan = ([(w, ["launcher.dry_run=true"]) for w in override_sets(args.seed, args.dry)]
                + [(w, ["train.max_steps_per_epoch=2", "train.epochs=1", "log.progress=lines"])
                   for w in override_sets(args.seed + 1, args.real)])
        counts: dict[str, int] = {}
        for i, (words, fixed) in enumerate(plan):
            cmd = [sys.executable, "-m", "ddp_lab", *words, *fixed,
                   f"run.root={tmp}/runs", f"data.root={tmp}/data"]
            start = time.monotonic()
            try:
                proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True,
                                      timeout=args.timeout)
                rc, out, err = proc.returncode, proc.stdout, proc.stderr
            except subprocess.TimeoutExpired as e:
                rc, out, err = "timeout", str(e.stdout or ""), str(e.stderr or "")
            lines = [ln for ln in err.splitlines() if ln.strip()]
            ok = ("Traceback" not in out + err and
                  (rc == 0 or (rc == 2 and len(lines) == 1 and lines[0].startswith("error: "))))
            bad += not ok
            counts[f"rc={rc}"] = counts.get(f"rc={rc}", 0) + 1
            kind = "real" if "train.epochs=1" in fixed else "dry"
            first = lines[-1][:110] if rc != 0 and lines else ""
            print(f"{i:3d} {kind} rc={rc} {time.monotonic() - start:5.1f}s "
                  f"{'ok ' if ok else 'BAD'} {' '.join(words)[:90]}  {first}", flush=True)
            if not ok:
                print(f"    stdout: {out[-1500:]}\n    stderr: {err[-3000:]}", flush=True)
    print(f"{len(plan)} set(s): {counts}; {bad} broke the rule (traceback, or exit "
          "other than 0 / 2 with one line)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
