"""Name -> function registries and ``torch.distributed`` wrappers
(costs: ``ddp_lab.predict.costmodel``).

Every entry of a registry has the calling convention of its collective,
so callers (benchmarks, gradient synchronisers) can swap algorithms by
name::

    BROADCAST[name](tensor, src, group=None)
    REDUCE[name](tensor, dst, op=SUM, group=None)
    ALL_REDUCE[name](tensor, op=SUM, group=None)
    ALL_GATHER[name](output, input, group=None)
    REDUCE_SCATTER[name](output, input, op=SUM, group=None)
    GATHER[name](output, input, dst, group=None)         (output: the root's; None elsewhere)

``"torch"`` entries wrap the built-in collective with the same op
handling as ours (AVG: native on nccl, SUM then divide on gloo, whose
AVG support varies across torch versions).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from ..world import torch_support
from ._common import (
    AVG,
    SUM,
    OpLike,
    check_op_dtype,
    flat_view,
    group_info,
    normalize_op,
    resolve_root,
)
from .all_reduce import all_reduce_butterfly, all_reduce_linear, all_reduce_ring, all_reduce_tree
from .broadcast import broadcast_linear, broadcast_ring, broadcast_tree
from .gather import GATHER
from .reduce import reduce_linear, reduce_tree
from .scatter_gather import all_gather_ring, reduce_scatter_ring


def _torch_op(op: str, group: dist.ProcessGroup | None) -> tuple[ReduceOp.RedOpType, bool]:
    """(op to hand to torch, whether we must divide by the group size
    afterwards)."""
    if op != AVG:
        return getattr(ReduceOp, op), False
    if dist.get_backend(group) == "nccl":
        return ReduceOp.AVG, False
    return ReduceOp.SUM, True


def torch_broadcast(
    tensor: torch.Tensor,
    src: int | None = None,
    group: dist.ProcessGroup | None = None,
    *,
    group_src: int | None = None,
) -> None:
    """:func:`torch.distributed.broadcast` (non-contiguous tensors
    allowed). Returns None."""
    info = group_info(group)
    if info is None:
        return
    root = resolve_root(info, src, group_src, "src")
    # the root by its global rank: group_src is torch >= 2.6's
    with flat_view(tensor) as flat:
        dist.broadcast(flat, info.ranks[root], group=group)


def torch_reduce(
    tensor: torch.Tensor,
    dst: int | None = None,
    op: OpLike = SUM,
    group: dist.ProcessGroup | None = None,
    *,
    group_dst: int | None = None,
) -> None:
    """:func:`torch.distributed.reduce` with our op handling. Returns
    None."""
    op = normalize_op(op)
    check_op_dtype(op, tensor.dtype)
    info = group_info(group)
    if info is None:
        return
    root = resolve_root(info, dst, group_dst, "dst")
    torch_op, divide = _torch_op(op, group)
    with flat_view(tensor) as flat:
        # the root by its global rank: group_dst is torch >= 2.6's
        dist.reduce(flat, info.ranks[root], op=torch_op, group=group)
        if divide and info.rank == root:
            flat.div_(info.size)


def torch_all_reduce(
    tensor: torch.Tensor, op: OpLike = SUM, group: dist.ProcessGroup | None = None
) -> None:
    """:func:`torch.distributed.all_reduce` with our op handling.
    Returns None."""
    op = normalize_op(op)
    check_op_dtype(op, tensor.dtype)
    info = group_info(group)
    if info is None:
        return
    torch_op, divide = _torch_op(op, group)
    with flat_view(tensor) as flat:
        dist.all_reduce(flat, op=torch_op, group=group)
        if divide:
            flat.div_(info.size)


def torch_all_gather(
    output: torch.Tensor | Sequence[torch.Tensor],
    input: torch.Tensor,
    group: dist.ProcessGroup | None = None,
) -> None:
    """:func:`torch.distributed.all_gather_single` (tensor output;
    `all_gather_into_tensor` on a torch older than 2.14) or
    :func:`torch.distributed.all_gather` (list output). Returns None."""
    if isinstance(output, torch.Tensor):
        with flat_view(output) as flat:
            torch_support.all_gather_single(flat, input.reshape(-1), group=group)
    else:
        dist.all_gather(list(output), input, group=group)


def torch_reduce_scatter(
    output: torch.Tensor,
    input: torch.Tensor | Sequence[torch.Tensor],
    op: OpLike = SUM,
    group: dist.ProcessGroup | None = None,
) -> None:
    """:func:`torch.distributed.reduce_scatter_single` (tensor input;
    `reduce_scatter_tensor` on a torch older than 2.14) or
    :func:`torch.distributed.reduce_scatter` (list input), with our op
    handling."""
    op = normalize_op(op)
    check_op_dtype(op, output.dtype)
    info = group_info(group)
    if info is None:
        return
    torch_op, divide = _torch_op(op, group)
    with flat_view(output) as flat:
        if isinstance(input, torch.Tensor):
            torch_support.reduce_scatter_single(flat, input.reshape(-1), op=torch_op, group=group)
        else:
            dist.reduce_scatter(flat, [t.reshape(-1) for t in input], op=torch_op, group=group)
        if divide:
            flat.div_(info.size)


BROADCAST: dict[str, Callable[..., None]] = {
    "linear": broadcast_linear,
    "tree": broadcast_tree,
    "ring": broadcast_ring,
    "torch": torch_broadcast,
}
REDUCE: dict[str, Callable[..., None]] = {
    "linear": reduce_linear,
    "tree": reduce_tree,
    "torch": torch_reduce,
}
ALL_REDUCE: dict[str, Callable[..., None]] = {
    "linear": all_reduce_linear,
    "tree": all_reduce_tree,
    "butterfly": all_reduce_butterfly,
    "ring": all_reduce_ring,
    "torch": torch_all_reduce,
}
ALL_GATHER: dict[str, Callable[..., None]] = {"ring": all_gather_ring, "torch": torch_all_gather}
REDUCE_SCATTER: dict[str, Callable[..., None]] = {
    "ring": reduce_scatter_ring,
    "torch": torch_reduce_scatter,
}
#: collective name -> its registry
COLLECTIVES: dict[str, dict[str, Callable[..., None]]] = {
    "broadcast": BROADCAST,
    "reduce": REDUCE,
    "all_reduce": ALL_REDUCE,
    "all_gather": ALL_GATHER,
    "reduce_scatter": REDUCE_SCATTER,
    "gather": GATHER,
}
