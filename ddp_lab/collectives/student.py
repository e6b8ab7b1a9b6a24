"""A student's code, imported: a file as a module of its own, or a
function object as a notebook's cell defined it."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import inspect
import sys
import textwrap
import traceback
from pathlib import Path
from types import ModuleType
from typing import Callable, Optional

from ..config.errors import UserError
from ..config.student import Signature, StudentFunction, collective_of, find_functions


def import_file(path: str) -> ModuleType:
    """Import `path` as a module named after its content (two files of
    one name do not collide); a UserError with its line when importing
    it raises."""
    p = Path(path).expanduser().resolve()
    name = f"ddp_lab_student_{p.stem}_{hashlib.sha1(str(p).encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, p)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException as e:
        sys.modules.pop(name, None)
        frames = [f for f in traceback.extract_tb(e.__traceback__) if f.filename == str(p)]
        line = f":{frames[-1].lineno}" if frames else ""
        raise UserError(
            f"{path}{line}: importing it raised {type(e).__name__}: "
            f"{str(e).splitlines()[0] if str(e) else ''} (the file must import "
            "on its own: the check runs its functions, not its main)"
        ) from None
    return module


def functions(spec: str, key: str = "FILE.py") -> list[tuple[Callable, StudentFunction, list]]:
    """(function, what it is, namespaces to watch) for each collective
    `spec` names."""
    import importlib

    from ..config.student import module_of

    found = find_functions(spec, key)
    name = module_of(spec)
    module = importlib.import_module(name) if name else import_file(found[0].path)
    return [(getattr(module, f.name), f, [vars(module)]) for f in found]


def one(spec: str, collective: str, key: str) -> tuple[Callable, StudentFunction, list]:
    """The one `collective` function `spec` names (sync.all_reduce,
    bench.impl)."""
    import importlib

    from ..config.student import module_of, one_function

    f = one_function(spec, collective, key)
    module = importlib.import_module(module_of(spec)) if module_of(spec) else import_file(f.path)
    return getattr(module, f.name), f, [vars(module)]


def describe_callable(fn: Callable, collective: Optional[str] = None) -> StudentFunction:
    """A function object (a notebook cell's) as the check sees a file's
    function: its name, collective, signature and rebinding lines."""
    name = getattr(fn, "__name__", repr(fn))
    kind = collective or collective_of(name)
    if kind is None:
        raise UserError(
            f"{name}: the name says no collective: check({name}, "
            "collective='all_reduce') (or broadcast, reduce, all_gather, "
            "reduce_scatter, gather, scatter)"
        )
    node = None
    try:
        src = textwrap.dedent(inspect.getsource(fn))
        node = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef))
    except (OSError, TypeError, StopIteration, SyntaxError):
        pass
    code = fn.__code__
    first = code.co_firstlineno
    if node is not None:
        sig = Signature.of(node)
        rebinds = tuple(
            (t.id, first + sub.lineno - 1)
            for sub in ast.walk(node)
            if isinstance(sub, ast.Assign)
            for t in sub.targets
            if isinstance(t, ast.Name) and t.id in sig.params
        )
    else:
        params = tuple(inspect.signature(fn).parameters)
        root = next((p for p in params if p in ("src", "dst", "root")), None)
        sig = Signature(
            params, "group" in params, "op" in params, root, any("list" in p for p in params[:2])
        )
        rebinds = ()
    return StudentFunction(code.co_filename, name, kind, sig, first, rebinds)


def as_all_reduce(fn: Callable, info: StudentFunction) -> Callable[..., None]:
    """`fn` called as the ALL_REDUCE registry's entries are,
    `f(tensor, op=SUM, group=None)`: the op as torch's ReduceOp, the
    group only where `fn` takes one (a notebook's has none: the whole
    world)."""
    from torch.distributed import ReduceOp

    from ._common import normalize_op

    def all_reduce(tensor, op="SUM", group=None):
        kw = {}
        if info.signature.op:
            kw["op"] = getattr(ReduceOp, normalize_op(op))
        elif normalize_op(op) != "SUM":
            raise NotImplementedError(f"{info.name} takes no op: SUM only")
        if info.signature.group:
            kw["group"] = group
        elif group is not None:
            raise NotImplementedError(f"{info.name} takes no group: the whole world only")
        fn(tensor, **kw)

    all_reduce.__name__ = info.name
    return all_reduce


def as_registry_entry(fn: Callable, info: StudentFunction) -> Callable[..., None]:
    """`fn` with the calling convention of its collective's registry
    (collectives/registry.py): broadcast(tensor, src, group),
    reduce(tensor, dst, op, group), all_reduce(tensor, op, group),
    all_gather(output, input, group), reduce_scatter(output, input, op,
    group). A function without `group` runs on the whole world only."""
    import torch.distributed as dist

    if info.collective == "all_reduce":
        return as_all_reduce(fn, info)
    sig = info.signature

    def extra(op=None, group=None) -> dict:
        kw = {}
        if sig.group:
            kw["group"] = group
        elif group is not None and group is not dist.group.WORLD:
            raise NotImplementedError(f"{info.name} takes no group: the whole world only")
        if op is not None and sig.op:
            from torch.distributed import ReduceOp

            from ._common import normalize_op

            kw["op"] = getattr(ReduceOp, normalize_op(op))
        return kw

    def rooted(tensor, root=0, op=None, group=None):
        kw = extra(op, group)
        if sig.root:
            kw[sig.root] = root
        fn(tensor, **kw)

    if info.collective == "broadcast":
        return lambda tensor, src=0, group=None: rooted(tensor, src, None, group)
    if info.collective == "reduce":
        return lambda tensor, dst=0, op="SUM", group=None: rooted(tensor, dst, op, group)
    if info.collective == "all_gather":
        return lambda output, input, group=None: fn(output, input, **extra(None, group))
    if info.collective == "reduce_scatter":
        return lambda output, input, op="SUM", group=None: fn(output, input, **extra(op, group))
    raise UserError(
        f"{info.spec}: a {info.collective} has no benchmark here: bench and train "
        "take broadcast, reduce, all_reduce, all_gather and reduce_scatter"
    )
