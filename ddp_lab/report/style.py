"""How a bench series looks, in the bench's own plots and in the report's: one colour per
implementation, one line style and marker per group kind, so that a line keeps its look
from a run folder's plots/ to the report. No torch and no matplotlib: the report imports it.
"""

from __future__ import annotations

IMPL_COLORS = {"torch": "tab:blue", "ring": "tab:orange", "butterfly": "tab:green",
               "tree": "tab:red", "naive": "tab:purple"}
IMPL_MARKERS = {"torch": "o", "ring": "D", "butterfly": "v", "tree": "P", "naive": "x"}
GROUP_STYLES = {"global": ("-", "o"), "intra_node": ("--", "s"), "cross_node": (":", "^"),
                "same_node": ("--", "s")}
GROUP_COLORS = {"global": "tab:blue", "intra_node": "tab:orange", "cross_node": "tab:green",
                "same_node": "tab:orange"}


def impl_color(impl: str, order: list[str]) -> str:
    """An implementation's colour: its own, else a tab10 colour no named one uses."""
    if impl in IMPL_COLORS:
        return IMPL_COLORS[impl]
    spare = [f"C{i}" for i in range(5, 10)]  # tab:brown, pink, gray, olive, cyan
    others = [i for i in order if i not in IMPL_COLORS]
    return spare[others.index(impl) % len(spare)] if impl in others else "tab:gray"
