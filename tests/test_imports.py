"""ddp_lab's modules import one another without a cycle (issue 18: one place per idea).

Every `import` of every module counts, at module level or inside a function: a function's
import is a dependency too, only a later one. Relative imports are resolved; `from pkg
import name` is an edge to `pkg.name` when that is a module, else to `pkg`. A package's
`__init__` is a module like any other: `from . import x` inside it is an edge to `x`, and a
submodule's `from . import y` is an edge to the package. Fast: reads the sources with
`ast`, imports nothing, starts no process.

The same reading, of module-level imports only, checks start-up: what `python -m ddp_lab
--help` and the ranks' entries load before their first line runs (no torch: --help needs
none, and a rank must set OMP_WAIT_POLICY before torch loads, see ddp_lab/world/cpu.py).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import ddp_lab

from helpers import child_env, describe

ROOT = Path(ddp_lab.__file__).resolve().parent
PACKAGE = "ddp_lab"


def module_files() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _import_nodes(tree: ast.AST, module_level: bool):
    """Every import statement; with `module_level`, only those that run when the module is
    imported (not inside a function, nor under `if TYPE_CHECKING:`)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif module_level and isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        elif (module_level and isinstance(node, ast.If)
              and "TYPE_CHECKING" in ast.unparse(node.test)):
            yield from (n for child in node.orelse for n in _import_nodes(child, module_level))
        else:
            yield from _import_nodes(node, module_level)


def imports_of(name: str, path: Path, modules: set[str],
               module_level: bool = False) -> tuple[set[str], set[str]]:
    """(the package's modules, the other top-level packages) that `name` (at `path`)
    imports: anywhere in its source, or with `module_level` when it is imported."""
    is_package = path.name == "__init__.py"
    here = name if is_package else name.rpartition(".")[0]  # what `from .` means
    edges: set[str] = set()
    external: set[str] = set()

    def add(target: str) -> None:
        if target.partition(".")[0] != PACKAGE:
            external.add(target.partition(".")[0])
            return
        # the longest prefix that is one of ours (import ddp_lab.a.b.func -> ddp_lab.a.b)
        while target and target not in modules:
            target = target.rpartition(".")[0]
        if target and target != name:
            edges.add(target)

    for node in _import_nodes(ast.parse(path.read_text(), str(path)), module_level):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        else:
            if node.level:
                base = here
                for _ in range(node.level - 1):
                    base = base.rpartition(".")[0]
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                add(sub if sub in modules else base)
    external.discard("__future__")
    return edges, external


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    return {name: imports_of(name, path, set(files))[0] for name, path in files.items()}


