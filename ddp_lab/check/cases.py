"""The cases a function is checked on, how one is called, and torch's answer to it.

A case is a world size, a tensor size, a dtype, a reduction op (where the function takes one), a
root (for rooted collectives) and a group (the whole world, or a subgroup where the function
takes `group`). Every rank makes its own input from the case and its rank, runs
torch.distributed's own collective on a copy (the oracle), then the student's function on the
original, and compares.

Sizes: 0, 1, fewer elements than ranks, not a multiple of the world, and a few thousand. Roots:
first, last and middle. Floats compare within the rounding of a sum taken in another order:

    |got - expected| <= 2 (n - 1) u sum_i |x_i|      (u: the dtype's unit roundoff)

the classical bound for n terms summed in any order (Higham, *Accuracy and Stability of
Numerical Algorithms*, 2nd ed., eq. 4.3); products within 4 (n - 1) u |expected|. Integers, MAX,
MIN and copies (broadcast, gathers, scatters) compare exactly. docs/exercises.md says why.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from ..config.student import REDUCING, ROOTED, StudentFunction

DTYPES = ("float32", "float64", "int64")
OPS = ("SUM", "PRODUCT", "MAX", "MIN")
LARGE = 3001  # "a few thousand": prime, so a multiple of no world


@dataclass(frozen=True)
class Case:
    world_size: int
    numel: int
    dtype: str
    op: Optional[str]
    root: Optional[int]
    #: the members (global ranks) when the case runs on a subgroup
    group: Optional[tuple[int, ...]] = None

    def as_dict(self) -> dict:
        d = asdict(self)
        d["group"] = list(self.group) if self.group else None
        return d

    def label(self) -> str:
        parts = [f"world {self.world_size}", f"{self.numel} elements", self.dtype]
        if self.op:
            parts.append(f"op {self.op}")
        if self.root is not None:
            parts.append(f"root {self.root}")
        if self.group:
            parts.append(f"group {list(self.group)}")
        return ", ".join(parts)


def sizes(world: int) -> list[int]:
    """0, 1, fewer than the ranks, not a multiple of the world, a few thousand (each once)."""
    out = [0, 1, max(world - 1, 0), 2 * world + 1 if world > 1 else 7, LARGE]
    return sorted(set(out), key=out.index)


def cases(fn: StudentFunction, world: int) -> list[Case]:
    """Every case of `fn` on `world` ranks, in the order they run: the whole world first (dtype,
    size, op, root), then a subgroup (ranks 1..n-1, so group and global ranks differ) where `fn`
    takes a group and the world has 3 ranks or more."""
    kind = fn.collective
    op_list = list(OPS) if (kind in REDUCING and fn.signature.op) else (
        ["SUM"] if kind in REDUCING else [None])

    def roots(members: tuple[int, ...]) -> list[Optional[int]]:
        if kind not in ROOTED or fn.signature.root is None:
            # a rooted collective that takes no root runs from the group's first rank
            return [members[0] if kind in ROOTED else None]
        picks = [members[0], members[-1], members[len(members) // 2]]
        return sorted(set(picks), key=picks.index)

    out = [Case(world, n, dtype, op, root) for dtype in DTYPES for n in sizes(world)
           for op in op_list for root in roots(tuple(range(world)))]
    if fn.signature.group and world >= 3:
        members = tuple(range(1, world))
        out += [Case(world, n, "float32", op, root, members)
                for n in (1, 2 * len(members) + 1, LARGE) for op in op_list[:2]
                for root in roots(members)]
    return out


# ------------------------------------------------------------- inputs
def make_input(case: Case, rank: int, index: int, numel: Optional[int] = None) -> torch.Tensor:
    """This rank's input for case `index` (the same on every run)."""
    g = torch.Generator().manual_seed(1_000_003 * index + 7919 * rank + 17)
    n = case.numel if numel is None else numel
    dtype = getattr(torch, case.dtype)
    if dtype.is_floating_point:
        if case.op == "PRODUCT":
            return (torch.rand(n, generator=g, dtype=torch.float64) + 0.5).to(dtype)
        return torch.randn(n, generator=g, dtype=torch.float64).to(dtype)
    if case.op == "PRODUCT":
        return torch.randint(1, 3, (n,), generator=g, dtype=dtype)
    return torch.randint(-9, 10, (n,), generator=g, dtype=dtype)


def sentinel(like: torch.Tensor) -> torch.Tensor:
    """What an output buffer holds before the call: a value no input takes, so an element never
    written shows."""
    return torch.full_like(like, -777)


# ------------------------------------------------------------- calls
@dataclass
class Prepared:
    """One rank's buffers for one case: `args`/`kwargs` for the student's function, `expected`
    (tensor or None where torch leaves the value undefined), `result` (what to compare after the
    call), `written` (the tensor the caller handed in, to compare with `original`), and `scale`
    (sum of |x| for the tolerance)."""

    args: tuple
    kwargs: dict
    result: Any
    expected: Any
    original: Optional[torch.Tensor]
    written: Optional[torch.Tensor]
    scale: Optional[torch.Tensor] = None


