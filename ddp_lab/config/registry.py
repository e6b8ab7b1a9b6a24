"""One generic name -> entry table for every kind the config names (synchronisers, launchers,
models, ...): validation, `--help` and error messages all read it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Dict, Mapping, Optional, TypeVar

from .errors import UserError

T = TypeVar("T")


class UnknownName(UserError, LookupError):
    """A name a registry does not hold; the message lists the valid ones."""


class Registry(Dict[str, T]):
    """Entries by name, in registration order; `key` is the config key every error names."""

    def __init__(self, key: str, entries: Optional[Mapping[str, T]] = None):
        super().__init__(entries or {})
        self.key = key

    def add(self, name: str, entry: T) -> T:
        if name in self:
            raise ValueError(f"{self.key} '{name}' is registered twice")
        self[name] = entry
        return entry

    def get(self, name: str) -> T:  # type: ignore[override]  -- raises, never None
        return self[name]

    def __missing__(self, name: str) -> T:
        raise UnknownName(f"unknown {self.key} '{name}': choose one of {self.choices()}")

    def check(self, names: Iterable[str]) -> None:
        """Every one of `names` (a list-valued key such as bench.ops) is registered."""
        names = list(names)
        if not names:
            raise UserError(f"{self.key} is empty: choose from {self.choices()}")
        bad = [str(n) for n in names if n not in self]
        if bad:
            raise UnknownName(f"{self.key}: unknown {', '.join(bad)}: choose from "
                              f"{self.choices()}")

    def choices(self) -> str:
        return ", ".join(self)

    def __repr__(self) -> str:
        return f"Registry({self.key}: {self.choices()})"
