"""Messages that could not be decoded or stored, kept with their source coordinates.

A dead letter is bounded whatever it holds: raw bytes beyond :data:`MAX_DEAD_RAW_BYTES`
are cut, and the letter keeps their original length and SHA-256, so that a record just
under the broker's ``max.message.bytes`` (base64 makes it a third larger) can never
make a dead letter the broker refuses (the produce failed before the commit, and the
consumer met the same record again after every restart).

Examples
--------
>>> from datetime import UTC, datetime
>>> big = DeadLetter(source_topic="t", partition=0, offset=1, raw=b"x" * 100_000,
...                  error="bad", ts=datetime(2026, 1, 1, tzinfo=UTC))
>>> len(big.raw), big.raw_len, big.truncated, big.raw_sha256[:12]
(16384, 100000, True, 'd69e68988157')
>>> DeadLetter.model_validate_json(big.model_dump_json()) == big
True
"""

from __future__ import annotations

import hashlib
from typing import Literal

from pydantic import AwareDatetime, Field, NonNegativeInt, model_validator

from schemas._base import Message

__all__ = ["MAX_DEAD_ERROR_CHARS", "MAX_DEAD_KEY_BYTES", "MAX_DEAD_RAW_BYTES", "DeadLetter"]

#: Raw bytes a dead letter keeps (the rest is cut; its length and hash are kept).
MAX_DEAD_RAW_BYTES = 16 * 1024
#: Key bytes a dead letter keeps.
MAX_DEAD_KEY_BYTES = 1024
#: Characters of the error a dead letter keeps.
MAX_DEAD_ERROR_CHARS = 2000


class DeadLetter(Message):
    """Raw bytes plus why they failed and where they came from (topic key: source topic)."""

    kind_name = "dead_letter"
    schema_version: Literal[1] = 1
    source_topic: str = Field(max_length=512)
    partition: int = Field(ge=-1, le=(1 << 31) - 1, description="-1 when unknown.")
    offset: int = Field(ge=-1, le=(1 << 63) - 1, description="-1 when unknown.")
    key: bytes | None = Field(
        default=None, description=f"Raw key, base64 in JSON (its first {MAX_DEAD_KEY_BYTES} bytes)."
    )
    raw: bytes = Field(
        description=f"Raw value, base64 in JSON: its first {MAX_DEAD_RAW_BYTES} bytes."
    )
    raw_len: NonNegativeInt | None = Field(
        default=None, description="Length of the raw value before it was cut."
    )
    raw_sha256: str = Field(
        default="", max_length=64, description="SHA-256 (hex) of the whole raw value."
    )
    truncated: bool = Field(default=False, description="The raw value (or key) was cut.")
    error: str = Field(description=f"Why it failed (its first {MAX_DEAD_ERROR_CHARS} characters).")
    stage: str = Field(
        default="decode", max_length=64, description="decode, validate, detect, archive ..."
    )
    ts: AwareDatetime

    @model_validator(mode="after")
    def _bound(self) -> DeadLetter:
        if self.raw_len is None or len(self.raw) > MAX_DEAD_RAW_BYTES:
            object.__setattr__(self, "raw_len", len(self.raw))
            object.__setattr__(self, "raw_sha256", hashlib.sha256(self.raw).hexdigest())
        if len(self.raw) > MAX_DEAD_RAW_BYTES:
            object.__setattr__(self, "raw", self.raw[:MAX_DEAD_RAW_BYTES])
            object.__setattr__(self, "truncated", True)
        if self.key is not None and len(self.key) > MAX_DEAD_KEY_BYTES:
            object.__setattr__(self, "key", self.key[:MAX_DEAD_KEY_BYTES])
            object.__setattr__(self, "truncated", True)
        if len(self.error) > MAX_DEAD_ERROR_CHARS:
            object.__setattr__(self, "error", self.error[:MAX_DEAD_ERROR_CHARS])
        return self
