"""Shared detector vocabulary: :class:`Finding` and argument checks.

Every detector turns telemetry into findings: one scored subject (a rank, a node or
the whole job) for one *signal*. Findings are plain frozen dataclasses; the grader
(:mod:`detectors.grading.grader`) turns a stream of findings into graded
:class:`schemas.Alert` updates with hysteresis.

Examples
--------
>>> f = Finding("straggler", node="n3", rank=25, score=0.12, metric="compute_s",
...             value=1.12, deviation=9.5, peer_median=1.0)
>>> f.key
('straggler', 'n3', 25)
>>> f.evidence().peer_median
1.0
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from schemas.alerts import Evidence

__all__ = ["Finding", "SubjectKey", "check_fraction", "check_positive", "check_non_negative"]

#: (signal, node, rank): what one alert episode is about.
SubjectKey = tuple[str, str | None, int | None]


def _finite_or_none(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


@dataclass(frozen=True, slots=True)
class Finding:
    """One scored subject for one signal, with the numbers an SRE checks first.

    ``score`` is in the signal's own units (a slowdown fraction, a MAD-unit deviation,
    degrees Celsius, ...); the signal's grading policy holds the thresholds.
    """

    signal: str
    node: str | None
    rank: int | None
    score: float
    metric: str
    value: float
    deviation: float
    peer_median: float | None = None
    baseline: float | None = None
    trend: float | None = None
    detail: str = ""

    @property
    def key(self) -> SubjectKey:
        return (self.signal, self.node, self.rank)

    def evidence(self) -> Evidence:
        """The :class:`schemas.Evidence` of this finding (non-finite numbers dropped)."""
        value = self.value if math.isfinite(self.value) else 0.0
        deviation = self.deviation if math.isfinite(self.deviation) else 0.0
        detail = self.detail
        if not math.isfinite(self.value):
            detail = f"{detail} (value {self.value})".strip()
        return Evidence(
            metric=self.metric,
            value=value,
            peer_median=_finite_or_none(self.peer_median),
            baseline=_finite_or_none(self.baseline),
            deviation=deviation,
            trend=_finite_or_none(self.trend),
            detail=detail,
        )


def check_positive(name: str, value: float) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is finite and > 0."""
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name} must be > 0, got {value!r}")


def check_non_negative(name: str, value: float) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is finite and >= 0."""
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{name} must be >= 0, got {value!r}")


def check_fraction(name: str, value: float, *, open_low: bool = True) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` lies in (0, 1] (or [0, 1])."""
    low_ok = value > 0 if open_low else value >= 0
    if not (math.isfinite(value) and low_ok and value <= 1):
        raise ValueError(f"{name} must be in {'(0' if open_low else '[0'}, 1], got {value!r}")
