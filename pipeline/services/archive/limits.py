"""Limits of the read-only queries others run on the archiver's chDB session.

chDB runs one query at a time per process: a query through the query socket
(:mod:`pipeline.services.archive.serve`) holds off the archiver's inserts for as long as it
runs. So such a query runs under ClickHouse's own limits, checked while it executes
and while its result is built (not after), and the backend lets a waiting insert go
before the next one starts (:class:`~pipeline.services.archive.backend.ChdbBackend`): an insert
waits for at most one query, which stops after ``max_execution_s``.

=====================  =================================  ==========================
limit                  ClickHouse setting                 default
=====================  =================================  ==========================
``max_execution_s``    ``max_execution_time`` (throw)     10 s
``max_memory_bytes``   ``max_memory_usage``               1 GiB
``max_result_rows``    ``max_result_rows`` (throw)        1,000,000
``max_result_bytes``   ``max_result_bytes`` (throw)       64 MiB
``max_wait_s``         (a query waits for inserts)        ``max_execution_s``
=====================  =================================  ==========================

>>> with_limits("SELECT 1", QueryLimits(max_execution_s=2)).splitlines()[-1][:40]
'SETTINGS max_execution_time=2, timeout_o'
>>> with_limits("SELECT 1 SETTINGS max_execution_time=0", QueryLimits())
Traceback (most recent call last):
...
pipeline.io.errors.ArchiveError: chDB: refused: SETTINGS is not allowed ... (its limits apply)
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

from pipeline.io.errors import ArchiveError

__all__ = ["QueryLimits", "WaitingWriters", "with_limits"]


@dataclass(frozen=True, kw_only=True)
class QueryLimits:
    """What one read-only query on the archiver's session may take (table above)."""

    max_execution_s: float = 10.0
    max_memory_bytes: int = 1 << 30
    max_result_rows: int = 1_000_000
    max_result_bytes: int = 64 << 20
    #: how long a query waits for the inserts waiting before it (then it runs anyway)
    max_wait_s: float | None = None

    def __post_init__(self) -> None:
        for name in ("max_execution_s", "max_memory_bytes", "max_result_rows",
                     "max_result_bytes"):  # fmt: skip
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.max_wait_s is not None and self.max_wait_s < 0:
            raise ValueError("max_wait_s must be >= 0")

    @property
    def wait_s(self) -> float:
        return self.max_execution_s if self.max_wait_s is None else self.max_wait_s

    def settings(self) -> str:
        """The SETTINGS clause (``readonly`` last: it forbids changing the others)."""
        return (
            f"SETTINGS max_execution_time={self.max_execution_s:g}, "
            "timeout_overflow_mode='throw', "
            f"max_memory_usage={self.max_memory_bytes}, "
            f"max_result_rows={self.max_result_rows}, "
            f"max_result_bytes={self.max_result_bytes}, result_overflow_mode='throw', "
            "readonly=1"
        )


def with_limits(code: str, limits: QueryLimits) -> str:
    """``code`` (one read-only statement, literals blanked or not) with the limits'
    SETTINGS clause after it. A query of its own SETTINGS is refused: one in a
    subquery would lift the limits for that subquery."""
    if re.search(r"\bSETTINGS\b", _blank_literals(code), re.IGNORECASE):
        raise ArchiveError(
            "chDB: refused: SETTINGS is not allowed in a query through the archiver "
            "(its limits apply)"
        )
    return f"{code.rstrip().rstrip(';')}\n{limits.settings()}"


def _blank_literals(sql: str) -> str:
    """``sql`` without its string literals and quoted identifiers (a column or value
    named "settings" is fine); :func:`~pipeline.services.archive.backend.read_only_problem`
    has already refused comments and unterminated literals."""
    return re.sub(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"|`(?:[^`\\]|\\.)*`", "''", sql)


class WaitingWriters:
    """How many statements wait for (or hold) a session; readers wait for none."""

    def __init__(self) -> None:
        self._count = 0
        self._changed = threading.Condition()

    def arrive(self) -> None:
        with self._changed:
            self._count += 1

    def leave(self) -> None:
        with self._changed:
            self._count -= 1
            self._changed.notify_all()

    def wait_none(self, timeout_s: float) -> bool:
        """Wait until none waits, at most ``timeout_s``; whether none does."""
        with self._changed:
            return self._changed.wait_for(lambda: self._count == 0, timeout=timeout_s)
