"""Metric series: the causal series scorer, its seasonal profiles and calibration."""
