"""The archiver's role (``stepguard archive``): :class:`ArchiveSettings`, which backend and
where."""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings

from pipeline.io.settings._base import MODEL_CONFIG

__all__ = ["ArchiveSettings"]


class ArchiveSettings(BaseSettings):
    """The archive: a ClickHouse server (``clickhouse_dsn``) or, without one, the
    embedded chDB at ``chdb_path``."""

    model_config = MODEL_CONFIG

    #: Prometheus port of ``stepguard archive`` (0: off; :mod:`pipeline.io.metrics`)
    archiver_metrics_port: int = Field(default=9111, ge=0, le=65535)
    clickhouse_dsn: SecretStr | None = None
    chdb_path: Path = Path(".stepguard/archive")

    @field_validator("clickhouse_dsn")
    @classmethod
    def _check_dsn(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or not value.get_secret_value():
            return None
        parts = urlsplit(value.get_secret_value())
        if parts.scheme not in ("clickhouse", "clickhouses") or not parts.hostname:
            raise ValueError("expected clickhouse://[user[:password]@]host[:port][/database]")
        return value

    @property
    def archive_backend(self) -> Literal["server", "chdb"]:
        return "server" if self.clickhouse_dsn is not None else "chdb"
