"""One rule for event times from the future, shared by every entry point.

A message dated more than ``STEPGUARD_MAX_CLOCK_SKEW_S`` (default 300 s) beyond the
wall clock of whoever receives it is never acted on: one such record would otherwise
move a job's event time (and with it every hang clock and staleness check), hold
every later control change as "not newer", or carry a command that looks fresh for
hours. Each entry point applies :func:`future_dated` and treats a refusal the way it
treats other bad input:

==================================================  ======================================
entry point                                         a message dated too far ahead
==================================================  ======================================
worker: steps, health, lifecycle                    dead letter, stage ``clock``
actuator: decisions, approvals, control             dead letter, stage ``clock``; a
                                                    control message read back at start is
                                                    judged against its broker time too
executors, job controller (``CommandListener``)     REFUSED result, never executed
``StepExporter``, node aggregator, export-health    not published: counted, one warning
                                                    per interval (:class:`FutureGate`);
                                                    training never stops for a bad clock
==================================================  ======================================

Examples
--------
>>> future_dated(1_000.0, 300.0, now=900.0) is None
True
>>> print(future_dated(1_000.0, 300.0, now=600.0, field="ts_end"))
ts_end 1000.000 (1970-01-01T00:16:40+00:00) is 400s ahead of the wall clock,
over STEPGUARD_MAX_CLOCK_SKEW_S=300
>>> future_dated(float("nan"), 300.0, now=600.0)
'ts nan is not a time, over STEPGUARD_MAX_CLOCK_SKEW_S=300'
>>> future_dated(1e30, None, now=0.0) is None  # no limit configured
True
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from datetime import UTC, datetime

__all__ = ["SKEW_SETTING", "FutureGate", "future_dated", "seconds_ahead"]

log = logging.getLogger(__name__)

#: The environment variable that sets the limit (named in every refusal).
SKEW_SETTING = "STEPGUARD_MAX_CLOCK_SKEW_S"


def _epoch(t: datetime | float) -> float:
    return t.timestamp() if isinstance(t, datetime) else float(t)


def seconds_ahead(ts: datetime | float, now: datetime | float) -> float:
    """How far ``ts`` lies beyond ``now`` in seconds (negative: in the past).

    >>> seconds_ahead(datetime(2026, 1, 1, 0, 5, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC))
    300.0
    """
    return _epoch(ts) - _epoch(now)


def _when(ts: datetime | float) -> str:
    if isinstance(ts, datetime):
        return ts.isoformat()
    try:
        return f"{ts:.3f} ({datetime.fromtimestamp(ts, UTC).isoformat()})"
    except (OverflowError, OSError, ValueError):  # e.g. milliseconds passed as seconds
        return f"{ts:.3f}"


def future_dated(
    ts: datetime | float,
    max_skew_s: float | None,
    *,
    now: datetime | float | None = None,
    field: str = "ts",
    whose: str = "the wall",
) -> str | None:
    """Why ``ts`` is refused, or None when it is at most ``max_skew_s`` beyond ``now``.

    Parameters
    ----------
    ts
        The message's event time (aware datetime or epoch seconds).
    max_skew_s
        The limit (``Settings.max_clock_skew_s``); None: no check.
    now
        The receiver's wall clock; default :func:`time.time`.
    field
        The message field ``ts`` came from, named in the reason.
    whose
        Whose clock ``now`` is, for the reason ("the wall", "this worker's").

    Returns
    -------
    str or None
        The reason, naming the field, how far ahead it is and the setting; a time
        that is not a number (NaN) is refused too.
    """
    if max_skew_s is None:
        return None
    ahead = seconds_ahead(ts, time.time() if now is None else now)
    if ahead <= max_skew_s:
        return None
    if math.isnan(ahead):
        return f"{field} {ts} is not a time, over {SKEW_SETTING}={max_skew_s:g}"
    return (
        f"{field} {_when(ts)} is {ahead:.0f}s ahead of {whose} clock, over "
        f"{SKEW_SETTING}={max_skew_s:g}"
    )


class FutureGate:
    """An exporter's gate: drop what is dated too far ahead, count it, warn once per
    interval (the training loop or node agent goes on).

    Parameters
    ----------
    max_skew_s
        The limit (``Settings.max_clock_skew_s``); None: everything passes.
    who
        Names the exporter in the warning.
    interval_s
        At most one warning per this many seconds, with the count since the last one.
    clock
        Wall clock (epoch seconds) that event times are judged against.
    monotonic
        Paces the warnings.

    Examples
    --------
    >>> gate = FutureGate(300.0, "exporter", clock=lambda: 1_000.0)
    >>> gate.admit(1_200.0, "ts_end"), gate.admit(2_000.0, "ts_end"), gate.dropped
    (True, False, 1)
    """

    def __init__(
        self,
        max_skew_s: float | None,
        who: str,
        *,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_skew_s is not None and not max_skew_s > 0:
            raise ValueError(f"max_skew_s must be positive, got {max_skew_s!r}")
        if not interval_s > 0:
            raise ValueError(f"interval_s must be positive, got {interval_s!r}")
        self.max_skew_s = max_skew_s
        self.who = who
        self.interval_s = interval_s
        self.clock = clock
        self._monotonic = monotonic
        self.dropped = 0  #: messages refused so far
        self._warned = 0  #: ``dropped`` at the last warning
        self._next_warning = -math.inf

    def admit(self, ts: datetime | float, field: str = "ts", now: float | None = None) -> bool:
        """True when ``ts`` may be published; else count, maybe warn, and say False."""
        if self.max_skew_s is None:
            return True
        wall = self.clock() if now is None else now
        if seconds_ahead(ts, wall) <= self.max_skew_s:  # NaN fails this too
            return True
        self.dropped += 1
        mono = self._monotonic()
        if mono >= self._next_warning:
            self._next_warning = mono + self.interval_s
            reason = future_dated(ts, self.max_skew_s, now=wall, field=field)
            log.warning("%s: %d message(s) dated in the future not published (is this "
                        "host's clock or the time passed in wrong?); latest: %s", self.who,
                        self.dropped - self._warned, reason)  # fmt: skip
            self._warned = self.dropped
        return False
