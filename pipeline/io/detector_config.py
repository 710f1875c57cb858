"""The detector settings file: the thresholds ``stepguard calibrate --apply`` writes.

A JSON object of :class:`~detectors.config.DetectorConfig` fields that differ from the
defaults (``{"straggler_warning": 0.06, "hang_factor": 3.0}``). The worker builds every
new job's detectors from it when ``STEPGUARD_DETECTOR_CONFIG`` names it; calibration
reads it as "the running settings" that ``--dry-run`` compares against.

Examples
--------
>>> cfg = config_from_overrides({"straggler_warning": 0.06})
>>> cfg.straggler_warning, overrides_of(cfg)
(0.06, {'straggler_warning': 0.06})
>>> config_from_overrides({"straggler_warnin": 0.06})
Traceback (most recent call last):
...
pipeline.io.errors.ConfigError: detector setting 'straggler_warnin' does not exist (...)
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from detectors.config import DetectorConfig
from pipeline.io.errors import ConfigError

__all__ = [
    "SETTING_NAMES",
    "config_from_overrides",
    "load_detector_config",
    "overrides_of",
    "write_detector_config",
]

#: Every detector setting a file or a calibration grid may name.
SETTING_NAMES: frozenset[str] = frozenset(f.name for f in fields(DetectorConfig))
_DEFAULTS = DetectorConfig()
#: Largest settings file read (it holds a few dozen numbers).
_MAX_FILE_BYTES = 64 * 1024


def _value(name: str, value: Any) -> Any:
    default = getattr(_DEFAULTS, name)
    if isinstance(default, frozenset):
        if not isinstance(value, list | tuple | frozenset | set) or not all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            raise ConfigError(f"detector setting {name!r}: expected a list of integers")
        return frozenset(value)
    if isinstance(default, bool):
        if not isinstance(value, bool):
            raise ConfigError(f"detector setting {name!r}: expected true or false")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"detector setting {name!r}: expected a number, got {value!r}")
    if isinstance(default, int):
        if float(value) != int(value):
            raise ConfigError(f"detector setting {name!r}: expected an integer, got {value!r}")
        return int(value)
    if not math.isfinite(value):
        raise ConfigError(f"detector setting {name!r}: expected a finite number")
    return float(value)


def config_from_overrides(overrides: Mapping[str, Any]) -> DetectorConfig:
    """A :class:`DetectorConfig` with ``overrides`` on the defaults; a name that is not a
    setting, a value of the wrong type or a bad combination is a ``ConfigError`` naming
    it."""
    clean = {}
    for name, value in overrides.items():
        if name not in SETTING_NAMES:
            raise ConfigError(f"detector setting {name!r} does not exist (see detectors/config.py)")
        clean[name] = _value(name, value)
    try:
        return DetectorConfig(**clean)
    except ValueError as exc:
        raise ConfigError(f"detector settings {clean}: {exc}") from exc


def overrides_of(config: DetectorConfig) -> dict[str, Any]:
    """The settings of ``config`` that differ from the defaults, by name."""
    out = {}
    for f in fields(DetectorConfig):
        v = getattr(config, f.name)
        if v != getattr(_DEFAULTS, f.name):
            out[f.name] = sorted(v) if isinstance(v, frozenset) else v
    return out


def load_detector_config(path: Path | None) -> DetectorConfig:
    """The settings in ``path`` (the defaults when ``None``)."""
    if path is None:
        return DetectorConfig()
    try:
        with path.open("rb") as fh:
            raw = fh.read(_MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"STEPGUARD_DETECTOR_CONFIG {path}: {exc.strerror}") from exc
    if len(raw) > _MAX_FILE_BYTES:
        raise ConfigError(f"STEPGUARD_DETECTOR_CONFIG {path}: larger than {_MAX_FILE_BYTES} B")
    try:
        data = json.loads(raw)
    except ValueError as exc:
        raise ConfigError(f"STEPGUARD_DETECTOR_CONFIG {path}: not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"STEPGUARD_DETECTOR_CONFIG {path}: expected a JSON object")
    try:
        return config_from_overrides(data)
    except ConfigError as exc:
        raise ConfigError(f"STEPGUARD_DETECTOR_CONFIG {path}: {exc}") from exc


def write_detector_config(path: Path, config: DetectorConfig) -> Path:
    """Write ``config``'s non-default settings to ``path`` (atomically: a worker starting
    meanwhile reads the old file or the new one, never half of one)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(overrides_of(config), indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    return path
