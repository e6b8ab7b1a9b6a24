"""How a series looks, in every figure of the report and in the bench's
own plots: one colour per name (a synchroniser, a bench implementation),
a shade of it per option setting, one line style and marker per group
kind. The one table: a name's colour never depends on which runs a
folder holds or in what order, so ring is the same colour in two
reports, in the epoch-time figure, the phase figure and the bench's.

A synchroniser takes the colour of its place in the sync registry
(`SCHEMAS["sync"]`, the order `--help` lists them): a new one,
registered after the others, takes the next colour and the others keep
theirs. The bench's `torch`, the library every other line is read
against, is black; any other name (a sync an old run names that is no
longer registered) takes one of `OTHER_COLORS` by a hash of its name,
the same in every process. No torch and no matplotlib: the bench and the
report import it.
"""

from __future__ import annotations

import hashlib

from ..config import SCHEMAS

#: the registered synchronisers' colours, in registration order: tab10
#: without its grey (grey is the phase figure's data phase and the
#: legend's "no interval" mark), then more of the same weight
SYNC_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                "#bcbd22", "#17becf", "#2f4b7c", "#a05195", "#f95d6a", "#665191", "#ffa600",
                "#003f5c", "#d45087")
#: names outside the registry (and syncs beyond SYNC_PALETTE): tab20b's
#: dark row, none of them a SYNC_PALETTE colour
OTHER_COLORS = ("#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#5254a3", "#8ca252",
                "#bd9e39", "#ad494a", "#a55194")
#: an option setting's shade of its sync's colour: + towards white, -
#: towards black, by that much; the first two are the furthest apart, so
#: two settings of a sync read apart
SHADES = (0.45, -0.4, -0.6, 0.25, 0.6, -0.2)

GROUP_STYLES = {"global": ("-", "o"), "intra_node": ("--", "s"), "cross_node": (":", "^"),
                "same_node": ("--", "s")}
GROUP_COLORS = {"global": "tab:blue", "intra_node": "tab:orange", "cross_node": "tab:green",
                "same_node": "tab:orange"}
IMPL_MARKERS = {"torch": "o", "ring": "D", "butterfly": "v", "tree": "P", "linear": "x"}


def _hash(text: str) -> int:
    """A hash of `text` that is the same in every process (Python's
    `hash` is salted)."""
    return int.from_bytes(hashlib.md5(text.encode()).digest()[:4], "big")


#: names outside the sync registry that other lines are read against
# the bench's library all_reduce
REFERENCE_COLORS = {"torch": "#000000"}


def name_color(name: str) -> str:
    """The colour of a synchroniser or implementation by its name alone
    (#rrggbb)."""
    if name in REFERENCE_COLORS:
        return REFERENCE_COLORS[name]
    syncs = list(SCHEMAS["sync"])
    if name in syncs and syncs.index(name) < len(SYNC_PALETTE):
        return SYNC_PALETTE[syncs.index(name)]
    return OTHER_COLORS[_hash(name) % len(OTHER_COLORS)]


def _mix(color: str, amount: float) -> str:
    """`color` moved towards white (amount > 0) or black (< 0) by
    |amount|."""
    rgb = [int(color[i:i + 2], 16) for i in (1, 3, 5)]
    end = 255 if amount > 0 else 0
    return "#" + "".join(f"{round(c + (end - c) * abs(amount)):02x}" for c in rgb)


def sync_color(label: str) -> str:
    """The colour of a report's series label (`ring`, `ring
    prepost=true`, `allreduce compress=fp16 overlap=true
    launcher=slurm`): its sync's colour, and for an option setting a
    shade of it picked by the setting (its words in any order)."""
    name, *setting = label.split()
    base = name_color(name)
    if not setting:
        return base
    return _mix(base, SHADES[_hash(" ".join(sorted(setting))) % len(SHADES)])


def impl_color(impl: str, order: list[str] | None = None) -> str:
    """A bench implementation's colour: its name's (`ring` as
    sync=ring); `order`, the implementations beside it, changes nothing
    (kept for the bench's callers)."""
    return name_color(impl)
