"""The check's config: `conf/check.yaml` composes it (Hydra overrides as every entry point:
`check.worlds=[2,3] run.root=/scratch/me`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List

from hydra.core.config_store import ConfigStore

from ..config import RunConfig, doc


@dataclass
class CheckConfig:
    """Which worlds a student's functions are checked on, and how long one case may take."""

    worlds: List[int] = doc([1, 2, 3, 4, 5, 6, 7], "world sizes checked, each with real gloo "
                                                    "ranks forked from one process")
    timeout_s: float = doc(3.0, "the longest one case may take before it is a hang (more "
                                "for large tensors on many ranks)")


@dataclass
class CheckRootConfig:
    check: CheckConfig = field(default_factory=CheckConfig)
    run: RunConfig = field(default_factory=RunConfig)


def register_check_configs() -> None:
    ConfigStore.instance().store(group="schema", name="check_config", node=CheckRootConfig)
