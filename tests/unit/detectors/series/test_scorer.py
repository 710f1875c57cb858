"""Causal, calibrated per-series scores for ``stepguard score-series``."""

import math
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from detectors.series.scorer import DAY, SeriesScorer, score_series

START = 1767571200.0  # a Monday, 00:00 UTC


def rows_of(values, name="a"):
    return [{name: float(v)} for v in values]


def alarms(scores, threshold=0.5):
    return [i for i, s in enumerate(scores) if s >= threshold]


def test_scores_are_in_unit_interval_and_spikes_score_high():
    rows = [{"a": 1.0 + 0.01 * (i % 5), "b": 5.0} for i in range(40)]
    rows.append({"a": 3.0, "b": 5.0})
    scores = SeriesScorer().score_rows(rows)
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert max(scores[:-1]) < 0.5 and scores[-1] > 0.9


def test_a_row_score_uses_only_earlier_rows():
    x = np.random.default_rng(3).standard_normal(600).tolist()
    times = [START + 300.0 * i for i in range(600)]
    full = SeriesScorer().score_rows(rows_of(x), times)
    changed = [*x[:400], *([1e6] * 200)]
    again = SeriesScorer().score_rows(rows_of(changed), times)
    assert again[:400] == full[:400]
    assert again[400] > 0.8


def test_scoring_does_not_mutate():
    s = SeriesScorer(warmup=3)
    s.score_rows(rows_of([1.0, 2.0, 1.5, 1.2, 1.7, 1.1]))
    before = pickle.dumps(s)
    s.score_one({"a": 100.0, "new": 1.0}, ts=5.0)
    s.explain_one({"a": -100.0})
    assert pickle.dumps(s) == before


def test_seeded_runs_repeat_and_step_equals_score_then_learn():
    x = np.random.default_rng(0).standard_t(3, 500)
    a = SeriesScorer().score_rows(rows_of(x))
    b = SeriesScorer().score_rows(rows_of(x))
    s, split = SeriesScorer(), []
    for row in rows_of(x):
        split.append(s.score_one(row))
        s.learn_one(row)
    assert a == b == split


def test_columns_combine_by_rarest_and_missing_values_are_skipped():
    rng = np.random.default_rng(1)
    s = SeriesScorer()
    s.score_rows([{"a": float(u), "b": float(v)} for u, v in rng.standard_normal((300, 2))])
    detail = s.explain_one({"a": 0.1, "b": 40.0})
    assert detail.column == "b" and detail.kind == "spike" and detail.score > 0.7
    assert s.score_one({"a": None, "b": math.nan}) == 0.0
    # one column scored alone is less surprising than among many (Bonferroni)
    assert s.explain_one({"b": 4.0}).log_p < s.explain_one({"a": 0.0, "b": 4.0}).log_p


def test_constant_and_quantized_series_raise_no_alarm():
    assert max(SeriesScorer().score_rows(rows_of([7.0] * 500))) == 0.0
    counts = np.random.default_rng(2).poisson(0.7, 3000)
    assert len(alarms(SeriesScorer().score_rows(rows_of(counts))[200:])) <= 2
    # a step of one quantum on a constant gauge is a change, scored once, then learned
    stepped = SeriesScorer().score_rows(rows_of([5.0] * 300 + [6.0] * 300))
    assert stepped[300] >= 0.5 and max(stepped[340:]) < 0.5


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda x, i: x + (12.0 if i == 700 else 0.0), "spike"),
        (lambda x, i: x + (6.0 if i >= 700 else 0.0), "shift"),
        (lambda x, i: x + 0.03 * max(i - 700, 0), "drift"),
        (lambda x, i: x * (5.0 if i >= 700 else 1.0), "variance"),
    ],
    ids=["spike", "shift", "drift", "variance"],
)
def test_kinds_of_change_are_told_apart(make, kind):
    noise = np.random.default_rng(4).standard_normal(1000)
    values = [make(float(v), i) for i, v in enumerate(noise)]
    s = SeriesScorer()
    details = [s.step_one(row) for row in rows_of(values)]
    flagged = [i for i, d in enumerate(details) if i > 200 and d.score >= 0.5]
    assert flagged and 700 <= flagged[0] < 800
    # the first row of a shift or of wider noise is a spike; the episode is told apart
    kinds = [details[i].kind for i in flagged if i < 800]
    assert max(set(kinds), key=kinds.count) == kind, kinds


def test_a_lasting_level_shift_alarms_then_becomes_normal():
    noise = np.random.default_rng(5).standard_normal(2000)
    scores = SeriesScorer().score_rows(rows_of(noise + np.where(np.arange(2000) >= 1000, 8.0, 0.0)))
    assert max(scores[1000:1005]) > 0.6
    assert alarms(scores[1050:]) == []


