"""`python -m ddp_lab.check FILE.py [FILE.py:function[=collective] ...] [check.KEY=VALUE ...]
[run.KEY=VALUE ...]`: a student's collectives against torch's, on real gloo ranks; the table,
one line per failure, check.json in the run folder, `run dir: PATH` last. Exit 0 when every
function passes, 1 when one does not, 2 for bad input (one line, before any process starts).

    python -m ddp_lab.check mine.py
    python -m ddp_lab.check mine.py:ring=all_reduce check.worlds=[3]
    python -m ddp_lab.check --template notebook > mine.py   # the exercises as stubs
"""

from __future__ import annotations

import shlex
import shutil
import sys
from importlib import resources
from pathlib import Path

TEMPLATES = ("notebook", "assignment")
USAGE = ("usage: python -m ddp_lab.check FILE.py [FILE.py:function[=collective] ...] "
         "[check.worlds=[1,2,3]] [check.timeout_s=3] [run.root=DIR]\n"
         "       python -m ddp_lab.check --template notebook|assignment > mine.py")


def _fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    if argv[0] == "--template":
        if len(argv) != 2:
            _fail("--template takes one name: notebook or assignment")
        if argv[1] not in TEMPLATES:
            _fail(f"--template {argv[1]}: choose one of {', '.join(TEMPLATES)}")
        sys.stdout.write((resources.files("ddp_lab.check") / "templates" / f"{argv[1]}.py")
                         .read_text())
        return 0
    from ..config.errors import UserError
    from ..config.student import find_functions, is_spec

    specs = [a for a in argv if is_spec(a)]
    overrides = [a for a in argv if not is_spec(a)]
    if not specs:
        _fail(f"no FILE.py given ({' '.join(overrides) or 'nothing'}): {USAGE.splitlines()[0]}")
    bad = next((a for a in overrides if a.startswith("-") or "=" not in a), None)
    if bad:
        _fail(f"{bad}: neither a .py file nor a key=value override")
    cfg = _compose(overrides)
    worlds = list(cfg.check.worlds)
    if not worlds or any(int(w) < 1 for w in worlds):
        _fail(f"check.worlds={worlds}: give world sizes >= 1 (e.g. check.worlds=[1,2,3])")
    if any(int(w) > 32 for w in worlds):
        _fail(f"check.worlds={worlds}: at most 32 ranks are forked on one machine")
    if not cfg.check.timeout_s > 0:
        _fail(f"check.timeout_s={cfg.check.timeout_s}: must be > 0 seconds")
    try:
        for spec in specs:
            find_functions(spec)
        # importing runs the student's top level: torch only now
        from ..collectives.student import functions

        items = [item for spec in specs for item in functions(spec)]
    except UserError as e:
        _fail(str(e))
    from ..folder.rundir import make_run_dir
    from . import run_check, verdicts

    stem = Path(specs[0].partition(":")[0]).stem
    run_dir = make_run_dir(cfg, label=f"check_{stem}")
    (run_dir / "code").mkdir(exist_ok=True)
    for path in {info.path for _, info, _ in items}:
        shutil.copy2(path, run_dir / "code" / Path(path).name)
    (run_dir / "command.txt").write_text(
        "python -m ddp_lab.check " + " ".join(shlex.quote(a) for a in argv) + "\n")
    results = run_check(items, run_dir / "logs", worlds, float(cfg.check.timeout_s),
                        progress=lambda line: print(line, flush=True))
    verdicts.write(run_dir, results, worlds=worlds, files=sorted({i.path for _, i, _ in items}))
    print()
    print(verdicts.text(results))
    print(f"run dir: {run_dir}")
    return 0 if results.passed else 1


def _compose(overrides: list[str]):
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ..command.mistakes import hydra_message
    from ..config import compose
    from . import config as check_config

    check_config.register_check_configs()
    try:
        return compose(overrides, config_name="check")
    except (HydraException, OmegaConfBaseException) as e:
        _fail(hydra_message(e, (check_config,)))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
