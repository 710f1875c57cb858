"""What every settings class shares: the ``STEPGUARD_`` prefix, the frozen model
configuration and the loader that names the variable a bad value came from."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings, SettingsConfigDict

from pipeline.io.errors import ConfigError

__all__ = ["ENV_PREFIX", "load_role"]

ENV_PREFIX = "STEPGUARD_"
#: every settings class: frozen, ``STEPGUARD_*``, unknown variables ignored
MODEL_CONFIG = SettingsConfigDict(
    env_prefix=ENV_PREFIX, frozen=True, extra="ignore", case_sensitive=False
)

_S = TypeVar("_S", bound=BaseSettings)


def load_role(cls: type[_S], env: Mapping[str, str] | None = None, **overrides: object) -> _S:
    """Settings ``cls`` (one role's, or the whole :class:`~pipeline.io.settings.Settings`)
    from ``env`` (default: the process environment) plus ``overrides``; only the
    variables of ``cls`` are read.

    Raises :class:`ConfigError` naming the ``STEPGUARD_*`` variable that is wrong.

    >>> from pipeline.io.settings import WorkerSettings
    >>> load_role(WorkerSettings, {"STEPGUARD_WORKER_MAX_JOBS": "5"}).worker_max_jobs
    5
    >>> load_role(WorkerSettings, {"STEPGUARD_WORKER_MAX_JOBS": "0"})
    Traceback (most recent call last):
    ...
    pipeline.io.errors.ConfigError: invalid configuration: STEPGUARD_WORKER_MAX_JOBS: Input ...
    """
    return _load(cls, env, overrides)


def _load(cls: type[_S], env: Mapping[str, str] | None, overrides: dict[str, object]) -> _S:
    try:
        if env is None:
            return cls(**overrides)  # type: ignore[arg-type]
        values: dict[str, object] = {
            k[len(ENV_PREFIX) :].lower(): v for k, v in env.items() if k.startswith(ENV_PREFIX)
        }
        values.update(overrides)
        return cls.model_validate(values)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False):
            field = ".".join(str(p) for p in err["loc"])
            name = f"{ENV_PREFIX}{field.upper()}" if field else "settings"
            problems.append(f"{name}: {err['msg']}")
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from exc
