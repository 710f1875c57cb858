"""Per-rank temporal baselines of peer-relative metrics, and creep detection.

Peer scores (:mod:`detectors.steps.peer`) say how a rank compares with its peers *now*.
Some ranks are always a little slower (pipeline-stage or sequence-length imbalance);
that is normal and must not page anyone. :class:`RankBaselines` therefore keeps, per
rank, an exponentially weighted mean and variance of each peer-relative metric (the
compute slowdown, the data-wait excess, the comm-wait excess), vectorised over ranks
with numpy (the same recurrence as River's ``stats.EWMean``/``stats.EWVar``, see
:class:`detectors._stats.EWArrays`), and scores the *excess over the rank's own
baseline*.

- Warm-up guard: until a rank has ``warmup_steps`` learned steps its scores are
  neutral (zero excess), its baseline being the plain mean of those steps.
- Learning is filtered (River's ``anomaly.ThresholdFilter`` idea): a value more than
  ``learn_gate_z`` robust units away from the baseline is not learned, and the
  baseline moves slowly (``alpha``), so a fault or a creep is not absorbed into
  "normal". (The update is symmetric on purpose: a baseline that falls faster than it
  rises settles below the median of the noise and biases every excess upwards.)
- Creep, two ways: a one-sided CUSUM (Page's test) of the clipped z of the slowdown
  excess, ``S = max(0, S + clip(z, -c, c) - k)``, and an EW-smoothed excess
  (``smooth_alpha``) with its own z (the per-step noise shrinks by
  ``sqrt(a / (2 - a))``). Both catch a gradual degradation long before its slowdown
  reaches the straggler threshold, even when per-step noise is large.

Only the caller decides which steps learn (TRAIN-phase ranks, not judged critical).
Ranks are addressed by *slot*, the dense index :class:`~detectors.steps.ranks.RankIndex`
gives them, so state arrays hold one entry per distinct rank, whatever the rank ids.

Examples
--------
>>> import numpy as np
>>> b = RankBaselines(n_metrics=1, warmup_steps=3)
>>> ranks = np.arange(4)
>>> scale = np.full((1, 4), 0.01)
>>> for _ in range(3):
...     s = b.score(ranks, np.zeros((1, 4)), scale)
...     b.learn(ranks, np.zeros((1, 4)), scale, np.ones(4, bool), s)
>>> s = b.score(ranks, np.array([[0.0, 0.0, 0.0, 0.05]]), scale)
>>> s.warmed.all(), float(s.excess[0, 3]), float(s.z[0, 3]), float(s.cusum[3])
(np.True_, 0.05, 5.0, 3.0)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from detectors._stats import EWArrays
from detectors.base import check_non_negative, check_positive

__all__ = ["RankBaselines", "TemporalScores"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
B = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True, eq=False)
class TemporalScores:
    """Scores of one step for the given ranks; ``(n_metrics, n)`` unless noted."""

    excess: F64  #: value - rank baseline (0 while warming up)
    z: F64  #: excess / max(peer scale, rank's own EW std, floor)
    warmed: B  #: (n,) the rank's baseline is trustworthy
    baseline: F64  #: the rank's baseline mean
    cusum: F64  #: (n,) CUSUM of the first metric after this step
    smooth: F64  #: (n,) EW-smoothed excess of the first metric after this step
    smooth_z: F64  #: (n,) smoothed excess over its noise scale
    trend: F64  #: (n,) EW mean of the step-to-step change of the first metric's excess


class RankBaselines:
    """Per-rank baselines of ``n_metrics`` peer-relative metrics, plus a CUSUM.

    Parameters
    ----------
    n_metrics
        Number of metrics tracked per rank (row 0 also feeds the CUSUM).
    warmup_steps
        Learned steps before a rank's scores leave neutral.
    alpha
        EW weight of a new value (time constant ~``1 / alpha`` steps).
    alpha_up
        EW weight when the value lies above the baseline (default ``alpha``).
    learn_gate_z
        Values with ``|z| >`` this are judged anomalous and not learned.
    scale_floor
        Floor of the z denominator, in the metric's units.
    cusum_k
        CUSUM allowance per step, in z units.
    cusum_clip
        z is clipped to ``[-cusum_clip, cusum_clip]`` before entering the CUSUM, so a
        single slow step adds at most ``cusum_clip - cusum_k``.
    trend_alpha
        EW weight of the trend (slope per step) estimate.
    smooth_alpha
        EW weight of the smoothed excess of the first metric.
    """

    def __init__(
        self,
        n_metrics: int = 3,
        warmup_steps: int = 20,
        alpha: float = 0.005,
        alpha_up: float | None = None,
        learn_gate_z: float = 3.0,
        scale_floor: float = 0.005,
        cusum_k: float = 1.0,
        cusum_clip: float = 4.0,
        trend_alpha: float = 0.05,
        smooth_alpha: float = 0.2,
    ) -> None:
        if n_metrics < 1:
            raise ValueError(f"n_metrics must be >= 1, got {n_metrics!r}")
        if warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1, got {warmup_steps!r}")
        alpha_up = alpha if alpha_up is None else alpha_up
        for name, value in (
            ("alpha", alpha),
            ("alpha_up", alpha_up),
            ("trend_alpha", trend_alpha),
            ("smooth_alpha", smooth_alpha),
        ):
            if not 0 < value <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {value!r}")
        check_positive("learn_gate_z", learn_gate_z)
        check_positive("scale_floor", scale_floor)
        check_non_negative("cusum_k", cusum_k)
        check_positive("cusum_clip", cusum_clip)
        self.n_metrics = n_metrics
        self.warmup_steps = warmup_steps
        self.alpha = alpha
        self.alpha_up = alpha_up
        self.learn_gate_z = learn_gate_z
        self.scale_floor = scale_floor
        self.cusum_k = cusum_k
        self.cusum_clip = cusum_clip
        self.trend_alpha = trend_alpha
        self.smooth_alpha = smooth_alpha
        self._smooth_factor = float(np.sqrt(smooth_alpha / (2.0 - smooth_alpha)))
        self._ew = [
            EWArrays(0, alpha=alpha, warmup=warmup_steps, alpha_up=alpha_up)
            for _ in range(n_metrics)
        ]
        self._cusum = np.zeros(0)
        self._last = np.zeros(0)
        self._trend = np.zeros(0)
        self._smooth = np.zeros(0)
        self._steps = np.zeros(0, dtype=np.int64)
        self._fast = np.zeros(0)

    #: per slot, the EW mean square of the first metric's *negative* excess, doubled
    #: (a half-normal's variance): how noisy a rank is, measured on the side a slow
    #: rank never reaches, so a straggler cannot raise it (class default: a state
    #: stored before the field existed reads it)
    _fast = np.zeros(0)
    #: EW weight of :attr:`_fast`; it counts once it exceeds ``NOISY_RATIO`` x the
    #: other scales (a noisier rank, not a slower one)
    FAST_ALPHA = 0.02
    NOISY_RATIO = 1.5

    @property
    def n_slots(self) -> int:
        return int(self._cusum.shape[0])

    def _ensure(self, slots: I64) -> None:
        need = int(slots.max()) + 1 if slots.shape[0] else 0
        if need <= self.n_slots:
            return
        for ew in self._ew:
            ew.grow(need)
        size = self._ew[0].n_slots
        extra = size - self.n_slots
        self._cusum = np.concatenate((self._cusum, np.zeros(extra)))
        self._last = np.concatenate((self._last, np.zeros(extra)))
        self._trend = np.concatenate((self._trend, np.zeros(extra)))
        self._smooth = np.concatenate((self._smooth, np.zeros(extra)))
        self._steps = np.concatenate((self._steps, np.zeros(extra, dtype=np.int64)))

    def _gather(self, slots: I64) -> tuple[F64, F64, npt.NDArray[np.int64]]:
        n = slots.shape[0]
        if n and int(slots.max()) < self.n_slots:  # every rank has a slot: plain takes
            return (
                np.stack([ew.mean[slots] for ew in self._ew]).astype(np.float64, copy=False),
                np.stack([ew.var[slots] for ew in self._ew]).astype(np.float64, copy=False),
                np.stack([ew.n[slots] for ew in self._ew]).astype(np.int64, copy=False),
            )
        mean = np.zeros((self.n_metrics, n))
        var = np.zeros((self.n_metrics, n))
        count = np.zeros((self.n_metrics, n), dtype=np.int64)
        inside = slots < self.n_slots
        s_in = slots[inside]
        for m, ew in enumerate(self._ew):
            mean[m, inside] = ew.mean[s_in]
            var[m, inside] = ew.var[s_in]
            count[m, inside] = ew.n[s_in]
        return mean, var, count

    def score(self, slots: I64, values: F64, scales: F64) -> TemporalScores:
        """Score one step of the ranks in ``slots`` (unique); reads state only.

        ``values`` and ``scales`` have shape ``(n_metrics, len(slots))``: the metric and
        its robust peer noise scale for each rank.
        """
        mean, var, count = self._gather(slots)
        warmed = count[0] >= self.warmup_steps
        denom = np.maximum(np.maximum(scales, np.sqrt(var)), self.scale_floor)
        # a rank noisier than its peers on the fast side is noisy, not slow: judge its
        # slow steps against its own spread (the learn gate keeps that spread out of
        # its baseline's variance)
        noisy_sd = np.sqrt(self._fast_of(slots))
        denom[0] = np.where(noisy_sd > self.NOISY_RATIO * denom[0], noisy_sd, denom[0])
        excess = np.where(count >= self.warmup_steps, values - mean, 0.0)
        z = excess / denom
        inside = slots < self.n_slots
        prev = np.zeros(slots.shape[0])
        last = np.zeros(slots.shape[0])
        trend = np.zeros(slots.shape[0])
        smooth = np.zeros(slots.shape[0])
        smooth[inside] = self._smooth[slots[inside]]
        prev[inside] = self._cusum[slots[inside]]
        last[inside] = self._last[slots[inside]]
        trend[inside] = self._trend[slots[inside]]
        inc = np.clip(z[0], -self.cusum_clip, self.cusum_clip) - self.cusum_k
        cusum = np.where(warmed, np.maximum(0.0, prev + inc), 0.0)
        trend = np.where(warmed, trend + self.trend_alpha * ((excess[0] - last) - trend), 0.0)
        # winsorised (a one-step blip moves it by at most smooth_alpha * clip sigmas);
        # its z counts the smoothing noise *and* the baseline's own estimation error
        clipped = np.clip(excess[0], -self.cusum_clip * denom[0], self.cusum_clip * denom[0])
        smooth = np.where(warmed, smooth + self.smooth_alpha * (clipped - smooth), 0.0)
        n_eff = np.minimum(count[0], 2.0 / self.alpha - 1.0).clip(1.0)
        smooth_z = smooth / (denom[0] * np.sqrt(self._smooth_factor**2 + 1.0 / n_eff))
        return TemporalScores(
            excess=excess,
            z=z,
            warmed=warmed,
            baseline=mean,
            cusum=cusum,
            trend=trend,
            smooth=smooth,
            smooth_z=smooth_z,
        )

    def learn(
        self,
        slots: I64,
        values: F64,
        scales: F64,
        mask: B,
        scores: TemporalScores | None = None,
    ) -> None:
        """Learn one step for ``slots[mask]``; ``scores`` must come from :meth:`score`
        on the same arguments (recomputed when omitted). Anomalous values are skipped."""
        self._ensure(slots)
        s = self.score(slots, values, scales) if scores is None else scores
        sel = slots[mask]
        mean, var, count = self._gather(slots)
        for m, ew in enumerate(self._ew):
            warming = count[m] < self.warmup_steps
            ok = mask & (warming | (np.abs(s.z[m]) <= self.learn_gate_z))
            ok &= np.isfinite(values[m])
            # while warming up every value is learned, but winsorised to learn_gate_z
            # spreads (peer scale or the rank's own so far) of the running mean: one
            # spike of a busy host in the warm-up otherwise set the rank's spread for
            # ~1/alpha steps (measured on a CPU DDP job: a +60 % blip left a spread of
            # 0.17, and a +40 % straggler scored z < 3 for 50 steps)
            spread = np.maximum(np.maximum(scales[m], np.sqrt(var[m])), self.scale_floor)
            reach = self.learn_gate_z * spread
            x = np.where(
                warming & (count[m] >= 1),
                np.clip(values[m], mean[m] - reach, mean[m] + reach),
                values[m],
            )
            ew.update(slots[ok], x[ok])
        self._cusum[sel] = s.cusum[mask]
        self._trend[sel] = s.trend[mask]
        self._smooth[sel] = s.smooth[mask]
        self._last[sel] = s.excess[0, mask]
        self._steps[sel] += 1
        if self._fast.shape[0] < self.n_slots:
            self._fast = np.concatenate((self._fast, np.zeros(self.n_slots - self._fast.shape[0])))
        # winsorised like the smoothed excess: one extreme step (a glitched peer in
        # the common mode) raises it by at most FAST_ALPHA * 2 * clip^2 spreads, not
        # by its square, which made a rank "noisy" for a thousand steps
        spread = np.maximum(np.maximum(scales[0], np.sqrt(var[0])), self.scale_floor)
        low = np.maximum(s.excess[0], -self.cusum_clip * spread)
        neg = 2.0 * np.minimum(low[mask], 0.0) ** 2
        self._fast[sel] += self.FAST_ALPHA * (neg - self._fast[sel])

    def _fast_of(self, slots: I64) -> F64:
        out = np.zeros(slots.shape[0])
        inside = slots < self._fast.shape[0]
        out[inside] = self._fast[slots[inside]]
        return out

    def state(self, slots: I64) -> tuple[F64, F64, I64, I64]:
        """Baseline mean, variance and learned count, each ``(n_metrics, len(slots))``,
        and the steps each rank was offered for learning (``(n,)``); reads state only."""
        mean, var, count = self._gather(slots)
        steps = np.zeros(slots.shape[0], dtype=np.int64)
        inside = slots < self.n_slots
        steps[inside] = self._steps[slots[inside]]
        return mean, var, count, steps

    def anchor(self, slots: I64, mean: F64) -> None:
        """Set the first metric's baseline mean of ``slots`` to ``mean`` (variance and
        counts kept): a rank found slow against its peers from its first step is
        judged against its peers' normal, not its own (:mod:`detectors.steps.first_step`)."""
        inside = slots < self.n_slots
        self._ew[0].mean[slots[inside]] = mean[inside]

    def forget(self, slots: I64) -> None:
        """Forget everything about ``slots``: new hardware now runs those ranks (a node
        was replaced), so their baselines warm up again from scratch."""
        inside = slots[slots < self.n_slots]
        for ew in self._ew:
            ew.n[inside] = 0
            ew.mean[inside] = 0.0
            ew.var[inside] = 0.0
        self.reset(inside)
        self._last[inside] = 0.0
        self._steps[inside] = 0
        self._fast[inside[inside < self._fast.shape[0]]] = 0.0

    def reset(self, slots: I64) -> None:
        """Forget the CUSUM of ``slots`` (e.g. after an episode was acted upon)."""
        inside = slots[slots < self.n_slots]
        self._cusum[inside] = 0.0
        self._trend[inside] = 0.0
        self._smooth[inside] = 0.0
