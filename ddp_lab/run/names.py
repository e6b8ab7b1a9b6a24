"""What a run is called: the one place that names run folders and TensorBoard runs.

A name says what tells a run apart from its neighbours, meaningful part first:

    ring_w4_mlp                       sync, world size, model
    ring-fp16-overlap_w8n2_cnn_sgd    + compression, overlap, nodes, a non-default group
    ring_sgd                          a -m sweep's job: the values of what the sweep varies

The run folder is `<name>_<date>_<time>` (rundir.make_run_dir) and the TensorBoard run
`tb/<describe(...)>/` inside it, so TensorBoard's sidebar (a run is named by its folder
under --logdir) reads `ring_sgd_2026-11-26_16-24-20/tb/ring_w2_mlp_sgd`: what differs
first, the date after, the whole description last. Only stdlib here: the submitting
side and the ranks both import it.
"""

from __future__ import annotations

import re
from typing import Iterable, Mapping, Optional

# groups whose option is part of a name when it is not conf/config.yaml's default
# (tests/test_run_folder.py checks these against the config's defaults list); sync and
# model are always named, data has one option
DEFAULT_GROUPS = {"optim": "adam", "launcher": "local"}
MAX_LEN = 60  # a name longer than this is cut: file systems and sidebars both have limits


def describe(sync: str, model: str, world: Optional[int] = None, nodes: Optional[int] = 1,
             compress: str = "none", overlap: bool = False,
             groups: Mapping[str, str] = (), repeat: Optional[int] = None) -> str:
    """`ring_w4_mlp`; with what is not the default, `ring-fp16-overlap_w8n2_mlp_sgd_r3`
    (fp16 gradients, overlapped, 8 ranks on 2 nodes, optim=sgd, repeat 3 of a study
    point). `world` None (not known yet): no `w` part. `groups`: the run's option of each
    of DEFAULT_GROUPS, named when it is not the default."""
    head = sync
    if compress and compress != "none":
        head += f"-{compress}"
    if overlap and sync != "ddp":  # ddp always overlaps
        head += "-overlap"
    parts = [head]
    if world:
        parts.append(f"w{world}" + (f"n{nodes}" if nodes and nodes > 1 else ""))
    parts.append(model)
    groups = dict(groups)
    parts += [groups[g] for g, default in DEFAULT_GROUPS.items() if groups.get(g, default) != default]
    if repeat:
        parts.append(f"r{repeat}")
    return _safe("_".join(parts))


def sweep_name(overrides: Iterable[str]) -> str:
    """A sweep job's name from the overrides the sweep varies, in their order: a group's
    option as it is (`sync=ring` -> `ring`), a key by its last part and value
    (`train.lr=0.1` -> `lr0.1`, `sync.compress=fp16` -> `compress-fp16`)."""
    parts = []
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        value = _safe(value)
        if "." not in key:
            parts.append(value)
        else:
            leaf = key.rsplit(".", 1)[1]
            parts.append(leaf + (value if value[:1].isdigit() else f"-{value}"))
    return _safe("_".join(p for p in parts if p))


def _safe(text: str) -> str:
    """Letters, digits, `.`, `-` and `_` only (a path and a shell word as it is), at most
    MAX_LEN characters: `[256,256]` -> `256-256`."""
    text = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")
    return text[:MAX_LEN].rstrip("-._")
