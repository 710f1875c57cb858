"""Encode messages to plain JSON bytes and decode bytes without ever raising.

Decoding returns either the model or a :class:`Rejected` whose ``letter`` is a
DeadLetter holding the raw bytes, the error and the source coordinates, ready for the
dead-letter topic. (A wrapper, not a bare DeadLetter: the dead-letter topic's own
messages are DeadLetters, and a good one must not look like a failure.)

Examples
--------
>>> from schemas.truth import FaultTruth
>>> out = decode(FaultTruth, b"{not json", topic="t", partition=0, offset=7)
>>> type(out).__name__, out.letter.offset, out.letter.source_topic
('Rejected', 7, 't')
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from pydantic import ValidationError

from schemas._base import Message
from schemas.deadletter import DeadLetter

__all__ = ["MAX_MESSAGE_BYTES", "Rejected", "decode", "encode", "key_of"]

#: Larger payloads are refused before parsing (a defence against oversized input).
MAX_MESSAGE_BYTES = 4 * 1024 * 1024
M = TypeVar("M", bound=Message)


@dataclass(frozen=True, slots=True)
class Rejected:
    """Input that could not be decoded; ``letter`` goes to the dead-letter topic."""

    letter: DeadLetter

    @property
    def error(self) -> str:
        return self.letter.error


def encode(message: Message) -> bytes:
    """Plain JSON, exactly the model's fields, no framework metadata."""
    return message.model_dump_json().encode()


def key_of(message: Message, field: str) -> bytes:
    """The partitioning key of a message (the value of ``field``), UTF-8."""
    value = getattr(message, field)
    return str(value).encode()


def decode(
    model: type[M],
    raw: bytes | None,
    *,
    topic: str = "",
    partition: int = -1,
    offset: int = -1,
    key: bytes | None = None,
    max_bytes: int = MAX_MESSAGE_BYTES,
) -> M | Rejected:
    """Parse ``raw`` as ``model``; on any failure return :class:`Rejected` instead."""
    data = raw if raw is not None else b""
    if len(data) > max_bytes:
        error = f"message of {len(data)} bytes exceeds the limit of {max_bytes}"
        return _dead(data[:max_bytes], error, topic, partition, offset, key)
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        error = f"{model.__name__}: " + "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}"
            for e in exc.errors(include_url=False)[:10]
        )
        return _dead(data, error, topic, partition, offset, key)
    except (ValueError, TypeError, RecursionError) as exc:  # pragma: no cover - defensive
        return _dead(data, f"{model.__name__}: {exc}", topic, partition, offset, key)


def _dead(
    raw: bytes, error: str, topic: str, partition: int, offset: int, key: bytes | None
) -> Rejected:
    letter = DeadLetter(
        source_topic=topic,
        partition=partition,
        offset=offset,
        key=key,
        raw=raw,
        error=error[:2000],
        ts=datetime.now(UTC),
    )
    return Rejected(letter)
