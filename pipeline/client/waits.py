"""When a rank's wait for its next batch is worth saying while it lasts.

A stalled input pipeline (a storage hiccup, a slow object store, a data loader whose
workers died) stops the job's steps as a hang does, and from outside the job the two
look the same until the step completes. The job's leader knows the difference while
it waits: :class:`InputWait` decides when its wait has gone on long enough to say so
(a ``wait`` lifecycle event, :meth:`~pipeline.client.exporter.StepExporter.waiting`):
once it lasts ``steps`` of the rank's own median step time (at least ``min_s``), one
event per wait, nothing while the rank has too few steps to know its pace. A step whose
wait was said is not learned into the pace (as the hang clock does not learn it): a
storage stall of many steps is said at every one of them, not taken for the new pace
after a few.

The simulator applies the same rule to its scenarios, so the detection benchmark judges
the events the client would send.

>>> w = InputWait()
>>> w.threshold_s() is None  # no pace known yet
True
>>> for _ in range(8):
...     w.learn(0.8)
>>> w.threshold_s()
0.8
"""

from __future__ import annotations

import math
from collections import deque
from statistics import median

__all__ = ["InputWait"]


class InputWait:
    """The rank's recent step times, and how long a wait for input may last unsaid.

    Parameters
    ----------
    steps
        A wait is said once it lasts this many median step times (a step's wall time
        includes its data wait: a job always bound by its input waits less than a step).
    min_s
        ... and at least this many seconds (a job of millisecond steps is not worth an
        event per hiccup).
    warmup
        Step times needed before any wait is said.
    kept
        Step times the median is taken over.
    """

    def __init__(
        self, steps: float = 1.0, min_s: float = 0.1, warmup: int = 5, kept: int = 32
    ) -> None:
        if not (math.isfinite(steps) and steps > 0):
            raise ValueError(f"steps must be positive, got {steps!r}")
        if not (math.isfinite(min_s) and min_s >= 0):
            raise ValueError(f"min_s must be >= 0, got {min_s!r}")
        if warmup < 1 or kept < warmup:
            raise ValueError(f"need 1 <= warmup <= kept, got {warmup!r}, {kept!r}")
        self.steps = steps
        self.min_s = min_s
        self.warmup = warmup
        self._times: deque[float] = deque(maxlen=kept)

    def learn(self, step_time_s: float, *, said: bool = False) -> None:
        """A step of this rank took ``step_time_s`` (its wait for data included);
        ``said``: its wait was said, so it is not the rank's pace."""
        if not said and math.isfinite(step_time_s) and step_time_s > 0:
            self._times.append(step_time_s)

    def threshold_s(self) -> float | None:
        """Seconds a wait may last before it is said; None while warming up."""
        if len(self._times) < self.warmup:
            return None
        return max(self.min_s, self.steps * median(self._times))
