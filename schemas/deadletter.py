"""Messages that could not be decoded or stored, kept with their source coordinates."""

from __future__ import annotations

from typing import Literal

from pydantic import AwareDatetime, Field

from schemas._base import Message

__all__ = ["DeadLetter"]


class DeadLetter(Message):
    """Raw bytes plus why they failed and where they came from (topic key: source topic)."""

    kind_name = "dead_letter"
    schema_version: Literal[1] = 1
    source_topic: str
    partition: int = Field(ge=-1, description="-1 when unknown.")
    offset: int = Field(ge=-1, description="-1 when unknown.")
    key: bytes | None = Field(default=None, description="Raw key, base64 in JSON.")
    raw: bytes = Field(description="Raw value, base64 in JSON.")
    error: str
    stage: str = Field(default="decode", description="decode, validate, detect, archive ...")
    ts: AwareDatetime
