"""A mistake on the command line or in the config, said in one line.

The flags and group values Hydra would answer with a usage block or a traceback, and Hydra's own
errors cut to one line (with "did you mean" hints for a misspelt key).
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
from types import ModuleType
from typing import Callable, Sequence

from hydra._internal.utils import create_config_search_path
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from ..config import CONF_DIR

# Hydra's lines that are noise once its message is one line
_NOISE = re.compile(r"^(Set the environment variable HYDRA_FULL_ERROR|See https://hydra\.cc|"
                    r"reference_type=|object_type=|full_key:|To append to your config use)")


def command_line_mistake(argv: list[str], defaults: Callable[[], DictConfig] = lambda: None
                         ) -> str | None:
    """What is wrong with the command line's flags, in one line, else None: a `--key value` flag is
    named with the override it meant (`--epochs 3`: train.epochs=3, the key found in
    `defaults()`); Hydra's own flag given a bad value gets argparse's one line."""
    from hydra._internal.utils import get_args_parser

    parser = get_args_parser()

    def refuse(message: str):
        raise _FlagError(message)

    # argparse would print the usage block and exit
    parser.error = refuse
    try:
        known, unknown = parser.parse_known_args(argv)
    except _FlagError as e:
        return f"{e}: see --help"
    # Hydra reads it unchecked: a traceback
    rerun = known.experimental_rerun
    if rerun is not None and not os.path.isfile(rerun):
        return f"--experimental-rerun {rerun}: no such file (give a job's .hydra/config.pickle)"
    flags = [a for a in unknown if a.startswith("-") and len(a) > 1]
    if not flags:
        return None
    try:
        keys = _leaves(defaults())
    except (HydraException, OmegaConfBaseException):
        # a config that does not compose: its own error comes once the flags are fixed
        keys = {}
    given, fixed, i = [], [], 0
    while i < len(argv):
        a = argv[i]
        if a in flags:
            key, eq, value = a.lstrip("-").partition("=")
            if not eq and i + 1 < len(argv) and argv[i + 1][:1] != "-" and "=" not in argv[i + 1]:
                # `--sync ring`: its value is the next word
                value = argv[i + 1]
                a, i = f"{a} {value}", i + 1
            given.append(a)
            fixed.append(_as_override(key, value, keys))
        i += 1
    return (f"{' '.join(given)}: not a flag here: settings are key=value overrides: write "
            f"{' '.join(fixed)}")


def group_value_mistake(argv: list[str]) -> str | None:
    """A config group given something other than an option's name (`sync=3`, `study=[1,2]`,
    `sync=null`, `-m sync=ddp,4`), in one line naming the group and its options, else None (Hydra
    would fail deep in its defaults list with a traceback)."""
    words = [a for a in argv if a[:1] != "-"]
    if not words:
        return None
    parser = override_parser()
    overrides = []
    # one by one: a word Hydra cannot parse (or `--cfg job`'s job) does not hide a group mistake
    for word in words:
        try:
            overrides += parser.parse_overrides([word])
        except HydraException:
            continue
    loader = parser.config_loader
    for o in overrides:
        group = o.key_or_group
        if o.is_delete() and o._value is None:
            continue  # `~sync`: no value to judge
        try:
            is_group = loader.repository.group_exists(group)
        except OSError as e:
            # Hydra looks the name up as a folder: 300 characters are not one
            name = group if len(group) <= 60 else group[:40] + f"... ({len(group)} characters)"
            return f"{name}: no such key or config group ({e.strerror})"
        if not is_group:
            continue  # a key (train.epochs=3), not a group
        if o.is_sweep_override():
            try:
                values = list(o.sweep_iterator())
            except HydraException:
                # a sweep Hydra cannot expand: its own line
                continue
        else:
            values = [o.value()]
        wrong = [v for v in values if not isinstance(v, str)]
        if not wrong:
            continue
        wrong = wrong[0]
        options = loader.get_group_options(group)
        what = ("null" if wrong is None else "a list" if isinstance(wrong, list)
                else "a mapping" if isinstance(wrong, dict) else f"the {type(wrong).__name__} {wrong}")
        return (f"{o.input_line}: {group} is a config group and takes one option's name, "
                f"not {what}" + (f": choose {', '.join(options)}" if options else ""))
    return None


def _leaves(cfg) -> dict[str, object]:
    """Every key of `cfg` (dotted) and its node, groups' keys included."""
    out: dict[str, object] = {}

    def walk(node, prefix: str) -> None:
        for k in node.keys() if isinstance(node, DictConfig) else ():
            full = f"{prefix}{k}"
            value = node._get_node(k)
            out[full] = value
            if isinstance(value, DictConfig):
                walk(value, full + ".")

    walk(cfg, "")
    return out


