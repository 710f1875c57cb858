"""Causal per-series scores for ``stepguard score-series``."""

import math
import pickle

import pytest

from detectors.series import SeriesScorer, score_series


def test_scores_are_in_unit_interval_and_spikes_score_high():
    rows = [{"a": 1.0 + 0.01 * (i % 5), "b": 5.0} for i in range(40)]
    rows.append({"a": 3.0, "b": 5.0})
    scores = SeriesScorer().score_rows(rows)
    assert all(0.0 <= s <= 1.0 for s in scores)
    assert max(scores[:-1]) < 0.2 and scores[-1] > 0.9


def test_a_row_score_uses_only_earlier_rows():
    rows = [{"a": float(i % 7)} for i in range(30)]
    changed = [*rows[:20], *({"a": 1e6} for _ in range(10))]
    assert SeriesScorer().score_rows(rows)[:20] == SeriesScorer().score_rows(changed)[:20]


def test_score_one_does_not_mutate():
    s = SeriesScorer(warmup=2)
    s.score_rows([{"a": 1.0}, {"a": 2.0}, {"a": 1.5}])
    before = pickle.dumps(s)
    s.score_one({"a": 100.0, "new": 1.0})
    assert pickle.dumps(s) == before


def test_columns_combine_by_max_and_missing_values_are_skipped():
    s = SeriesScorer(warmup=3)
    s.score_rows([{"a": 1.0, "b": 1.0}] * 10)
    assert s.score_one({"a": 1.0, "b": 50.0}) == s.score_column("b", 50.0)
    assert s.score_one({"a": None, "b": math.nan}) == 0.0


def test_level_shift_is_absorbed_gradually():
    rows = [{"a": 1.0 + 0.01 * (i % 3)} for i in range(30)] + [{"a": 2.0}] * 300
    scores = SeriesScorer().score_rows(rows)
    assert scores[30] > 0.9 and scores[-1] < 0.1


def test_score_series_checks_lengths():
    with pytest.raises(ValueError, match="column 'a'"):
        score_series([1, 2], {"a": [1.0]})
    assert len(score_series([1, 2, 3], {"a": [1.0, 2.0, 3.0]})) == 3


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"fading_factor": 0}, "fading_factor"),
        ({"warmup": 0}, "warmup"),
        ({"z_scale": 0}, "z_scale"),
        ({"clip_z": 0}, "clip_z"),
        ({"z_offset": -1}, "z_offset"),
    ],
)
def test_invalid_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        SeriesScorer(**kwargs)
