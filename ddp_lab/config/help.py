"""`--help`'s keys, each with its meaning: a schema declares `nodes: int = doc(1, "number of
machines")`, the text rides on the field's metadata, and `help_keys` (the `${ddp_lab_keys:...}`
resolver) shows it beside every key of the composed config.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
from dataclasses import field
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf


def doc(default: Any, text: str) -> Any:
    """A config key: its default and its meaning in one line, which `--help` shows beside it
    (`field_docs` reads it back from the dataclass field). A list or dict default is copied for
    every config, as a dataclass wants of a mutable default."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata={"doc": text})
    return field(default=default, metadata={"doc": text})


@functools.lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """A schema dataclass's keys (inherited ones too) -> their one-line meaning."""
    return {f.name: " ".join(f.metadata["doc"].split())
            for f in dataclasses.fields(cls) if "doc" in f.metadata}


def one_line(text: str, width: int) -> str:
    """`text` cut to `width` characters at a word, marked with `...` where cut."""
    return text if len(text) <= width else text[: width - 3].rsplit(" ", 1)[0] + "..."


def help_keys(app: str, *, _root_: DictConfig) -> str:
    """`--help`'s config: every key of the composed config with its value and meaning."""
    rows: list[tuple[str, str]] = []

    def walk(node: DictConfig, depth: int) -> None:
        docs = field_docs(OmegaConf.get_type(node)) if dataclasses.is_dataclass(OmegaConf.get_type(node)) else {}
        for key in node:
            if depth == 0 and key == "hydra":
                continue
            child = node._get_node(key)
            pad = "  " * depth
            if isinstance(child, DictConfig) and not child._is_none() and len(child):
                rows.append((f"{pad}{key}:", docs.get(key, "")))
                walk(child, depth + 1)
            else:
                value = OmegaConf.to_container(child) if isinstance(child, (DictConfig, ListConfig)) \
                    else child._value()
                text = "null" if value is None else json.dumps(value) if not isinstance(value, str) \
                    or not value or value.strip() != value else value
                rows.append((f"{pad}{key}: {text}", docs.get(key, "")))

    walk(_root_, 0)
    width = min(44, max(len(left) for left, _ in rows) + 2)
    return "\n".join(f"{left:<{width}}# {one_line(text, 98 - max(width, len(left)))}" if text else left
                     for left, text in rows)
