"""The tools floor: operator and offline tools.

The simulator, ``up`` and ``demo`` (with their process supervisor), ``status``,
calibration (one package), ``compare``, ``plan``, ``report`` and ``series``. They drive the
services and the detection core; nothing below imports them. May import every floor
except the CLI.
"""
