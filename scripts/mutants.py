"""The suite's own mutants: each deliberate break in tests/mutants/ must fail the test that
claims to guard it (docs/testing.md, "The suite's mutants").

    python scripts/mutants.py                 # every mutant against its named test
    python scripts/mutants.py lock-without-flock skip-reason-prefix   # some of them
    python scripts/mutants.py --all           # every mutant against the whole fast tier
    python scripts/mutants.py --list          # the mutants and their tests

A mutant is `tests/mutants/<name>.patch`: a unified diff (`git apply`) whose first line
`# expect: <pytest node id>` names the test that must fail on it. Each is applied to its
own temporary copy of this checkout (the files git tracks or would track: uncommitted
edits included; never this working tree), and pytest runs there (-n 0, PYTHONPATH the
copy). First the named tests run once on an unbroken copy: a test that fails without any
mutant catches nothing. Caught = pytest exits 1 and the named test is among the failures
(--all: any failure of `-m "not slow"`). Prints one row per mutant: mutant, test, caught,
seconds; exits 1 when one is not caught.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MUTANTS = REPO / "tests" / "mutants"
# the fast tier, less tests/test_mutants.py (it checks that each patch still applies: on a
# copy that already carries one, it would fail whatever the mutant breaks)
FAST = ["-m", "not slow", "--ignore=tests/test_mutants.py"]


def mutants(names: list[str]) -> list[tuple[str, str, str]]:
    """(name, expected node id, patch text) of each mutant (`names`: only those)."""
    out = []
    for path in sorted(MUTANTS.glob("*.patch")):
        if names and path.stem not in names:
            continue
        text = path.read_text()
        m = re.match(r"#\s*expect:\s*(\S+)", text)
        if not m:
            sys.exit(f"{path.relative_to(REPO)}: its first line must be '# expect: <node id>'")
        out.append((path.stem, m.group(1), text))
    missing = set(names) - {n for n, _, _ in out}
    if missing:
        sys.exit(f"no such mutant(s): {', '.join(sorted(missing))} (see --list)")
    return out


def copy_checkout(dest: Path) -> None:
    """The checkout's files as git sees them (tracked and untracked-not-ignored) into `dest`."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           cwd=REPO, capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():  # (a file deleted but not yet staged is listed, absent)
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def pytest(copy: Path, args: list[str], timeout: float) -> tuple[int, str, float]:
    env = dict(os.environ, PYTHONPATH=str(copy))
    env.pop("DDP_LAB_ALLOW_SKIPS", None)
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q",
                               "-rf", "-x", *args], cwd=copy, env=env, capture_output=True,
                              text=True, timeout=timeout)
        rc, out = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        rc, out = -1, f"timed out after {timeout:.0f} s\n{e.stdout or ''}"
    return rc, out if isinstance(out, str) else out.decode(), time.monotonic() - start


def failed(output: str) -> list[str]:
    """The node ids pytest's -rf summary names as failed."""
    return re.findall(r"^FAILED (\S+)", output, re.M)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="mutants to run (default: all)")
    ap.add_argument("--all", action="store_true", help='run the whole fast tier (-m "not slow", '
                    "3 workers) against each mutant, not only its named test")
    ap.add_argument("--list", action="store_true", help="list the mutants and their tests")
    ap.add_argument("--no-baseline", action="store_true",
                    help="skip the run of the named tests on an unbroken copy")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per pytest run")
    ap.add_argument("-v", "--verbose", action="store_true", help="print pytest's output")
    args = ap.parse_args()
    todo = mutants(args.names)
    if args.list:
        for name, expect, _ in todo:
            print(f"{name:32s} {expect}")
        return 0
    rows, bad = [], 0
    with tempfile.TemporaryDirectory(prefix="ddp_lab_mutants_") as tmp:
        clean = Path(tmp) / "clean"
        copy_checkout(clean)
        if not args.no_baseline:
            tests = sorted({e for _, e, _ in todo})
            rc, out, secs = pytest(clean, ["-n", "0", *tests], args.timeout)
            print(f"baseline: {len(tests)} named test(s) on the unbroken checkout: rc={rc} "
                  f"({secs:.0f} s)", flush=True)
            if rc != 0:
                print(out[-5000:])
                print("the named tests fail without any mutant: fix them first")
                return 1
        for name, expect, patch in todo:
            copy = Path(tmp) / name
            shutil.copytree(clean, copy)
            applied = subprocess.run(["git", "apply", "-"], cwd=copy, input=patch, text=True,
                                     capture_output=True)
            if applied.returncode != 0:
                rows.append((name, expect, "patch does not apply", 0.0))
                bad += 1
                print(f"{name}: git apply: {applied.stderr.strip()}", flush=True)
                continue
            target = FAST if args.all else ["-n", "0", expect]
            rc, out, secs = pytest(copy, target, args.timeout)
            names = failed(out)
            caught = rc == 1 and (args.all and bool(names) or
                                  any(f == expect or f.startswith(expect + "[") for f in names))
            verdict = "yes" if caught else f"NO (rc={rc})"
            bad += not caught
            rows.append((name, "fast tier: " + ", ".join(names[:2]) if args.all else expect,
                         verdict, secs))
            print(f"{name}: {verdict} in {secs:.0f} s", flush=True)
            if args.verbose or not caught:
                print(out[-4000:], flush=True)
            shutil.rmtree(copy, ignore_errors=True)
    widths = [max(len(str(r[i])) for r in rows + [("mutant", "test", "caught", "")])
              for i in range(3)]
    print()
    print(f"{'mutant':{widths[0]}}  {'test':{widths[1]}}  {'caught':{widths[2]}}  seconds")
    for name, test, verdict, secs in rows:
        print(f"{name:{widths[0]}}  {test:{widths[1]}}  {verdict:{widths[2]}}  {secs:7.1f}")
    print(f"{len(rows) - bad} of {len(rows)} mutant(s) caught")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
