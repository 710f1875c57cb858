"""Hypothesis properties of the detectors (quick: modest example counts)."""

import itertools
import math
import pickle
from collections import defaultdict

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from detectors._stats import EWArrays, Groups
from detectors.base import Finding
from detectors.engine import DetectorSuite
from detectors.frame import StepFrame
from detectors.grading.grader import GradePolicy, Grader
from detectors.series.scorer import SeriesScorer
from detectors.steps.peer import PeerDetector
from schemas import AlertKind, AlertState

QUICK = settings(max_examples=25, deadline=None)

timings = st.lists(st.floats(0.05, 5.0), min_size=8, max_size=40)


def frame_of(compute, comm, data, step=0, ts=0.0):
    return StepFrame.from_arrays("job", step, ts, compute, comm, data)


def arrays(draw_list, n):
    return np.resize(np.asarray(draw_list, dtype=float), n)


@QUICK
@given(c=timings, m=timings, d=timings)
def test_peer_scores_are_finite_for_finite_input(c, m, d):
    n = len(c)
    s = PeerDetector().score_frame(frame_of(arrays(c, n), arrays(m, n), arrays(d, n)))
    for name in ("slowdown", "z_compute", "comm_excess", "z_comm", "data_excess", "z_data"):
        assert np.isfinite(getattr(s, name)).all(), name


@QUICK
@given(c=timings, m=timings, d=timings, shift=st.floats(0.0, 10.0))
def test_shifting_every_rank_by_the_same_amount_changes_no_z(c, m, d, shift):
    n = len(c)
    comp, comm, data = arrays(c, n), arrays(m, n), arrays(d, n)
    for a in (comp, comm, data):
        assume(np.median(np.abs(a - np.median(a))) > 1e-3)
    det = PeerDetector(mad_floor_rel=0.0)
    a = det.score_frame(frame_of(comp, comm, data))
    b = det.score_frame(frame_of(comp + shift, comm + shift, data + shift))
    for name in ("z_compute", "z_comm", "z_data"):
        assert np.allclose(getattr(a, name), getattr(b, name), atol=1e-6), name