def test_daily_season_is_learned_and_a_missing_peak_is_flagged():
    rng = np.random.default_rng(6)
    n = 288 * 10  # ten days of 5-minute rows
    hours = np.arange(n) * 300.0 / 3600.0
    cycle = 10.0 * np.sin(2 * np.pi * hours / 24)
    values = cycle + rng.standard_normal(n)
    broken = values.copy()
    day = slice(288 * 8, 288 * 9)
    broken[day] -= cycle[day]  # day 8 has no cycle: every value is within the usual range
    times = (START + 300.0 * np.arange(n)).tolist()
    s = SeriesScorer()
    details = [s.step_one({"a": float(v)}, t) for v, t in zip(broken, times, strict=True)]
    assert details[288 * 7].seasonal == DAY
    assert max(d.score for d in details[288 * 8 : 288 * 9]) >= 0.5
    assert alarms([d.score for d in details[288 * 3 : 288 * 8]]) == []
    plain = SeriesScorer(season="none").score_rows(rows_of(broken))
    assert max(plain[288 * 8 : 288 * 9]) < 0.5  # without the season, the day looks ordinary


@pytest.mark.parametrize(
    "family",
    ["gauss", "ar1", "student_t2", "poisson", "rounded", "daily"],
)
def test_calibrated_rate_on_null_series_is_the_designed_rate(family):
    rng = np.random.default_rng(7)
    n = 12000
    x = {
        "gauss": lambda: rng.standard_normal(n),
        "ar1": lambda: np.convolve(rng.standard_normal(n), 0.7 ** np.arange(30))[:n],
        "student_t2": lambda: rng.standard_t(2, n),
        "poisson": lambda: rng.poisson(2.0, n).astype(float),
        "rounded": lambda: np.round(rng.standard_normal(n) * 0.8),
        "daily": lambda: 5 * np.sin(2 * np.pi * np.arange(n) / 288) + rng.standard_normal(n),
    }[family]()
    times = (START + 300.0 * np.arange(n)).tolist() if family == "daily" else None
    scores = np.asarray(SeriesScorer(rarity=100).score_rows(rows_of(x), times))[2000:]
    rate = float((scores >= 0.5).mean())
    assert 0.002 <= rate <= 0.025, rate


def test_score_series_checks_lengths():
    with pytest.raises(ValueError, match="column 'a'"):
        score_series([1, 2], {"a": [1.0]})
    with pytest.raises(ValueError, match="times"):
        score_series([1, 2], {"a": [1.0, 2.0]}, times=[0.0])
    assert len(score_series([1, 2, 3], {"a": [1.0, 2.0, 3.0]})) == 3


def test_columns_are_bounded():
    s = SeriesScorer(max_columns=2)
    s.learn_one({"a": 1.0, "b": 2.0})
    with pytest.raises(ValueError, match="max_columns"):
        s.learn_one({"c": 1.0})


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"warmup": 2}, "warmup"),
        ({"shift_memory": 30}, "shift_memory"),
        ({"long_memory": 10}, "long_memory"),
        ({"variance_memory": 0}, "variance_memory"),
        ({"rarity": 1}, "rarity"),
        ({"season": "hourly"}, "season"),
        ({"season": -5}, "season"),
        ({"max_columns": 0}, "max_columns"),
    ],
)
def test_invalid_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SeriesScorer(**kwargs)


values = st.one_of(
    st.none(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.floats(-1e6, 1e6),
    st.sampled_from([0.0, 1.0, 1e-300, -1e300]),
)


@settings(max_examples=40, deadline=None)
@given(
    rows=st.lists(st.fixed_dictionaries({"a": values, "b": values}), min_size=1, max_size=60),
    times=st.lists(st.floats(0, 2e9) | st.none(), min_size=60, max_size=60),
    cut=st.integers(0, 60),
    season=st.sampled_from(["auto", "none", 3600.0]),
)
def test_any_input_gives_finite_unit_scores_that_later_rows_never_change(rows, times, cut, season):
    scores = SeriesScorer(warmup=3, season=season).score_rows(rows, times)
    assert all(math.isfinite(s) and 0.0 <= s <= 1.0 for s in scores)
    tail = [{"a": 1e300, "b": -1e-300}] * 5
    scorer = SeriesScorer(warmup=3, season=season)
    again = scorer.score_rows(rows[:cut] + tail, times)
    assert again[: min(cut, len(rows))] == scores[: min(cut, len(rows))]
    # whatever came before, the state holds numbers: ordinary rows score finitely
    for col in scorer._columns.values():
        assert math.isfinite(col.plain.level) and math.isfinite(col.plain.spread_level)


def test_a_finite_value_far_beyond_the_learned_scale_scores_one_not_nan():
    """Found by the property above: after values that grew to 6e16, a finite 2.8e296
    made both tails of the calibrator underflow to -inf, and their log-sum-exp gave NaN."""
    grown = [1.4011478898110764e16, 5.960101153143119e16, 830484.6534819992]
    values = [0.0] * 10 + [1.0, 3.0, 4.0, 6.0, 12.0, 18.0, *grown, 2.803124915643106e296]
    times = [0.0] * 11 + [None, 0.0, None, 0.0, None, None, None, None, 0.0]
    for season in ("none", "auto"):
        rows = [{"a": v} for v in values]
        scores = SeriesScorer(warmup=3, season=season).score_rows(rows, times)
        assert all(math.isfinite(x) and 0.0 <= x <= 1.0 for x in scores), (season, scores)
        assert scores[-1] == 1.0
