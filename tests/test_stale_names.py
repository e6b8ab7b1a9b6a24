"""The code says what is: every module, file and folder that a docstring or a comment of
ddp_lab/ names exists, and every folder docs/ names in code (`predict/`) too. A module
moved or merged leaves no pointer behind to where it was.

What counts as a name (the docs' own paths and modules: test_docs_truth.py):
- a path `ddp_lab/x/y.py`, `x/y.py` or `x/` (from the checkout, from ddp_lab/, or beside
  the file that names it), and a bare `y.py` (beside the file, in ddp_lab/ or the
  checkout's top);
- a dotted `ddp_lab.x.y`: a module, or a name a module defines;
- a folder in code (`` `x/` ``): one of ddp_lab/ or the checkout's, or one the run folder
  holds (RUN_FOLDER).

Fast: reads the files, starts no process."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from functools import cache
from pathlib import Path

from helpers import REPO
from test_docs_truth import module_problem

PACKAGE = REPO / "ddp_lab"
# what a run folder (and a study's, a check's) holds: named as folders, not modules
RUN_FOLDER = {"tb", "checkpoints", "logs", "points", "report", "outputs", "runs", "sweeps",
              "heartbeat", "flight_recorder", "trace", "profile", "MNIST", "raw", "code"}
# other programs' folders: sysfs's (`ports/`), a SLURM cluster's state (`state/`, `log/`)
ELSEWHERE = {"ports", "log", "run", "state"}
# placeholders and a user's own files: `sync/<name>.py`, `FILE.py`, `my_ring.py`, `mine.py`
PLACEHOLDER = re.compile(r"<|\*|\{|\.\.\.|(^|/)my_|^[A-Z]+\.py$|(^|/)(x|mine|file)\.py$")


def notes(source: str) -> list[tuple[int, str]]:
    """(line, text) of every comment and docstring of a module's source."""
    out = [(tok.start[0], tok.string) for tok in
           tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                first = node.body[0].lineno
                out += [(first + i, line) for i, line in enumerate(doc.splitlines())]
    return out


@cache
def top_files() -> frozenset[str]:
    return frozenset(p.name for base in (REPO, PACKAGE, REPO / "scripts", REPO / "tests")
                     for p in base.glob("*.py"))


def path_problem(token: str, here: Path) -> str | None:
    """None if `token` (a path a note names in `here`) exists."""
    token = token.rstrip(".,:;)'\"")
    if PLACEHOLDER.search(token):
        return None
    if "/" not in token:
        if (here.parent / token).exists() or token in top_files():
            return None
        return f"no file {token} beside it, in ddp_lab/ or at the top"
    bases = (REPO, PACKAGE, here.parent, here.parent.parent)
    if any((base / token).exists() for base in bases):
        return None
    if token.endswith("/") and token.rstrip("/").split("/")[-1] in RUN_FOLDER | ELSEWHERE:
        return None
    return f"no such path {token}"


def stale_names(text: str, here: Path) -> list[str]:
    """What `text`, a comment or docstring line of the file `here`, names that does not
    exist."""
    out = []
    for token in re.findall(r"(?<![\w/.$~-])((?:[\w-]+/)+[\w-]+\.py)\b", text):
        out.append(path_problem(token, here))
    for token in re.findall(r"(?<![\w/.$~-])(\w+\.py)\b", text):
        out.append(path_problem(token, here))
    for token in re.findall(r"`((?:\w+/)+)`", text):
        out.append(path_problem(token, here))
    for dotted in re.findall(r"(?<![\w.])(ddp_lab(?:\.\w+)+)", text):
        # a folder of modules without __init__.py (bench/specs/) is one too
        if not (REPO / dotted.replace(".", "/")).is_dir():
            out.append(module_problem(dotted))
    return [p for p in out if p]


def docs_folder_problems() -> list[str]:
    out = []
    for page in sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]:
        for n, line in enumerate(page.read_text().splitlines(), 1):
            for token in re.findall(r"`((?:\w+/)+)`", line):
                problem = path_problem(token, PACKAGE / "__init__.py")
                if problem:
                    out.append(f"{page.relative_to(REPO)}:{n}: {problem}")
    return out


def test_every_name_in_the_code_s_notes_exists():
    problems = []
    for file in sorted(PACKAGE.rglob("*.py")):
        for n, text in notes(file.read_text()):
            problems += [f"{file.relative_to(REPO)}:{n}: {p}" for p in stale_names(text, file)]
    assert not problems, f"{len(problems)} stale names:\n" + "\n".join(sorted(set(problems)))


def test_every_folder_the_docs_name_exists():
    problems = docs_folder_problems()
    assert not problems, f"{len(problems)} stale folders:\n" + "\n".join(problems)


def test_the_names_that_went_stale_before_are_caught():
    """The cost model's old folder and the rank's old single file, as they stood."""
    init, job = PACKAGE / "__init__.py", PACKAGE / "command" / "job.py"
    assert stale_names("model), `measure/` (the cost model), `bench/`,", init)
    assert stale_names("rank.py (`rank_main` -> `run_rank`).", job)
    assert stale_names("see ddp_lab.measure.costmodel", job)
    assert stale_names("(ddp_lab/measure/costmodel.py)", job)
    assert not stale_names("`predict/` (the cost model), rank/main.py, ddp_lab.predict", init)