@QUICK
@given(c=timings, m=timings, d=timings, k=st.sampled_from([0.25, 0.5, 2.0, 8.0]))
def test_scaling_every_rank_changes_no_score(c, m, d, k):
    n = len(c)
    comp, comm, data = arrays(c, n), arrays(m, n), arrays(d, n)
    a = PeerDetector().score_frame(frame_of(comp, comm, data))
    b = PeerDetector().score_frame(frame_of(k * comp, k * comm, k * data))
    for name in ("slowdown", "z_compute", "comm_excess", "z_comm", "data_excess", "z_data"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


@QUICK
@given(
    keys=st.lists(st.integers(0, 4), min_size=1, max_size=50),
    seed=st.integers(0, 2**16),
)
def test_grouped_medians_equal_numpy(keys, seed):
    k = np.asarray(keys)
    v = np.random.default_rng(seed).normal(size=(2, k.size))
    g = Groups.of(k)
    med, mad = g.median_and_mad(v)
    for gi, key in enumerate(np.unique(k)):
        sel = v[:, k == key]
        assert np.allclose(med[:, gi], np.median(sel, axis=1))
        dev = np.abs(sel - np.median(sel, axis=1, keepdims=True))
        assert np.allclose(mad[:, gi], np.median(dev, axis=1))


def batch_ew(xs, alpha, warmup):
    """EW mean/var of a whole prefix from explicit weights (no recurrence)."""
    n = len(xs)
    a = np.array([max(alpha, 1 / i) if i <= warmup else alpha for i in range(1, n + 1)])
    w = a * np.array([np.prod(1 - a[i + 1 :]) for i in range(n)])
    mean = float(np.sum(w * xs))
    return mean, float(np.sum(w * (xs - mean) ** 2))


@QUICK
@given(
    xs=st.lists(st.floats(-100, 100), min_size=1, max_size=30),
    alpha=st.floats(0.01, 1.0),
    warmup=st.integers(1, 10),
)
def test_streaming_ew_equals_batch_computation_at_every_step(xs, alpha, warmup):
    ew = EWArrays(1, alpha=alpha, warmup=warmup)
    for i, x in enumerate(xs, 1):
        ew.update(np.array([0]), np.array([x]))
        mean, var = batch_ew(np.asarray(xs[:i]), alpha, warmup)
        assert math.isclose(ew.mean[0], mean, rel_tol=1e-9, abs_tol=1e-9)
        assert math.isclose(ew.var[0], var, rel_tol=1e-7, abs_tol=1e-7)


def synthetic(seed, steps=45, n=32, slow_rank=5, slow=0.2, k=1.0):
    rng = np.random.default_rng(seed)
    ts = 0.0
    out = []
    for step in range(steps):
        c = 1.0 + 0.01 * rng.standard_normal(n)
        if step >= 25:
            c[slow_rank] *= 1 + slow
        d = 0.01 * rng.random(n)
        comm = (c + d).max() + 0.05 - (c + d)
        ts += 1.5
        out.append(StepFrame.from_arrays("job", step, ts, k * c, k * comm, k * d))
    return out


def alert_keys(alerts):
    return [
        (a.fingerprint, a.seq, a.kind, a.grade, a.state, a.node, a.rank, a.step) for a in alerts
    ]


def run(mon, frames):
    out = []
    for f in frames:
        out += mon.process_step(f)
    return out


@QUICK
@given(seed=st.integers(0, 2**16), k=st.sampled_from([0.25, 0.5, 2.0, 4.0]))
def test_monitor_alerts_do_not_change_when_every_rank_scales(seed, k):
    a = run(DetectorSuite("job"), synthetic(seed))
    b = run(DetectorSuite("job"), synthetic(seed, k=k))
    assert alert_keys(a) == alert_keys(b)


@QUICK
@given(seed=st.integers(0, 2**16), cut=st.integers(1, 44))
def test_pickle_round_trip_gives_identical_outputs(seed, cut):
    frames = synthetic(seed)
    a = DetectorSuite("job")
    run(a, frames[:cut])
    b = pickle.loads(pickle.dumps(a))
    assert alert_keys(run(a, frames[cut:])) == alert_keys(run(b, frames[cut:]))
    assert alert_keys(a.tick(1e6)) == alert_keys(b.tick(1e6))


@QUICK
@given(seed=st.integers(0, 2**16), cut=st.integers(0, 44))
def test_scoring_does_not_mutate_and_scores_are_finite_non_negative(seed, cut):
    frames = synthetic(seed)
    mon = DetectorSuite("job")
    run(mon, frames[:cut])
    before = pickle.dumps(mon)
    scores = mon.score_step(frames[cut])
    assert pickle.dumps(mon) == before
    for f in scores.findings:
        assert math.isfinite(f.score) and f.score >= 0


@QUICK
@given(seed=st.integers(0, 2**16))
def test_seeded_runs_repeat(seed):
    assert alert_keys(run(DetectorSuite("job"), synthetic(seed))) == alert_keys(
        run(DetectorSuite("job"), synthetic(seed))
    )


POLICY = GradePolicy(AlertKind.STRAGGLER, enter=(0.05, 0.1, 0.3), exit=0.02, min_obs=(2, 3, 3))


@QUICK
@given(scores=st.lists(st.sampled_from([0.0, 0.01, 0.03, 0.07, 0.2, 0.5]), max_size=80))
def test_grading_episodes_are_well_formed(scores):
    g = Grader("job", {"s": POLICY})
    alerts = []
    for i, s in enumerate(scores):
        fs = [Finding("s", "n", 1, s, "m", s, s)] if s else []
        alerts += g.observe(fs, signals={"s"}, step=i, ts=float(i))
    by_fp = defaultdict(list)
    for a in alerts:
        by_fp[a.fingerprint].append(a)
    for updates in by_fp.values():
        assert [u.seq for u in updates] == list(range(len(updates)))
        for prev, nxt in itertools.pairwise(updates):
            assert not (prev.state is AlertState.RESOLVED and nxt.state is AlertState.RESOLVED)
    # a single observation above every threshold never fires
    assert all(a.state is AlertState.RESOLVED or a.step >= 1 for a in alerts)


@QUICK
@given(
    rows=st.lists(
        st.fixed_dictionaries({"a": st.floats(-1e3, 1e3), "b": st.floats(0, 10)}),
        max_size=40,
    ),
    cut=st.integers(0, 40),
)
def test_series_scores_in_unit_interval_and_causal(rows, cut):
    scores = SeriesScorer(warmup=3).score_rows(rows)
    assert all(0.0 <= s <= 1.0 for s in scores)
    tail = [{"a": 1e9, "b": -5.0}] * 5
    again = SeriesScorer(warmup=3).score_rows(rows[:cut] + tail)
    assert again[: min(cut, len(rows))] == scores[: min(cut, len(rows))]
