"""Collective algorithms built from point-to-point send/recv: plain
functions that mirror ``torch.distributed`` (in place or into
``output``, return None, any ``group``, gloo and nccl, no barriers);
their conventions and costs: docs/collectives.md. The ring in one screen
is ``ring.py`` (:func:`all_reduce_ring_textbook`);
:func:`all_reduce_ring` batches each step (gloo and nccl);
:class:`PrepostedRingAllReduce` posts each call's receives during the
previous one (gloo).
"""

from ._common import AVG, MAX, MIN, PRODUCT, SUM, SUPPORTED_OPS, clear_scratch, normalize_op
from .all_reduce import all_reduce_butterfly, all_reduce_linear, all_reduce_ring, all_reduce_tree
from .broadcast import DEFAULT_RING_CHUNK_BYTES, broadcast_linear, broadcast_ring, broadcast_tree
from .gather import GATHER, gather_linear, gather_tree, torch_gather
from .ring_optimised import DEFAULT_SEGMENT_BYTES, PlanTags, PrepostedRingAllReduce, preposted_plans
from .ring import all_reduce_ring_textbook
from .reduce import reduce_linear, reduce_tree
from .registry import (
    ALL_GATHER,
    ALL_REDUCE,
    BROADCAST,
    COLLECTIVES,
    REDUCE,
    REDUCE_SCATTER,
    torch_all_gather,
    torch_all_reduce,
    torch_broadcast,
    torch_reduce,
    torch_reduce_scatter,
)
from .scatter_gather import all_gather_ring, reduce_scatter_ring

__all__ = [
    "SUM",
    "PRODUCT",
    "MAX",
    "MIN",
    "AVG",
    "SUPPORTED_OPS",
    "normalize_op",
    "clear_scratch",
    "broadcast_linear",
    "broadcast_tree",
    "broadcast_ring",
    "DEFAULT_RING_CHUNK_BYTES",
    "reduce_linear",
    "reduce_tree",
    "all_reduce_linear",
    "all_reduce_tree",
    "all_reduce_butterfly",
    "all_reduce_ring",
    "all_reduce_ring_textbook",
    "all_gather_ring",
    "reduce_scatter_ring",
    "DEFAULT_SEGMENT_BYTES",
    "gather_linear",
    "gather_tree",
    "torch_gather",
    "GATHER",
    "PrepostedRingAllReduce",
    "PlanTags",
    "preposted_plans",
    "torch_broadcast",
    "torch_reduce",
    "torch_all_reduce",
    "torch_all_gather",
    "torch_reduce_scatter",
    "BROADCAST",
    "REDUCE",
    "ALL_REDUCE",
    "ALL_GATHER",
    "REDUCE_SCATTER",
    "COLLECTIVES",
]