def loaded_at_import(start: str) -> dict[str, set[str]]:
    """Every module of ours that importing `start` runs (its packages' `__init__` too),
    each with the other top-level packages it imports as it loads."""
    files = module_files()
    seen: dict[str, set[str]] = {}
    todo = [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        edges, external = imports_of(name, files[name], set(files), module_level=True)
        seen[name] = external
        parents = [name.rsplit(".", k)[0] for k in range(1, name.count(".") + 1)]
        todo += [m for m in (*edges, *parents) if m not in seen]
    return seen


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (depth-first search, deterministic order)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_the_graph_sees_the_package():
    graph = import_graph()
    assert {"ddp_lab", "ddp_lab.command.job", "ddp_lab.launch", "ddp_lab.launch.runai",
            "ddp_lab.command.study", "ddp_lab.command.validate", "ddp_lab.command.cli"} <= set(graph)
    assert "ddp_lab.folder.rundir" in graph["ddp_lab.command.job"]  # module level, relative
    assert "ddp_lab.launch.slurm" in graph["ddp_lab.command.study"]  # inside a function


def test_find_cycle_names_the_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_generic_cli_knows_no_entry_point():
    """ddp_lab.command.cli serves `python -m ddp_lab` and `python -m ddp_lab.bench`: each entry
    point passes it what it needs; it imports neither the bench nor the trainer's checks."""
    graph = import_graph()
    assert not {m for m in graph["ddp_lab.command.cli"]
                if m.startswith("ddp_lab.bench") or m in ("ddp_lab.command.validate", "ddp_lab.command.study")}


@pytest.mark.parametrize("entry", ["ddp_lab.__main__", "ddp_lab.bench.worker", "ddp_lab.worker",
                                   "ddp_lab.status", "ddp_lab.command.study",
                                   "ddp_lab.report.__main__", "ddp_lab.doctor.__main__",
                                   "ddp_lab.doctor.probe"])
def test_entry_points_load_no_torch_at_import(entry):
    """`python -m ddp_lab --help` and a dry run's checks before the first torch-bound rule;
    the ranks' entries until rank_main set OMP_WAIT_POLICY; status, the report (it reads
    files: torch was 2.5 s of its start) and the study's batch-script side (`python -m
    ddp_lab.command.study done|end`) never."""
    loads = {m: ext & {"torch", "torchvision"} for m, ext in loaded_at_import(entry).items()}
    assert not any(loads.values()), f"{entry} loads torch at import through " + ", ".join(
        sorted(m for m, ext in loads.items() if ext))


@pytest.mark.parametrize("module", ["ddp_lab.config", "ddp_lab.sync", "ddp_lab.config.sync"])
def test_the_config_and_the_sync_schemas_load_no_torch(module):
    """Each synchroniser's keys and rules sit in config/sync.py, yet the submitting
    side reads them without torch: ddp_lab.sync loads its torch-bound names on first use."""
    loads = {m: ext & {"torch", "torchvision"} for m, ext in loaded_at_import(module).items()}
    assert not any(loads.values()), f"{module} loads torch at import through " + ", ".join(
        sorted(m for m, ext in loads.items() if ext))
    proc = subprocess.run([sys.executable, "-c", f"import sys, {module}; "
                           "assert 'torch' not in sys.modules, sorted(sys.modules)"],
                          env=child_env(), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, describe(proc)


def test_the_sync_package_serves_its_names_on_first_use():
    proc = subprocess.run([sys.executable, "-c", "import sys, ddp_lab.sync as s; "
                           "assert 'torch' not in sys.modules; "
                           "assert s.build_sync is s.build.build_sync and 'torch' in sys.modules; "
                           "assert s.sync_class('ring').name == 'ring'; "
                           "import pytest\n"
                           "with pytest.raises(AttributeError): s.no_such_name"],
                          env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, describe(proc)


@pytest.mark.parametrize("entry, args", [
    ("ddp_lab", ["sync=hierarchical", "model=cnn"]),
    ("ddp_lab.bench", ["bench.ops=[all_reduce,broadcast]", "bench.impl=[torch,ring]"]),
], ids=["train", "bench"])
def test_a_dry_run_never_imports_torch(tmp_path, entry, args):
    """Every check before a launch (sync and model rules, dist.backend x dist.device on a
    CPU machine, the bench's ops and implementations) needs no torch: a command answers in
    about a second, not after torch's seconds of import (the submitter does not train)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", entry, *args,
                           f"run.root={tmp_path}", "launcher.dry_run=true"],
                          cwd=tmp_path, env=child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, describe(proc)
    imported = {line.rsplit("|", 1)[-1].strip() for line in proc.stderr.splitlines()
                if line.startswith("import time:")}
    assert "ddp_lab.command.validate" in imported and "torch" not in imported


def test_the_bench_configs_table_is_the_ops():
    """bench/config.py's OPS (read by the submitter) is what bench/ops.py runs: ops.py
    refuses to import otherwise; here, the table itself."""
    from ddp_lab.bench import config, ops

    assert {n: tuple(op.impls) for n, op in ops.OPS.items()} == dict(config.OPS)


def test_xdist_groups_reach_the_scheduler(request):
    """Under pytest-xdist every test carries its group in its node id (tests/conftest.py):
    without it, --dist loadgroup silently spreads a file's tests and the SLURM tests over
    both workers (seen with pytest 9 and xdist 3.8: two clusters a session)."""
    if not hasattr(request.config, "workerinput"):
        pytest.skip("not under pytest-xdist (-n 0)")
    assert request.node.nodeid.endswith("@test_imports"), request.node.nodeid
