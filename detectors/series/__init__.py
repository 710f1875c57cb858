"""Metric series: any per-step series scored causally against its own past.

Members: :mod:`~detectors.series.scorer` (``SeriesScorer``: ``learn_one`` /
``score_one`` per value, robust baselines with seasonal profiles), its seasons
(:mod:`~detectors.series.season`) and tail calibration
(:mod:`~detectors.series.calibration`).

Imports only the vocabulary below the families, never another family.
"""
