"""What the installed torch has, where a default of ddp_lab's asks for more than the oldest torch
it supports (pyproject.toml). A default it cannot honour picks what it has, and the run says so
(`fused_note`, `DistContext.notes`); a value the user set that it cannot honour is refused before
any rank starts (ddp_lab/command/validate.py).
"""

from __future__ import annotations

import functools
import inspect

def version() -> str:
    import torch

    return torch.__version__.split("+")[0]


def accepts(function, keyword: str) -> bool:
    """Whether this torch's `function` takes the keyword argument `keyword`."""
    return keyword in inspect.signature(function).parameters


@functools.lru_cache(maxsize=None)
def has_fused(optimizer: str, device_type: str) -> bool:
    """Whether this torch has the fused update of torch.optim.`optimizer` ("adam" | "sgd") on
    `device_type` (Adam on CPU: 2.4; SGD: 2.3 on CUDA, 2.4 on CPU), asked by making one."""
    import torch

    if device_type == "cuda" and not torch.cuda.is_available():
        # not this machine's to say: the ranks' torch decides where they run
        return True
    param = torch.zeros(1, device=device_type, requires_grad=True)
    cls = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}[optimizer]
    try:
        cls([param], lr=0.1, fused=True)
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


def fused(optimizer: str, device_type: str, setting, sharded: bool = False) -> bool:
    """optim.fused as the optimiser is built: null (the default) is the fused update where this
    torch has it for `device_type` and the parameters (`sharded`: fsdp2's DTensors, which
    aten._fused_sgd_ has no rule for: a NotImplementedError at the first step), else the
    per-tensor loop, which `fused_note` says in the first lines."""
    if setting is not None:
        return bool(setting)
    return fused_note(optimizer, device_type, setting, sharded) is None


def fused_note(optimizer: str, device_type: str, setting, sharded: bool = False) -> str | None:
    """The line that says why optim.fused=null took the per-tensor loop (None: it did not)."""
    if setting is not None:
        return None
    if not has_fused(optimizer, device_type):
        return (f"optim.fused=null: the per-tensor loop (torch {version()} has no fused "
                f"{optimizer} update on {device_type}; torch >= 2.4 has)")
    if sharded and optimizer == "sgd":
        # optim.fused=true is refused before the start (validate)
        return "optim.fused=null: the per-tensor loop (torch's fused SGD takes no fsdp2 DTensor)"
    return None


def fused_refusal(optimizer: str, device_type: str) -> str | None:
    """optim.fused=true where this torch cannot: the one line that refuses it."""
    if has_fused(optimizer, device_type):
        return None
    return (f"optim.fused=true: torch {version()} has no fused {optimizer} update on "
            f"{device_type} (torch >= 2.4 has): leave optim.fused=null (fused where torch "
            "has it) or set optim.fused=false")


# ------------------------------------------------------------- collectives' current names
def all_gather_single(output, input, group=None, async_op: bool = False):
    """`dist.all_gather_single` (torch >= 2.14; `all_gather_into_tensor` before, which 2.14 marks
    deprecated with a FutureWarning): every rank's `input` end to end in `output`."""
    import torch.distributed as dist

    call = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return call(output, input, group=group, async_op=async_op)


def reduce_scatter_single(output, input, op=None, group=None, async_op: bool = False):
    """`dist.reduce_scatter_single` (torch >= 2.14; `reduce_scatter_tensor` before, which 2.14
    marks deprecated): the sum (or `op`) of every rank's `input`, this rank's chunk."""
    import torch.distributed as dist

    call = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return call(output, input, op=dist.ReduceOp.SUM if op is None else op, group=group,
                async_op=async_op)


# ------------------------------------------------------------- the library twins' needs
#: the oldest torch whose torch.distributed.fsdp exports fully_shard (FSDP2)
FULLY_SHARD_SINCE = "2.6"


def has_fully_shard() -> bool:
    import torch.distributed.fsdp as fsdp

    return hasattr(fsdp, "fully_shard")


def fsdp2_refusal() -> str | None:
    """sync=fsdp2 where this torch has no `torch.distributed.fsdp.fully_shard`: one line."""
    if has_fully_shard():
        return None
    return (f"sync=fsdp2: torch {version()} has no torch.distributed.fsdp.fully_shard (FSDP2, "
            f"torch >= {FULLY_SHARD_SINCE}): use sync=zero1 or sync=torch_zero (sharded "
            f"optimiser state on this torch), or a torch >= {FULLY_SHARD_SINCE}")
