"""One generic name -> entry table for every kind the config names (synchronisers, launchers,
models, ...): validation, `--help` and error messages all read it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Generic, Optional, TypeVar

from .errors import UserError

T = TypeVar("T")


class UnknownName(UserError, LookupError):
    """A name a registry does not hold; the message lists the valid ones."""


class Registry(Mapping[str, T], Generic[T]):
    """Entries by name, in registration order; `key` is the config key every error names."""

    def __init__(self, key: str, entries: Optional[Mapping[str, T]] = None):
        self.key = key
        self._entries: dict[str, T] = {}
        for name, entry in (entries or {}).items():
            self.add(name, entry)

    def add(self, name: str, entry: T) -> T:
        if name in self._entries:
            raise ValueError(f"{self.key} '{name}' is registered twice")
        self._entries[name] = entry
        return entry

    def get(self, name: str) -> T:  # type: ignore[override]  -- raises, never None
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownName(f"unknown {self.key} '{name}': choose one of "
                              f"{self.choices()}") from None

    def check(self, names: Iterable[str]) -> None:
        """Every one of `names` (a list-valued key such as bench.ops) is registered."""
        names = list(names)
        if not names:
            raise UserError(f"{self.key} is empty: choose from {self.choices()}")
        bad = [str(n) for n in names if n not in self._entries]
        if bad:
            raise UnknownName(f"{self.key}: unknown {', '.join(bad)}: choose from "
                              f"{self.choices()}")

    def choices(self) -> str:
        return ", ".join(self._entries)

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.key}: {self.choices()})"
