"""Docstrings and comments of ddp_lab/ that name a file, a module or a run
folder's name say what is: every path named exists, every `ddp_lab.x.y` is a
module (or a name in one), and every folder-name pattern
(`<label>_<date>_<time>`) is in the order folder/rundir.py makes names in."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from ddp_lab.folder.rundir import make_run_dir

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "ddp_lab"
# folders of the checkout a path in a docstring may start with
TOPS = ("ddp_lab", "tests", "docs", "scripts", "conf", "launchers")
# the subpackages of ddp_lab: a path may also start at one (`sync/ring.py`)
SUBPACKAGES = tuple(sorted(p.name for p in PACKAGE.iterdir()
                           if (p / "__init__.py").is_file()))
# a path: a top folder, then words and slashes, ending in a file's extension;
# not inside a longer path (no word, dot, slash or dash before it)
PATH = re.compile(r"(?<![\w./-])((?:%s)/[\w./-]*\w\.(?:py|md|yaml|sh|toml))\b"
                  % "|".join(TOPS + SUBPACKAGES))
MODULE = re.compile(r"(?<![\w./-])ddp_lab(?:\.\w+)+")
FOLDER_NAME = re.compile(r"[\w<>.-]*<(?:date|time)>[\w<>.-]*")


def sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def texts(path: Path, strings: bool = False) -> list[tuple[int, str]]:
    """(line, text) of each docstring and comment of `path`; with `strings`, of
    every string constant too (help texts, messages)."""
    code = path.read_text()
    tree = ast.parse(code)
    out = []
    kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.walk(tree):
        text = isinstance(node, ast.Constant) and isinstance(node.value, str)
        if strings and text:
            out.append((node.lineno, node.value))
        if not strings and isinstance(node, kinds):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                out.append((node.body[0].lineno, doc))
    for tok in tokenize.generate_tokens(io.StringIO(code).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string))
    return out


def where(path: Path, line: int) -> str:
    shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
    return f"{shown}:{line}"


def path_exists(named: str) -> bool:
    """A path from the checkout's root, or from ddp_lab/ (`sync/ring.py`)."""
    top = named.split("/", 1)[0]
    base = PACKAGE if top in SUBPACKAGES and top not in TOPS else REPO
    return (base / named).exists()


def module_exists(dotted: str) -> bool:
    """`ddp_lab.a.b`: a package or module, or a name defined at the top of a
    module (`ddp_lab.command.cli.SweepTable`; a method: its class)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        base, rest = REPO.joinpath(*parts[:n]), parts[n:]
        found = base.with_suffix(".py")
        if base.is_dir():
            found = base / "__init__.py"
            if not rest:  # a package, or a folder of modules (bench/specs)
                return any(base.glob("*.py"))
        if found.is_file():
            return not rest or rest[0] in top_names(found)
        if base.is_dir():
            return False
    return False


DEFINITIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def top_names(path: Path) -> set[str]:
    """The names a module defines or imports at its top level."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, DEFINITIONS):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0]
                         for a in node.names)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets
                         if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign):
            if isinstance(node.target, ast.Name):
                names.add(node.target.id)
    return names


def missing_paths(files: list[Path]) -> list[str]:
    return [f"{where(f, line)}: {named}"
            for f in files for line, text in texts(f)
            for named in PATH.findall(text) if not path_exists(named)]


def missing_modules(files: list[Path]) -> list[str]:
    return [f"{where(f, line)}: {dotted}"
            for f in files for line, text in texts(f)
            for dotted in MODULE.findall(text) if not module_exists(dotted)]


def rundir_pattern(tmp_path: Path) -> re.Pattern:
    """The name folder/rundir.py makes, as a pattern of the placeholders: a run
    made with the label LABEL, its date and time replaced by <date> and <time>,
    then LABEL by any non-empty name (`(.+)_<date>_<time>`)."""
    cfg = OmegaConf.create({"run": {"dir": None, "root": str(tmp_path),
                                    "name": None}})
    name = make_run_dir(cfg, label="LABEL").name
    made = re.sub(r"\d{4}-\d\d-\d\d", "<date>", name)
    made = re.sub(r"\d\d-\d\d-\d\d", "<time>", made)
    parts = set(re.findall(r"<\w+>|LABEL", made))
    assert {"<date>", "<time>", "LABEL"} <= parts, name
    return re.compile("^" + re.escape(made).replace("LABEL", ".+") + "$")


def wrong_folder_names(files: list[Path],
                       pattern: re.Pattern) -> list[str]:
    """Each folder name with <date> or <time> that `pattern` does not match."""
    wrong = []
    for f in files:
        for line, text in texts(f, strings=True):
            for named in FOLDER_NAME.findall(text):
                named = named.rstrip(".")
                if not pattern.match(named):
                    wrong.append(f"{where(f, line)}: {named}")
    return sorted(set(wrong))


def test_every_path_named_exists():
    missing = missing_paths(sources())
    assert not missing, "no such file:\n" + "\n".join(missing)


def test_every_module_named_exists():
    missing = missing_modules(sources())
    assert not missing, "no such module or name:\n" + "\n".join(missing)


def test_folder_names_are_in_rundirs_order(tmp_path):
    pattern = rundir_pattern(tmp_path)
    assert pattern.match("<label>_<date>_<time>")
    wrong = wrong_folder_names(sources(), pattern)
    made = f"not the order rundir.py makes ({pattern.pattern}):\n"
    assert not wrong, made + "\n".join(wrong)


@pytest.mark.parametrize("planted, check", [
    ("# as ddp_lab/sync/nowhere.py does", missing_paths),
    ("# as sync/nowhere.py does", missing_paths),
    ("# as ddp_lab.sync.nowhere does", missing_modules),
    ("# as ddp_lab.sync.ring.no_such_name does", missing_modules),
])
def test_a_wrong_name_is_found(tmp_path, planted, check):
    """The checks above can fail: a module's copy with one wrong name added."""
    copy = tmp_path / "ring.py"
    text = (PACKAGE / "sync" / "ring.py").read_text()
    copy.write_text(text + planted + "\n")
    found = check([copy])
    assert len(found) == 1 and planted.split()[-2] in found[0], found


def test_a_folder_name_in_another_order_is_found(tmp_path):
    pattern = rundir_pattern(tmp_path / "runs")
    bad = tmp_path / "bad.py"
    bad.write_text('"""A new `run.root/studies/<date>_<time>_<label>`."""\n')
    found = wrong_folder_names([bad], pattern)
    assert found and "<date>_<time>_<label>" in found[0], found