def prepare(fn: StudentFunction, case: Case, rank: int, index: int,
            group: Optional[dist.ProcessGroup]) -> Prepared:
    """Make the inputs, run torch's collective on copies (every member of the case's group, in
    the same order), and lay out the call."""
    kind, sig = fn.collective, fn.signature
    n_members = len(case.group) if case.group else case.world_size
    x = make_input(case, rank, index)
    kw: dict = {}
    if sig.group:
        kw["group"] = group
    op = getattr(ReduceOp, case.op) if case.op else None
    if op is not None and sig.op:
        kw["op"] = op
    root = case.root
    if root is not None and sig.root:
        kw[sig.root] = root
    scale = None
    if kind == "broadcast":
        want = x.clone()
        dist.broadcast(want, src=root, group=group)
        return Prepared((x,), kw, x, want, x.clone(), x)
    if kind in ("reduce", "all_reduce"):
        want = x.clone()
        if kind == "reduce":
            dist.reduce(want, dst=root, op=op, group=group)
        else:
            dist.all_reduce(want, op=op, group=group)
        if case.op == "SUM" and x.dtype.is_floating_point:
            scale = x.abs()
            dist.all_reduce(scale, group=group)
        defined = kind == "all_reduce" or rank == root
        return Prepared((x,), kw, x, want if defined else None, x.clone(), x, scale)
    if kind == "all_gather":
        pieces = [sentinel(x) for _ in range(n_members)]
        want = [sentinel(x) for _ in range(n_members)]
        dist.all_gather(want, x, group=group)
        want_t = torch.cat(want)
        if sig.lists:
            return Prepared((pieces, x), kw, pieces, want, None, None)
        out = sentinel(want_t)
        return Prepared((out, x), kw, out, want_t, None, None)
    if kind == "reduce_scatter":
        big = make_input(case, rank, index, case.numel * n_members)
        parts = list(big.tensor_split(n_members)) if case.numel else [
            big[:0] for _ in range(n_members)]
        out = sentinel(parts[0])
        want = sentinel(parts[0])
        dist.reduce_scatter(want, [p.clone() for p in parts], op=op, group=group)
        if case.op == "SUM" and big.dtype.is_floating_point:
            scale = parts[0].clone()
            dist.reduce_scatter(scale, [p.abs() for p in parts], group=group)
        inp = parts if sig.lists else big
        return Prepared((out, inp), kw, out, want, None, None, scale)
    if kind == "gather":
        is_root = rank == root
        want = [sentinel(x) for _ in range(n_members)] if is_root else None
        dist.gather(x, want, dst=root, group=group)
        if "gather_list" in sig.params:
            lst = [sentinel(x) for _ in range(n_members)] if is_root else None
            kw["gather_list"] = lst
            return Prepared((x,), kw, lst, want, None, None)
        out = sentinel(torch.cat([x] * n_members)) if is_root else None
        return Prepared((out, x), kw, out, torch.cat(want) if is_root else None, None, None)
    if kind == "scatter":
        is_root = rank == root
        chunks = [make_input(case, root, index * 31 + j) for j in range(n_members)]
        want = sentinel(x)
        dist.scatter(want, [c.clone() for c in chunks] if is_root else None, src=root,
                     group=group)
        out = sentinel(x)
        if "scatter_list" in sig.params:
            kw["scatter_list"] = chunks if is_root else None
            return Prepared((out,), kw, out, want, None, None)
        inp = torch.cat(chunks) if is_root else None
        return Prepared((out, inp), kw, out, want, None, None)
    raise ValueError(f"unknown collective {kind!r}")


# ------------------------------------------------------------- compare
def tolerance(case: Case, expected: torch.Tensor, scale: Optional[torch.Tensor],
              n: int) -> Optional[torch.Tensor]:
    """Per-element tolerance, or None for an exact comparison."""
    if not expected.dtype.is_floating_point or case.op in ("MAX", "MIN", None):
        return None
    u = torch.finfo(expected.dtype).eps / 2  # the unit roundoff
    if case.op == "PRODUCT":
        return 4 * max(n - 1, 1) * u * expected.abs() + 1e-300
    if scale is None:
        return 2 * max(n - 1, 1) * u * expected.abs()
    return 2 * max(n - 1, 1) * u * scale + 1e-300


def first_difference(got: Any, want: Any, tol: Optional[torch.Tensor]) -> Optional[dict]:
    """None when `got` matches `want`; else the first differing element: {index, expected, got}
    (or a shape / type message)."""
    if isinstance(want, list):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            return {"message": f"expected a list of {len(want)} tensors"}
        got, want = torch.cat([g.reshape(-1) for g in got]), torch.cat(want)
    if not isinstance(got, torch.Tensor):
        return {"message": f"expected a tensor, got {type(got).__name__}"}
    if got.shape != want.shape:
        return {"message": f"shape {tuple(got.shape)} where torch's is {tuple(want.shape)}"}
    if got.dtype != want.dtype:
        return {"message": f"dtype {got.dtype} where torch's is {want.dtype}"}
    if tol is None:
        bad = got != want
    else:
        bad = ~((got - want).abs() <= tol)
    if not bool(bad.any()):
        return None
    i = int(bad.nonzero()[0, 0])
    return {"index": i, "expected": want[i].item(), "got": got[i].item(),
            "differing": int(bad.sum())}
