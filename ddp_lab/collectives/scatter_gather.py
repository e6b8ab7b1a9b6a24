"""Ring all-gather and ring reduce-scatter with
``torch.distributed``-style signatures (each also takes a list, like
:func:`torch.distributed.all_gather` / ``reduce_scatter``)."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import torch
import torch.distributed as dist

from ._common import AVG, check_op_dtype, flat_view, group_info, normalize_op, OpLike, SUM
from .ring_optimised import (
    batched_exchange,
    DEFAULT_SEGMENT_BYTES,
    schedule_all_gather,
    schedule_reduce_scatter,
)


def _check_piece(t: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != ref.dtype or t.device != ref.device:
        raise ValueError(
            f"{what} has dtype/device {t.dtype}/{t.device}, expected {ref.dtype}/{ref.device}"
        )


def _pieces(
    stack: contextlib.ExitStack,
    buf: torch.Tensor | Sequence[torch.Tensor],
    ref: torch.Tensor,
    n: int,
    name: str,
    ref_name: str,
    writeback: bool,
) -> list[torch.Tensor]:
    """The ``n`` flat pieces of the full buffer ``buf`` (one tensor of
    ``n * ref.numel()`` elements, or a list of ``n`` tensors of
    ``ref.numel()``), each checked against ``ref``; the flat views live
    as long as ``stack``."""
    m = ref.numel()
    if isinstance(buf, torch.Tensor):
        _check_piece(buf, ref, name)
        if buf.numel() != n * m:
            raise ValueError(
                f"{name} has {buf.numel()} elements, expected world_size * "
                f"{ref_name}.numel() = {n} * {m}"
            )
        flat = stack.enter_context(flat_view(buf, writeback=writeback))
        return list(flat.split(m)) if m else []
    if len(buf) != n:
        raise ValueError(f"{name} list has {len(buf)} tensors, expected {n}")
    for i, t in enumerate(buf):
        _check_piece(t, ref, f"{name}[{i}]")
        if t.numel() != m:
            raise ValueError(f"{name}[{i}] has {t.numel()} elements, expected {m}")
    return [stack.enter_context(flat_view(t, writeback=writeback)) for t in buf]


def all_gather_ring(
    output: torch.Tensor | Sequence[torch.Tensor],
    input: torch.Tensor,
    group: dist.ProcessGroup | None = None,
    *,
    segment_bytes: int | None = DEFAULT_SEGMENT_BYTES,
) -> None:
    """Ring all-gather: rank ``i``'s ``input`` ends up in slot ``i`` of
    every rank's ``output``: one tensor of ``n * input.numel()``
    elements (any shape; slot ``i`` the ``i``-th run of its flattened
    form) or a list of ``n`` tensors. ``input`` may be a view of this
    rank's slot. Pieces are received straight into ``output``, messages
    cut into ``segment_bytes``."""
    info = group_info(group)
    if info is None:
        return
    n, m = info.size, input.numel()
    with contextlib.ExitStack() as stack:
        chunks = _pieces(stack, output, input, n, "output", "input", writeback=True)
        if m == 0:
            return
        mine = chunks[info.rank]
        src = input.reshape(-1)
        if src.data_ptr() != mine.data_ptr():
            mine.copy_(src)
        exchange = batched_exchange(info, chunks, SUM, segment_bytes=segment_bytes)
        schedule_all_gather(info.rank, n, exchange, shift=0)


def reduce_scatter_ring(
    output: torch.Tensor,
    input: torch.Tensor | Sequence[torch.Tensor],
    op: OpLike = SUM,
    group: dist.ProcessGroup | None = None,
    *,
    segment_bytes: int | None = DEFAULT_SEGMENT_BYTES,
) -> None:
    """Ring reduce-scatter: ``output`` on rank ``i`` = ``op`` over all
    ranks of piece ``i`` of ``input`` (one tensor of ``n *
    output.numel()`` elements, or a list of ``n``), which is not
    modified. Double-buffered partials, reduced as pieces land, the last
    step written into ``output``. ``op``: SUM/PRODUCT/MAX/MIN/AVG (AVG:
    float/complex only)."""
    op = normalize_op(op)
    check_op_dtype(op, output.dtype)
    info = group_info(group)
    if info is None:
        return
    n, m = info.size, output.numel()
    with contextlib.ExitStack() as stack:
        chunks = _pieces(stack, input, output, n, "input", "output", writeback=False)
        if m == 0:
            return
        out = stack.enter_context(flat_view(output))
        if n == 1:
            if out.data_ptr() != chunks[0].data_ptr():
                out.copy_(chunks[0])
            return
        exchange = batched_exchange(info, chunks, op, out=out, segment_bytes=segment_bytes)
        schedule_reduce_scatter(info.rank, n, exchange, shift=0)
        if op == AVG:
            out.div_(n)
