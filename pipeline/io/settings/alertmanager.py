"""The Alertmanager bridge's role (``stepguard alertmanager``): :class:`AlertmanagerSettings`."""

from __future__ import annotations

from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings

from pipeline.io.settings._base import MODEL_CONFIG

__all__ = ["AlertmanagerSettings"]


class AlertmanagerSettings(BaseSettings):
    """Alertmanager's URL, the labels and annotations of what is pushed, and its pace."""

    model_config = MODEL_CONFIG

    #: Alertmanager's base URL (``http://host:9093``); secret (it may carry credentials):
    #: read it through :attr:`alertmanager`; empty: no bridge
    alertmanager_url: SecretStr = SecretStr("")
    #: the ``cluster`` label of every alert pushed
    alertmanager_cluster: str = Field(default="stepguard", min_length=1, max_length=128)
    #: base of each alert's ``runbook_url`` annotation (the alert kind is appended)
    alertmanager_runbook_url: str = Field(default="", pattern=r"^(https?://\S*)?$")
    #: a firing alert is sent with endsAt = now + this: Alertmanager ends it unless it
    #: is sent again in time (like its own resolve_timeout, which needs no endsAt)
    alertmanager_resolve_timeout_s: float = Field(default=300.0, gt=0)
    #: how often a firing episode is sent again (shorter than the resolve timeout)
    alertmanager_resend_s: float = Field(default=60.0, gt=0)
    #: a firing episode with no update for this long is no longer re-sent
    alertmanager_episode_ttl_s: float = Field(default=6 * 3600.0, gt=0)
    #: firing episodes the bridge keeps at most (oldest dropped first)
    alertmanager_max_episodes: int = Field(default=10_000, ge=1)
    alertmanager_timeout_s: float = Field(default=5.0, gt=0)
    alertmanager_retries: int = Field(default=3, ge=0)
    alertmanager_metrics_port: int = Field(default=9112, ge=0, le=65535)

    @field_validator("alertmanager_url")
    @classmethod
    def _check_alertmanager_url(cls, value: SecretStr) -> SecretStr:
        url = value.get_secret_value().strip()
        if url and not (url.startswith(("http://", "https://")) and urlsplit(url).hostname):
            raise ValueError("expected http(s)://host[:port][/path]")  # never quote it
        return SecretStr(url)

    @model_validator(mode="after")
    def _check_resend(self) -> AlertmanagerSettings:
        if self.alertmanager_resend_s >= self.alertmanager_resolve_timeout_s:
            raise ValueError(
                "ALERTMANAGER_RESEND_S must be shorter than ALERTMANAGER_RESOLVE_TIMEOUT_S "
                "(or Alertmanager ends firing alerts between two sends)"
            )
        return self

    @property
    def alertmanager(self) -> str:
        """Alertmanager's base URL without a trailing slash, or "" (a secret: log
        :func:`pipeline.io.redact.url_origin` of it)."""
        return self.alertmanager_url.get_secret_value().rstrip("/")
