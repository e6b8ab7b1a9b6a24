"""A module moved or merged leaves no pointer behind to where it was. test_docstrings.py
holds the paths (`sync/ring.py`) and modules (`ddp_lab.x.y`) that ddp_lab/'s docstrings and
comments name; this file holds the rest of a name:
- a bare file name (`job.py`): beside the file that names it, or in ddp_lab/, scripts/,
  tests/ or the checkout's top;
- a folder in code (`` `predict/` ``), there and in docs/ and README.md: one of ddp_lab/'s
  or the checkout's, or one a run folder holds (RUN_FOLDER).

Fast: reads the files, starts no process."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from test_docstrings import PACKAGE, REPO, module_exists, path_exists, sources, texts, where

# what a run folder (a study's, a check's) holds, and a dataset's folders
RUN_FOLDER = {"tb", "checkpoints", "logs", "points", "report", "outputs", "runs", "sweeps",
              "heartbeat", "flight_recorder", "trace", "profile", "MNIST", "raw", "code"}
# other programs' folders: sysfs's (`ports/`), a SLURM cluster's state (`state/`, `log/`)
ELSEWHERE = {"ports", "log", "run", "state"}
# placeholders and a user's own files: `FILE.py`, `my_ring.py`, `mine.py`
PLACEHOLDER = re.compile(r"^(my_\w*|mine|file|x|[A-Z_]+)\.py$")
BARE_FILE = re.compile(r"(?<![\w/.$~-])(\w+\.py)\b")
FOLDER = re.compile(r"`((?:\w+/)+)`")


@cache
def top_files() -> frozenset[str]:
    return frozenset(p.name for base in (REPO, PACKAGE, REPO / "scripts", REPO / "tests")
                     for p in base.glob("*.py"))


def folder_exists(named: str, here: Path) -> bool:
    return (named.rstrip("/").split("/")[-1] in RUN_FOLDER | ELSEWHERE
            or any((base / named).is_dir() for base in (REPO, PACKAGE, here.parent)))


def stale_names(text: str, here: Path) -> list[str]:
    """What `text`, a docstring or comment of the file `here`, names that does not
    exist."""
    files = [name for name in BARE_FILE.findall(text) if not PLACEHOLDER.match(name)
             and not (here.parent / name).is_file() and name not in top_files()]
    folders = [name for name in FOLDER.findall(text) if not folder_exists(name, here)]
    return files + folders


def test_every_bare_file_and_folder_the_code_names_exists():
    problems = [f"{where(f, line)}: {name}" for f in sources() for line, text in texts(f)
                for name in stale_names(text, f)]
    assert not problems, f"{len(problems)} stale names:\n" + "\n".join(sorted(set(problems)))


def test_every_folder_the_docs_name_exists():
    here = PACKAGE / "__init__.py"
    problems = [f"{page.relative_to(REPO)}:{n}: {name}"
                for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
                for n, line in enumerate(page.read_text().splitlines(), 1)
                for name in FOLDER.findall(line) if not folder_exists(name, here)]
    assert not problems, f"{len(problems)} stale folders:\n" + "\n".join(problems)


def test_the_names_that_went_stale_before_are_caught():
    """The cost model's old folder and the rank's old single file, as they were named,
    with test_docstrings.py's checks of paths and modules beside these."""
    init, job = PACKAGE / "__init__.py", PACKAGE / "command" / "job.py"
    assert stale_names("`world/`, `measure/` (the cost model), `bench/`,", init) == ["measure/"]
    assert stale_names("is rank.py (`rank_main` -> `run_rank`).", job) == ["rank.py"]
    assert not module_exists("ddp_lab.measure.costmodel") and not path_exists("measure/x.py")
    assert not stale_names("`predict/` (the cost model), rank/main.py, job.py, lock.py", job)
