"""A student's collectives, found in their file without running it (`ast`: torch-free, on the
submitting side). `python -m ddp_lab.check FILE.py`, `bench.impl=[FILE.py:fn]` and `sync=custom
sync.all_reduce=FILE.py:fn` name a student's code the same way (a *spec*):

    mine.py                          every function named like a collective
    mine.py:ring                     one function; its collective from its name
    mine.py:ring=all_reduce          one function, the collective given

A function's collective comes from its name's start (`broadcast*`, `reduce*`, `all_reduce*` /
`allreduce*`, `all_gather*` / `allgather*`, `reduce_scatter*`, `gather*`, `scatter*`); its
signature says how it is called (torch.distributed's, with `group`, or the notebook's, without).
Every mistake is a `UserError`: one line, exit 2, before any process.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .errors import UserError

#: collective -> the name prefixes that mean it, longest first where one prefix starts another
#: (reduce_scatter before reduce: collective_of takes the first that matches)
COLLECTIVE_PREFIXES: dict[str, tuple[str, ...]] = {
    "reduce_scatter": ("reduce_scatter", "reducescatter"),
    "all_reduce": ("all_reduce", "allreduce"),
    "all_gather": ("all_gather", "allgather"),
    "broadcast": ("broadcast",),
    "reduce": ("reduce",),
    "gather": ("gather",),
    "scatter": ("scatter",),
}
#: the collectives a check knows, in the order its table lists them
COLLECTIVE_KINDS = ("broadcast", "reduce", "all_reduce", "all_gather",
                    "reduce_scatter", "gather", "scatter")
#: the rooted collectives and the names their root argument goes by
ROOTED = {"broadcast": "src", "reduce": "dst", "gather": "dst", "scatter": "src"}
ROOT_NAMES = ("src", "dst", "root", "source", "dest", "destination")
#: the ones that take a reduction op
REDUCING = ("reduce", "all_reduce", "reduce_scatter")


def collective_of(name: str) -> Optional[str]:
    """The collective a function's name says, or None (`allreduce_butterfly` -> all_reduce)."""
    if name.startswith("_"):
        return None
    return next((kind for kind, prefixes in COLLECTIVE_PREFIXES.items()
                 if name.lower().startswith(prefixes)), None)


@dataclass(frozen=True)
class Signature:
    """How a function is called, read from its parameters."""

    params: tuple[str, ...]
    #: a `group` parameter: torch.distributed's signature (else the notebook's: the whole world)
    group: bool
    #: an `op` parameter: reductions other than SUM are tried
    op: bool
    #: the root's parameter name (src, dst, ...) or None
    root: Optional[str]
    #: the first parameter is a list of tensors (torch's all_gather, gather_list, scatter_list)
    #: rather than one tensor
    lists: bool

    @classmethod
    def of(cls, node: ast.FunctionDef) -> "Signature":
        args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
        names = tuple(a.arg for a in args)
        ann = {a.arg: ast.unparse(a.annotation) if a.annotation else "" for a in args}
        lists = any(("list" in n.lower()) or ann[n].lower().startswith(("list", "sequence"))
                    for n in names[:2])
        root = next((n for n in names if n in ROOT_NAMES), None)
        return cls(names, "group" in names, "op" in names, root, lists)


@dataclass(frozen=True)
class StudentFunction:
    """One function of a student's file: where it is and what it is."""

    path: str
    name: str
    collective: str
    signature: Signature
    line: int
    #: lines where the function assigns to one of its own parameters (`tensor = torch.max(...)`):
    #: what a rebound argument points at
    rebinds: tuple[tuple[str, int], ...] = field(default=())

    @property
    def spec(self) -> str:
        return f"{self.path}:{self.name}"


_MODULE_SPEC = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(=\w+)?$")


def module_file(module: str) -> Optional[str]:
    """The source file of `module` (dotted), found without importing it or its packages (the
    submitting side loads no torch): the top package by the import system, the rest by folder."""
    import importlib.util

    top, *rest = module.split(".")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if not rest:
        return spec.origin
    for base in spec.submodule_search_locations or []:
        rel = Path(base, *rest)
        for cand in (rel.with_suffix(".py"), rel / "__init__.py"):
            if cand.is_file():
                return str(cand.resolve())
    return None


def split_spec(spec: str) -> tuple[str, Optional[str], Optional[str]]:
    """`FILE.py[:function[=collective]]` (or `package.module:function`, a module on the path) ->
    (file, function, collective)."""
    module = module_of(spec)
    if module:
        fn, _, kind = spec.partition(":")[2].partition("=")
        return module_file(module) or f"{module.replace('.', '/')}.py", fn, (kind or None)
    path, _, rest = spec.partition(".py:") if ".py:" in spec else (spec, "", "")
    if rest or spec.endswith(".py:"):
        path += ".py"
    fn, _, kind = rest.partition("=")
    return path, (fn or None), (kind or None)


