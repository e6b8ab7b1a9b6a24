"""Gather: every rank's ``input`` lands, in group-rank order, in the
root's ``output`` (``n`` pieces of ``input.numel()`` elements, laid out
as :func:`torch.distributed.all_gather_into_tensor` does); the other
ranks pass None. Costs: docs/collectives.md."""

from __future__ import annotations

import torch
import torch.distributed as dist

from ._common import GroupInfo, flat_view, group_info, p2p, resolve_root, scratch


def _gather_linear(info: GroupInfo, out: torch.Tensor | None, inp: torch.Tensor, root: int) -> None:
    if info.rank != root:
        p2p(info, sends=[(inp, root)])
        return
    pieces = out.view(info.size, -1)
    pieces[root].copy_(inp)
    p2p(info, recvs=[(pieces[r], r) for r in range(info.size) if r != root])


def _gather_tree(info: GroupInfo, out: torch.Tensor | None, inp: torch.Tensor, root: int) -> None:
    """Binomial tree, relative to the root: rank ``v`` holds the pieces
    of its subtree ``v .. v + span - 1`` (``span`` = its lowest set bit,
    the root all ``n``), receives each child's block as the child
    completes it, and sends the block to its parent."""
    n, m = info.size, inp.numel()
    v = (info.rank - root) % n
    span = min(v & -v if v else n, n - v)
    # relative order: piece k is rank v + k's
    block = scratch(span * m, inp, slot=4)
    block[:m].copy_(inp)
    mask = 1
    while mask < span:
        child = v + mask
        # the child's subtree, cut at the end of the group
        count = min(mask, n - child)
        p2p(info, recvs=[(block[mask * m : (mask + count) * m], (child + root) % n)])
        mask <<= 1
    if v:
        p2p(info, sends=[(block, (v - (v & -v) + root) % n)])
    else:  # relative piece k belongs to group rank root + k
        out.view(n, m).copy_(block.view(n, m).roll(root, dims=0))


def _gather(
    body,
    output: torch.Tensor | None,
    input: torch.Tensor,
    dst: int | None,
    group: dist.ProcessGroup | None,
    group_dst: int | None,
) -> None:
    info = group_info(group)
    if info is None:
        return
    root = resolve_root(info, dst, group_dst, "dst")
    if info.rank == root and (output is None or output.numel() != info.size * input.numel()):
        raise ValueError(
            f"gather: the root's output must hold {info.size} x {input.numel()} "
            f"elements, got {None if output is None else output.numel()}"
        )
    if input.numel() == 0:
        return
    with flat_view(input, writeback=False) as inp:
        if info.rank != root:
            body(info, None, inp, root)
        else:
            with flat_view(output) as out:
                if info.size == 1:
                    out.copy_(inp)
                else:
                    body(info, out, inp, root)


def gather_linear(
    output: torch.Tensor | None,
    input: torch.Tensor,
    dst: int | None = None,
    group: dist.ProcessGroup | None = None,
    *,
    group_dst: int | None = None,
) -> None:
    """Linear gather: every rank sends its piece to the root, which
    posts the ``n-1`` receives at once, straight into ``output``.
    ``dst`` is a *global* rank as in :func:`torch.distributed.gather`,
    or give ``group_dst=``."""
    _gather(_gather_linear, output, input, dst, group, group_dst)


def gather_tree(
    output: torch.Tensor | None,
    input: torch.Tensor,
    dst: int | None = None,
    group: dist.ProcessGroup | None = None,
    *,
    group_dst: int | None = None,
) -> None:
    """Binomial-tree gather: each rank receives its children's blocks
    (smallest first) and sends its subtree's block up once. Arguments as
    :func:`gather_linear`."""
    _gather(_gather_tree, output, input, dst, group, group_dst)


def torch_gather(
    output: torch.Tensor | None,
    input: torch.Tensor,
    dst: int | None = None,
    group: dist.ProcessGroup | None = None,
    *,
    group_dst: int | None = None,
) -> None:
    """:func:`torch.distributed.gather` into one output tensor (its
    ``n`` rows). Returns None."""
    info = group_info(group)
    if info is None:
        return
    root = resolve_root(info, dst, group_dst, "dst")
    # the root by its global rank: group_dst is torch >= 2.6's
    dst = info.ranks[root]
    with flat_view(input, writeback=False) as inp:
        if info.rank != root:
            dist.gather(inp, None, dst=dst, group=group)
            return
        with flat_view(output) as out:
            dist.gather(inp, list(out.view(info.size, -1)), dst=dst, group=group)


GATHER = {"linear": gather_linear, "tree": gather_tree, "torch": torch_gather}
