"""Small arithmetic shared by the code that moves and times bytes and the code that prices and
reports them. No torch: the report and the cost model import it without it.
"""

from __future__ import annotations

import math
from typing import Sequence

#: Default piece size of the pipelined ring broadcast.
DEFAULT_RING_CHUNK_BYTES = 1 << 20


def ceil_log2(n: int) -> int:
    """Number of binomial-tree rounds for ``n`` ranks (0 for n <= 1)."""
    return 0 if n <= 1 else (n - 1).bit_length()


def num_pipeline_chunks(numel: int, element_size: int, chunk_bytes: int | None) -> int:
    """How many pieces a pipelined transfer of ``numel`` elements is cut into."""
    if not chunk_bytes or chunk_bytes <= 0 or numel == 0:
        return 1
    return max(1, min(numel, math.ceil(numel * element_size / chunk_bytes)))


def pow2_label(n: int) -> str:
    """2^k for powers of two, else the number."""
    return f"2^{n.bit_length() - 1}" if n > 0 and n & (n - 1) == 0 else str(n)


def union_length(intervals: Sequence[tuple[float, float]]) -> float:
    """Total length covered by (start, end) intervals, overlaps counted once."""
    total, cur_s, cur_e = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total