def is_spec(text: str) -> bool:
    """Whether a bench.impl value (or a command-line word) names a file of code (or a module's
    function) rather than a built-in."""
    text = str(text)
    return bool(_MODULE_SPEC.match(text)) or split_spec(text)[0].endswith(".py")


def module_of(spec: str) -> Optional[str]:
    """The dotted module a `package.module:function` spec names, or None for a file's."""
    return spec.partition(":")[0] if _MODULE_SPEC.match(spec) and ".py:" not in spec else None


def parse_file(path: str) -> ast.Module:
    p = Path(path).expanduser()
    if not p.is_file():
        raise UserError(f"{path}: no such file: give the path of your .py file")
    try:
        return ast.parse(p.read_text(), filename=str(p))
    except SyntaxError as e:
        raise UserError(f"{path}:{e.lineno}: syntax error: {e.msg}: fix the line, then run "
                        "the check again") from None
    except (UnicodeDecodeError, ValueError) as e:
        raise UserError(f"{path}: cannot read it as Python source ({e})") from None


def find_functions(spec: str, key: str = "FILE.py") -> list[StudentFunction]:
    """The collectives `spec` names, found by name in its file (see the module's docstring); a
    UserError when there are none."""
    path, fn, kind = split_spec(spec)
    if kind is not None and kind not in COLLECTIVE_KINDS:
        raise UserError(f"{spec}: unknown collective {kind!r}: choose one of "
                        f"{', '.join(COLLECTIVE_KINDS)}")
    tree = parse_file(path)
    defs = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    if fn is not None:
        if fn not in defs:
            near = ", ".join(sorted(defs)) or "none"
            raise UserError(f"{spec}: {path} defines no function {fn!r} at its top level "
                            f"(it defines: {near})")
        kind = kind or collective_of(fn)
        if kind is None:
            raise UserError(f"{spec}: the name {fn!r} says no collective: name it "
                            f"{path}:{fn}=all_reduce (or broadcast, reduce, all_gather, "
                            "reduce_scatter, gather, scatter)")
        return [_function(path, defs[fn], kind)]
    found = [_function(path, node, k) for name, node in defs.items()
             if (k := collective_of(name)) is not None]
    if not found:
        raise UserError(f"{path}: no collective found: name a function broadcast*, reduce*, "
                        "all_reduce*, all_gather*, reduce_scatter*, gather* or scatter*, or "
                        f"give {path}:FUNCTION=COLLECTIVE ({key})")
    return found


def _function(path: str, node: ast.FunctionDef, kind: str) -> StudentFunction:
    sig = Signature.of(node)
    rebinds = tuple((t.id, sub.lineno) for sub in ast.walk(node)
                    if isinstance(sub, (ast.Assign, ast.AnnAssign))
                    for t in (sub.targets if isinstance(sub, ast.Assign) else [sub.target])
                    if isinstance(t, ast.Name) and t.id in sig.params)
    return StudentFunction(str(Path(path).expanduser().resolve()), node.name, kind, sig,
                           node.lineno, rebinds)


def one_function(spec: str, collective: str, key: str) -> StudentFunction:
    """The one function `spec` names, which must be a `collective` (sync.all_reduce, bench.impl): a
    UserError naming `key` otherwise."""
    path, fn, _ = split_spec(spec)
    if fn is None:
        found = [f for f in find_functions(spec, key) if f.collective == collective]
        if len(found) != 1:
            names = ", ".join(f.name for f in found) or "none"
            raise UserError(f"{key}={spec}: name one {collective} function as "
                            f"{path}:FUNCTION ({path}'s {collective} functions: {names})")
        return found[0]
    f = find_functions(spec, key)[0]
    if f.collective != collective:
        raise UserError(f"{key}={spec}: {f.name} is a {f.collective}, not a {collective}: "
                        f"name a {collective} function (or {path}:{fn}={collective})")
    return f


def absolute_spec(spec: str) -> str:
    """`spec` with its file's path made absolute (the ranks may start in another folder); a
    module's spec as it is."""
    if module_of(spec):
        return spec
    path, fn, kind = split_spec(spec)
    out = str(Path(path).expanduser().resolve())
    if fn:
        out += f":{fn}" + (f"={kind}" if kind else "")
    return out


def spec_label(spec: str) -> str:
    """What a run, a table or a plot calls a student's function: its name (the file's stem when
    none is given)."""
    path, fn, _ = split_spec(spec)
    return fn or Path(path).stem
