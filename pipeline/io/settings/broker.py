"""How to reach the broker: :class:`KafkaSettings` (bootstrap, security, topic prefix),
which every floor needs."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings

from pipeline.io.settings._base import MODEL_CONFIG

__all__ = ["KafkaSettings"]

_HOSTPORT = re.compile(r"^[A-Za-z0-9_.\-\[\]:]+:\d{1,5}$")


class KafkaSettings(BaseSettings):
    """How to reach the broker: bootstrap, security, topic prefix (every floor needs it)."""

    model_config = MODEL_CONFIG

    kafka_bootstrap: str = ""
    kafka_security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    kafka_sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: Path | None = None
    kafka_ssl_certfile: Path | None = None
    kafka_ssl_keyfile: Path | None = None
    broker_flavor: Literal["kafka", "tansu"] = "kafka"
    topic_prefix: str = Field(default="", pattern=r"^[A-Za-z0-9._\-]*$", max_length=100)

    @field_validator("kafka_ssl_cafile", "kafka_ssl_certfile", "kafka_ssl_keyfile")
    @classmethod
    def _check_tls_file(cls, value: Path | None) -> Path | None:
        # a typo'd CA path would otherwise surface as a TLS error at the first connect
        if value is not None and not value.is_file():
            raise ValueError(f"no such file: {value}")
        return value

    @field_validator("kafka_bootstrap")
    @classmethod
    def _check_bootstrap(cls, value: str) -> str:
        value = value.strip()
        if value and not all(_HOSTPORT.match(part.strip()) for part in value.split(",")):
            raise ValueError("expected host:port[,host:port...]")
        return value

    @model_validator(mode="after")
    def _check_security(self) -> KafkaSettings:
        if self.kafka_security_protocol.startswith("SASL"):
            if self.kafka_sasl_mechanism is None:
                raise ValueError(
                    "KAFKA_SASL_MECHANISM is required with "
                    f"KAFKA_SECURITY_PROTOCOL={self.kafka_security_protocol}"
                )
            if not self.kafka_sasl_username or self.kafka_sasl_password is None:
                raise ValueError("KAFKA_SASL_USERNAME and KAFKA_SASL_PASSWORD are required")
        return self

    @property
    def is_tansu(self) -> bool:
        return self.broker_flavor == "tansu"
