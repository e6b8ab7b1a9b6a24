"""What a benchmarked op is made of: its group (GroupCtx), its parts
(Op), and the inputs' known pattern with its check: `t[i] = base + scale
* ((i + off) % PERIOD)`.

A misplaced chunk breaks the pattern, so a check catches it, not only a
wrong sum; the benchmarked ops (ops.py) fill their inputs with it and
check every element of a result against the closed form.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
import torch.distributed as dist

PERIOD = 8  # the pattern repeats every PERIOD elements
# elements per fill/check slice: bounds the temporaries
CHUNK = 1 << 22


class Pattern:
    """Fills and checks `t[i] = base + scale * ((i + off) % PERIOD)`,
    slice by slice."""

    def __init__(self, dtype: torch.dtype, device: torch.device):
        self.dtype = dtype
        self.pat = (torch.arange(CHUNK + PERIOD, device=device) % PERIOD).to(dtype)
        # half types round partial sums; every other type must match bit
        # for bit
        self.rtol = 1e-2 if dtype in (torch.float16, torch.bfloat16) else 0.0

    def _slices(self, t: torch.Tensor, off: int):
        flat = t.view(-1)
        for s in range(0, flat.numel(), CHUNK):
            n = min(CHUNK, flat.numel() - s)
            o = (s + off) % PERIOD
            yield s, flat[s:s + n], self.pat[o:o + n]

    def fill(self, t: torch.Tensor, base: float, scale: float = 1, off: int = 0) -> None:
        for _, seg, pat in self._slices(t, off):
            seg.copy_(pat)
            if scale != 1:
                seg.mul_(scale)
            if base:
                seg.add_(base)

    def check(self, t: torch.Tensor, base: float, scale: float = 1, off: int = 0,
              what: str = "result", rtol: Optional[float] = None,
              atol: float = 0.0) -> Optional[str]:
        """None if every element is as expected (bit for bit, or within
        rtol/atol where the expected values themselves round), else
        where the first one is not."""
        rtol = max(self.rtol, rtol or 0.0)
        exact = rtol == 0 and atol == 0
        for s, seg, pat in self._slices(t, off):
            exp = pat * scale + base
            ok = torch.equal(seg, exp) if exact else torch.allclose(seg, exp, rtol=rtol, atol=atol)
            if not ok:
                bad = (seg != exp) if exact else ~torch.isclose(seg, exp, rtol=rtol, atol=atol)
                i = int(bad.nonzero()[0])
                return (f"{what}[{s + i}] = {seg[i].item()}, expected {exp[i].item()} "
                        f"({int(bad.sum())} of {seg.numel()} elements wrong in that slice)")
        return None


@dataclass(frozen=True)
class GroupCtx:
    """This rank's group for one measurement: global ranks, handle, own
    index."""

    ranks: tuple[int, ...]
    # None = the default group
    handle: Optional[dist.ProcessGroup]
    grank: int

    @property
    def n(self) -> int:
        return len(self.ranks)

    @property
    def root(self) -> int:
        # global rank of the group's first member
        return self.ranks[0]

    def peer(self, shift: int) -> int:
        return self.ranks[(self.grank + shift) % self.n]


@dataclass(frozen=True)
class Op:
    """One benchmarked operation. `impls` maps implementation names to
    callables `(bufs, g) -> None`; `mem` is the number of size-N buffers
    a rank holds (with scratch), for the memory cap; `factor` names the
    nccl-tests bus-bandwidth factor."""

    name: str
    factor: str
    mem: float
    setup: Callable[[int, GroupCtx, torch.dtype, torch.device], dict]
    reset: Callable[[dict, GroupCtx, Pattern], None]
    check: Callable[[dict, GroupCtx, Pattern], Optional[str]]
    impls: dict[str, Callable[[dict, GroupCtx], None]]
    # elements = n pieces of N // n (all_gather, reduce_scatter)
    full_array: bool = False
    # ping-pong: runs on rank pairs, not on the process groups
    pairwise: bool = False

    def elements(self, size: int, n: int) -> int:
        return (size // n) * n if self.full_array else size