def _as_override(key: str, value: str, keys: dict[str, object]) -> str:
    """The override a `--key value` flag meant: the key as the config spells it (`epochs` ->
    train.epochs, `dry-run` -> launcher.dry_run), a list key's value in brackets, a bare flag true
    where the key is a bool."""
    from omegaconf import ListConfig

    named = [key, key.replace("-", "_")]
    found = next((k for k in named if k in keys), None)
    if found is None:
        matches = sorted({k for k in keys for n in named if k.rsplit(".", 1)[-1] == n})
        found = matches[0] if len(matches) == 1 else None
    key = found or key
    node = keys.get(key)
    if not value:
        value = "true" if node is not None and isinstance(getattr(node, "_val", None), bool) else "VALUE"
    elif isinstance(node, ListConfig) and value[:1] != "[":
        value = f"[{value}]"
    return f"{key}={value}"


class _FlagError(Exception):
    pass


def override_parser() -> OverridesParser:
    """Hydra's override parser as its sweeper makes it: with a config loader, which glob(...) needs
    to list a group's options."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    return OverridesParser.create(config_loader=ConfigLoaderImpl(
        config_search_path=create_config_search_path(str(CONF_DIR))))


def hydra_message(e: BaseException, schemas: Sequence[ModuleType] = ()) -> str:
    """Hydra's message and its cause's, on one line, keeping the key they name; a misspelt key gets
    the close matches of its section (a dataclass of `schemas`) instead of Hydra's '+key' hint."""
    text = str(e)
    cause = e.__cause__
    if cause is not None and str(cause) not in text:
        text += "\n" + str(cause)
    text = text.split("\nConfig search path:")[0]
    message = one_line("\n".join(ln.rstrip().rstrip(".") for ln in text.splitlines()
                                 if not _NOISE.match(ln.strip())))
    # OmegaConf's error names the key on a line of its own
    full_key = getattr(e, "full_key", None)
    if full_key and full_key not in message:
        message = f"{full_key}: {message}"
    # a parse error names the override it could not read
    override = getattr(e, "override", None)
    if override and override not in message:
        message = f"override '{override}': {message}"
    listed = re.search(r"override ([\w.]+)=(.*?); Invalid value assigned: \w+ is not a "
                       r"ListConfig", message)
    # a list key given one value: its bracketed form
    if listed:
        # Hydra's escapes (a\:1) off
        key, value = listed[1], re.sub(r"\\(.)", r"\1", listed[2])
        return f"{key}={value}: {key} is a list: write {key}=[{value}]"
    missing = re.search(r"Key '(\w+)' not in '(\w+)'", message)
    if missing:
        full_key = getattr(cause, "full_key", None) or missing.group(1)
        message += _did_you_mean(full_key, missing.group(2), schemas)
    return message


def one_line(text: str) -> str:
    """Lines joined with '; '; what follows a line ending in ':' joined to it (an indented list by
    ', ')."""
    parts: list[str] = []
    listing = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line:
            continue
        # a heading's items (indented) or its one sentence
        if listing:
            parts[-1] += (" " if parts[-1].endswith(":") else ", ") + line
            listing = raw[:1] in ("\t", " ") or line.endswith(":")
            continue
        listing = line.endswith(":")
        parts.append(line)
    return "; ".join(parts)


def _did_you_mean(full_key: str, type_name: str, schemas: Sequence[ModuleType]) -> str:
    cls = next((getattr(m, type_name) for m in schemas if hasattr(m, type_name)), None)
    if cls is None or not dataclasses.is_dataclass(cls):
        return ""
    section, _, key = full_key.rpartition(".")
    names = [f.name for f in dataclasses.fields(cls)]
    close = [f"{section}.{n}" if section else n for n in difflib.get_close_matches(key, names, n=3)]
    return (f" (did you mean {' or '.join(close)}?)" if close
            else f" ({section or 'its'} keys: {', '.join(names)})")
