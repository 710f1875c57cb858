"""The series-quality benchmark's corpus and event-level scoring (benchmarks/series_quality.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[4]


def _load(name: str) -> ModuleType:
    if str(ROOT / "benchmarks") not in sys.path:  # the scripts import their siblings
        sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def sq() -> ModuleType:
    return _load("series_quality")


@pytest.fixture(scope="module")
def corpus() -> ModuleType:
    return _load("series_corpus")


def series(corpus, windows, n=1000):
    return corpus.Series("t", "spikes", np.arange(n) * 300.0, np.zeros(n), tuple(windows))


def scores_at(n, rows):
    out = np.zeros(n)
    out[list(rows)] = 0.9
    return out.tolist()


def test_a_window_counts_once_with_its_delay_and_tolerance(sq, corpus):
    s = series(corpus, [(400, 410), (700, 701)])
    # one alarm inside the first window, one 15 rows after the second (within tolerance)
    t = sq.evaluate(scores_at(1000, [403, 404, 716]), s)
    assert (t.windows, t.detected, t.false_positives, t.delays) == (2, 2, 0, [3, 16])
    # 20 rows after the end is outside the tolerance: a miss and a false positive
    t = sq.evaluate(scores_at(1000, [721]), s)
    assert (t.detected, t.false_positives) == (0, 1)


def test_false_alarms_group_into_runs_and_probation_is_ignored(sq, corpus):
    s = series(corpus, [])
    rows = [10, 100, 500, 505, 509, 530, 900]  # 10 and 100 fall in the first 15 %
    t = sq.evaluate(scores_at(1000, rows), s)
    assert t.false_positives == 3  # {500, 505, 509}, {530}, {900}
    assert t.summary()["precision"] == 0.0 and t.summary()["recall"] == 1.0


def test_the_corpus_is_seeded_labelled_and_large_enough(corpus):
    a, b = corpus.generate(0), corpus.generate(0)
    assert len(a) >= 60 and {s.family for s in a} == set(corpus.FAMILIES)
    assert all(np.array_equal(x.values, y.values) for x, y in zip(a, b, strict=True))
    for s in a:
        n = len(s.values)
        assert np.isfinite(s.values).all() and len(s.times) == n
        assert all(0.2 * n <= start < end <= n for start, end in s.windows)
        assert bool(s.windows) != s.name.endswith("-null")
    quantized = [s for s in a if s.family == "quantized"]
    assert all(len(np.unique(s.values)) < 200 for s in quantized)


def test_json_names_the_three_scorers_with_families(sq):
    tally = sq.Tally(windows=2, detected=1, false_positives=1, delays=[4])
    flat = {name: {**tally.summary(), "families": {}} for name in sq.SCORERS}
    nested = sq.nest(flat)
    assert set(nested) == {"stepguard", "baselines"}
    assert set(nested["baselines"]) == {"zscore", "hst"}
    assert nested["stepguard"]["f1"] == 0.5 and nested["stepguard"]["delay_rows_median"] == 4
