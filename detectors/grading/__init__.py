"""Grading: episodes with hysteresis, and the grader that turns scores into alerts."""
