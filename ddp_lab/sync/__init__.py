"""Gradient synchronisers, chosen with the `sync` config group: a file
each (sync/<name>.py, start with naive.py; tree and butterfly live with
allreduce.py, their family), its config keys and rules in
config/sync.py. Importing this package loads no torch (the
submitting command checks the config without it); the names below come
from sync/build.py, loaded on first use."""

from __future__ import annotations

from typing import Any

_BUILD_NAMES = ("SYNCS", "Synchroniser", "build_sync", "sync_class")


# PEP 562: `from ddp_lab.sync import build_sync`
def __getattr__(name: str) -> Any:
    if name in _BUILD_NAMES:
        from . import build

        return getattr(build, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_BUILD_NAMES)
