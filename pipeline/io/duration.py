"""The one duration grammar of the command line: ``30s``, ``10m``, ``2h``, ``1d``, ``2w``.

Every option that takes an age or a span (``--since``, ``--older-than``) reads it with
:func:`parse_duration`, so ``stepguard alerts --since 10m`` and ``stepguard calibrate
--since 10m`` mean the same thing.

Examples
--------
>>> parse_duration("10m")
datetime.timedelta(seconds=600)
>>> parse_duration("1.5h").total_seconds()
5400.0
>>> parse_duration("30d").days
30
>>> parse_duration("ten")
Traceback (most recent call last):
...
ValueError: expected a number and a unit (s, m, h, d, w), e.g. 10m or 30d; got 'ten'
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

__all__ = ["parse_duration"]

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhdw])$")
#: Longest span accepted: a century (a timedelta overflows far beyond this anyway).
_MAX_S = 100 * 365 * 86400


def parse_duration(text: str) -> timedelta:
    """A number and a unit (s, m, h, d, w) as a :class:`~datetime.timedelta`.

    Raises :class:`ValueError` (the caller names its option) for anything else, a
    negative or non-finite number, or more than a century.
    """
    m = _DURATION.match(text.strip().lower())
    seconds = float(m.group(1)) * _UNITS[m.group(2)] if m else math.nan
    if not math.isfinite(seconds) or seconds > _MAX_S:
        raise ValueError(
            f"expected a number and a unit (s, m, h, d, w), e.g. 10m or 30d; got {text!r}"
        )
    return timedelta(seconds=seconds)
