"""The rules on the config's keys: sections and keys it knows, keys a
preset needs, durations that parse."""

from __future__ import annotations

import dataclasses
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from ..launch.slurm import duration_s


#: keys that hold a duration in SLURM's formats: each is read by
#: `duration_s` (the one parser, with SLURM's launcher: --time,
#: signal_s), here before any process starts
DURATION_KEYS = ("launcher.time",)
def durations(cfg: DictConfig) -> Optional[str]:
    """Every DURATION_KEYS key this config has (launcher.time: slurm
    only) parses."""
    for key in DURATION_KEYS:
        value = OmegaConf.select(cfg, key)
        if value is not None:
            duration_s(key, value)  # raises the one line
    return None


def required_launcher_keys(cfg: DictConfig) -> Optional[str]:
    """A site preset's `launcher.required` keys must be set for a real
    submission. A dry run still renders without them: it only shows the
    script, and seeing it is how a user finds what to fill in (the
    missing #SBATCH lines are simply absent)."""
    for key in cfg.launcher.get("required", []):
        if key not in cfg.launcher:
            return f"launcher.required names launcher.{key}, which launcher={cfg.launcher.name} has not"
        if not cfg.launcher.dry_run and cfg.launcher[key] in (None, "", []):
            return (f"launcher.{key} is not set, and this cluster preset needs it: add "
                    f"launcher.{key}=... (or launcher.dry_run=true to only render the job)")
    return None


def known_sections(cfg: DictConfig) -> Optional[str]:
    """`+foo=1` adds a top-level key the typed sections cannot catch:
    refuse it. The sections are the fields of the schema the config was
    composed from (config.Config, the bench's BenchRootConfig), so the
    list is never written twice."""
    allowed = [f.name for f in dataclasses.fields(OmegaConf.get_type(cfg))]
    extra = [k for k in cfg if k not in allowed]
    if extra:
        return (f"{extra[0]}: not a config section (sections: {', '.join(allowed)}); "
                f"drop +{extra[0]}=...")
    return _known_keys(cfg, "")


def _known_keys(node: DictConfig, prefix: str) -> Optional[str]:
    """`+sync.foo=1` (Hydra's `+` adds a key even to a typed section)
    would be ignored: refuse a key that is no field of its section's
    dataclass, at any depth."""
    kind = OmegaConf.get_type(node)
    if not dataclasses.is_dataclass(kind):
        # a plain mapping (a dict-typed key): any key is its content
        return None
    fields = [f.name for f in dataclasses.fields(kind)]
    for key in node:
        full = f"{prefix}{key}"
        if key not in fields:
            section = prefix.rstrip(".")
            return (f"{full}: not a key of {section} ({section} keys: {', '.join(fields)}); "
                    f"drop +{full}=...")
        child = node._get_node(key)
        if isinstance(child, DictConfig) and not child._is_none() and not child._is_missing():
            problem = _known_keys(child, full + ".")
            if problem:
                return problem
    return None
