"""What training code needs: :class:`ClientSettings` (:mod:`pipeline.client`)."""

from __future__ import annotations

import ipaddress
from typing import Literal

from pydantic import Field, field_validator

from pipeline.io.settings.broker import KafkaSettings
from pipeline.io.settings.keys import KeySettings, TelemetryAuthSettings

__all__ = ["ClientSettings"]


class ClientSettings(KafkaSettings, KeySettings, TelemetryAuthSettings):
    """What training code needs (:mod:`pipeline.client`): the broker, the keys, the clock
    skew allowed and the listener's metrics port. Build it with :func:`load_client_settings`;
    a full :class:`Settings` is one too, so services can hand theirs down."""

    #: a record dated more than this beyond the wall clock is dead-lettered
    max_clock_skew_s: float = Field(default=300.0, gt=0)
    #: steps sent as version 3 (columns): "rack" messages, "all", or "off" (docs/configuration.md)
    steps_columnar: Literal["rack", "all", "off"] = "rack"
    #: the CommandListener's, inside training code (0: off; one per process on a host)
    listener_metrics_port: int = Field(default=0, ge=0, le=65535)
    #: the address every metrics endpoint binds (the listener's and each service's):
    #: loopback unless asked (an exposition names jobs and nodes; the image and
    #: docker-compose set ``0.0.0.0``)
    metrics_bind_address: str = "127.0.0.1"

    @field_validator("metrics_bind_address")
    @classmethod
    def _check_bind_address(cls, value: str) -> str:
        value = value.strip()
        try:
            ipaddress.ip_address(value)
        except ValueError:
            raise ValueError(
                "expected an IP address to listen on (127.0.0.1, 0.0.0.0, ::1, ::)"
            ) from None
        return value
