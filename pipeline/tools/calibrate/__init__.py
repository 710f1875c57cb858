"""Calibration: replay archived or simulated jobs through a grid of detector settings.

:mod:`~pipeline.tools.calibrate.grid` (the grid and scoring), ``archive`` (reading jobs
back), ``seed`` and ``settings`` (what a grid point changes), ``graduation`` (promoting
settings), ``labels`` (incident labels) and ``command`` (the CLI body).
"""
