"""Bounded memory of the policy: every map is ordered oldest first, forgotten by age
(:func:`drop_front`, the horizon) and capped (:class:`Cap`, the backstop).

Examples
--------
>>> cap = Cap(2)
>>> d: dict[str, int] = {}
>>> for k in "abc":
...     touch(d, k, 1)
...     cap(d)
>>> list(d), cap.evicted
(['b', 'c'], 1)
>>> drop_front(d, lambda v: v == 1); d
{}
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TypeVar

__all__ = ["Cap", "drop_front", "touch"]

_V = TypeVar("_V")


def touch(d: dict[str, _V], key: str, value: _V) -> None:
    """Set ``d[key]`` and move it to the end: dicts stay ordered oldest first."""
    d.pop(key, None)
    d[key] = value


def drop_front(d: dict[str, _V], stale: Callable[[_V], bool]) -> None:
    """Drop entries from the front (oldest) while they are stale."""
    while d:
        key = next(iter(d))
        if not stale(d[key]):
            return
        del d[key]


@dataclass(slots=True)
class Cap:
    """The hard cap of every map (``max_tracked`` entries), shared by the policy's parts;
    ``evicted`` counts entries dropped by it rather than by age."""

    max_tracked: int
    evicted: int = 0

    def __call__(self, d: dict[str, _V], also: dict[str, datetime] | None = None) -> None:
        """Drop the oldest entries of ``d`` (and their keys in ``also``) over the cap."""
        while len(d) > self.max_tracked:
            key = next(iter(d))
            del d[key]
            if also is not None:
                also.pop(key, None)
            self.evicted += 1
