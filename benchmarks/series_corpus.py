"""A labelled corpus of metric series for ``benchmarks/series_quality.py``.

Seven families, each drawn from first principles rather than fitted to any public
corpus. Every series is sampled every 5 minutes from Monday 2026-01-05 00:00 UTC; its
noise is an AR(1) process (coefficient uniform in [0, 0.6], unit marginal spread)
around a random level (uniform in [-50, 50]) at a random scale (10 ** uniform(-2, 2)),
unless the family says otherwise. Per family and seed: 8 series with anomalies
(1 to 3 windows) and 2 without (null series: any alarm is false).

==============  ======================================================================
spikes          1-3 spikes of 1-2 rows, +-5 to 10 marginal sd; window = the spike rows
level_shift     one lasting shift of +-2.5 to 5 sd; window = 25 rows from the shift
drift           a ramp of 150-400 rows to +-3 to 6 sd, then the new level stays;
                window = the ramp
variance        the noise grows 2.5-4 x for 80-250 rows; window = those rows
seasonal_break  14 days of a daily cycle (a fundamental 3-6 sd, a second harmonic
                half as large) over the noise; on one day from day 8 the cycle is
                missing or 6 hours late; window = that day
quantized       integer counts (Poisson, mean 1-8) or a gauge rounded to a quantum
                0.7-3 x its noise; one spike (6-10 sd, rounded) or shift (3-5 sd)
heavy_tailed    Student-t noise (1.5-3 degrees of freedom); one lasting shift of 5-10
                scale units (window 25 rows) or the noise growing 4-6 x for 80-250 rows
==============  ======================================================================

Anomalies start after the first 20 % of a series (the evaluation ignores alarms in the
first 15 %). Everything is drawn from ``numpy.random.default_rng([seed, family, i])``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

__all__ = ["FAMILIES", "Series", "generate"]

START = 1767571200.0  # 2026-01-05 00:00 UTC, a Monday
INTERVAL = 300.0
ROWS = 2016  # 7 days
SEASONAL_ROWS = 4032  # 14 days
PER_FAMILY = 10
NULL_PER_FAMILY = 2

FAMILIES = (
    "spikes",
    "level_shift",
    "drift",
    "variance",
    "seasonal_break",
    "quantized",
    "heavy_tailed",
)


@dataclass(frozen=True)
class Series:
    """One labelled series: values, times in seconds and anomaly windows [start, end)."""

    name: str
    family: str
    times: np.ndarray
    values: np.ndarray
    windows: tuple[tuple[int, int], ...]


def _ar1(rng: np.random.Generator, n: int) -> np.ndarray:
    phi = rng.uniform(0.0, 0.6)
    e = rng.standard_normal(n) * np.sqrt(1.0 - phi * phi)
    out = np.empty(n)
    prev = rng.standard_normal()
    for i in range(n):
        prev = phi * prev + e[i]
        out[i] = prev
    return out


def _starts(rng: np.random.Generator, n: int, k: int, lo: float, hi: float, gap: int) -> list[int]:
    """k sorted positions in [lo n, hi n) at least gap apart."""
    for _ in range(1000):
        pos = sorted(int(p) for p in rng.uniform(lo * n, hi * n, size=k))
        if all(b - a >= gap for a, b in itertools.pairwise(pos)):
            return pos
    return sorted(int(p) for p in np.linspace(lo * n, hi * n, k))


def _sign(rng: np.random.Generator) -> float:
    return 1.0 if rng.random() < 0.5 else -1.0


def _spikes(rng, n, anomalous):
    x = _ar1(rng, n)
    windows = []
    if anomalous:
        for s in _starts(rng, n, int(rng.integers(1, 4)), 0.2, 0.95, 100):
            length = int(rng.integers(1, 3))
            x[s : s + length] += _sign(rng) * rng.uniform(5.0, 10.0)
            windows.append((s, s + length))
    return x, windows


def _level_shift(rng, n, anomalous):
    x = _ar1(rng, n)
    windows = []
    if anomalous:
        s = int(rng.uniform(0.3, 0.8) * n)
        x[s:] += _sign(rng) * rng.uniform(2.5, 5.0)
        windows.append((s, s + 25))
    return x, windows


def _drift(rng, n, anomalous):
    x = _ar1(rng, n)
    windows = []
    if anomalous:
        s, length = int(rng.uniform(0.3, 0.6) * n), int(rng.integers(150, 401))
        total = _sign(rng) * rng.uniform(3.0, 6.0)
        ramp = np.clip((np.arange(n) - s) / length, 0.0, 1.0)
        x += total * ramp
        windows.append((s, s + length))
    return x, windows


def _variance(rng, n, anomalous):
    x = _ar1(rng, n)
    windows = []
    if anomalous:
        s, length = int(rng.uniform(0.3, 0.7) * n), int(rng.integers(80, 251))
        x[s : s + length] *= rng.uniform(2.5, 4.0)
        windows.append((s, s + length))
    return x, windows


def _seasonal_break(rng, n, anomalous):
    hours = np.arange(n) * INTERVAL / 3600.0
    a = rng.uniform(3.0, 6.0)
    phase = rng.uniform(0, 2 * np.pi)

    def cycle(h):
        return a * np.sin(2 * np.pi * h / 24 + phase) + 0.5 * a * np.sin(4 * np.pi * h / 24)

    x = cycle(hours) + _ar1(rng, n)
    windows = []
    if anomalous:
        per_day = int(86400 / INTERVAL)
        day = int(rng.integers(8, n // per_day))
        s, e = day * per_day, min((day + 1) * per_day, n)
        if rng.random() < 0.5:
            x[s:e] -= cycle(hours[s:e])
        else:
            x[s:e] += cycle(hours[s:e] - 6.0) - cycle(hours[s:e])
        windows.append((s, e))
    return x, windows


def _quantized(rng, n, anomalous):
    windows = []
    if rng.random() < 0.5:
        lam = rng.uniform(1.0, 8.0)
        base = rng.poisson(lam, n).astype(float)
        sd, rounder = np.sqrt(lam), np.round
    else:
        sd = 1.0
        quantum = rng.uniform(0.7, 3.0)
        base = _ar1(rng, n)

        def rounder(v):
            return np.round(v / quantum) * quantum

    x = base.copy()
    if anomalous:
        s = int(rng.uniform(0.3, 0.8) * n)
        if rng.random() < 0.5:
            x[s] += _sign(rng) * rng.uniform(6.0, 10.0) * sd
            windows.append((s, s + 1))
        else:
            x[s:] += _sign(rng) * rng.uniform(3.0, 5.0) * sd
            windows.append((s, s + 25))
    return rounder(x), windows


def _heavy_tailed(rng, n, anomalous):
    x = rng.standard_t(rng.uniform(1.5, 3.0), n)
    windows = []
    if anomalous:
        s = int(rng.uniform(0.3, 0.7) * n)
        if rng.random() < 0.5:
            x[s:] += _sign(rng) * rng.uniform(5.0, 10.0)
            windows.append((s, s + 25))
        else:
            length = int(rng.integers(80, 251))
            x[s : s + length] *= rng.uniform(4.0, 6.0)
            windows.append((s, s + length))
    return x, windows


_MAKERS = {
    "spikes": _spikes,
    "level_shift": _level_shift,
    "drift": _drift,
    "variance": _variance,
    "seasonal_break": _seasonal_break,
    "quantized": _quantized,
    "heavy_tailed": _heavy_tailed,
}


def generate(seed: int, families: tuple[str, ...] = FAMILIES) -> list[Series]:
    """The corpus of one seed: ``PER_FAMILY`` series per family (the last ones null)."""
    out = []
    for f, family in enumerate(FAMILIES):
        if family not in families:
            continue
        n = SEASONAL_ROWS if family == "seasonal_break" else ROWS
        for i in range(PER_FAMILY):
            rng = np.random.default_rng([seed, f, i])
            anomalous = i < PER_FAMILY - NULL_PER_FAMILY
            shape, windows = _MAKERS[family](rng, n, anomalous)
            if family == "quantized":
                values = shape  # counts and gauges keep their own units
            else:
                values = rng.uniform(-50, 50) + 10 ** rng.uniform(-2, 2) * shape
            out.append(
                Series(
                    name=f"{family}-{seed}-{i}{'' if anomalous else '-null'}",
                    family=family,
                    times=START + INTERVAL * np.arange(n),
                    values=np.asarray(values, dtype=float),
                    windows=tuple((int(a), int(min(b, n))) for a, b in windows),
                )
            )
    return out
