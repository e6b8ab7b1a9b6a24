"""The words of a name: what a run folder or TensorBoard run may hold,
and a bench sweep's job name. A training run's name is its description's
label (`ring-prepost_w3_mlp`). Stdlib only: the submitting side and the
ranks both import it.
"""

from __future__ import annotations

import re
from typing import Iterable

# groups named only when not conf/config.yaml's default (sync and model:
# always)
DEFAULT_GROUPS = {"optim": "adam", "launcher": "local"}
# a name longer than this is cut: file systems and sidebars both have
# limits
MAX_LEN = 60


def sweep_name(overrides: Iterable[str]) -> str:
    """A sweep job's name from the overrides the sweep varies, in their
    order: a group's option as it is (`sync=ring` -> `ring`), a key by
    its last part and value (`train.lr=0.1` -> `lr0.1`,
    `sync.compress=fp16` -> `compress-fp16`)."""
    parts = []
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        value = safe(value)
        if "." not in key:
            parts.append(value)
        else:
            leaf = key.rsplit(".", 1)[1]
            parts.append(leaf + (value if value[:1].isdigit() else f"-{value}"))
    return safe("_".join(p for p in parts if p))


def safe(text: str) -> str:
    """Letters, digits, `.`, `-` and `_` only (a path and a shell word
    as it is), at most MAX_LEN characters: `[256,256]` -> `256-256`."""
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")
    return text[:MAX_LEN].rstrip("-._")
