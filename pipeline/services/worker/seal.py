"""What the worker writes for itself, authenticated: its jobs topic and its changelog.

The worker's internal topics carry records it wrote: health, commands, results and
lifecycle events re-keyed to their job's partition, its own timer ticks, and its
per-job snapshots in the table's changelog. Without a check, anyone who can write
those topics (on the embedded broker, anyone who reaches it) wrote the worker's mind:
one tick with ``wall_s`` far ahead made it abandon a job that had just hung. So every
such record is *sealed*: an HMAC-SHA256, keyed with a key derived from the worker's
own private key (every worker of the group holds it; nothing else does), over what
the record is (its kind, and for a snapshot its job) and its bytes::

    b"SGW1" | 32-byte HMAC-SHA256(key, kind 0x00 [job 0x00] payload) | payload

A record that does not open is refused (counted, a dead letter); what opens is still
decoded and bounded like anything read from a topic (:class:`Tick`). On Apache Kafka
the ACLs of ``docs/kafka-acls.md`` also let only the worker's principal write them.

Examples
--------
>>> seal = Seal(b"k" * 32)
>>> sealed = seal.seal("tick", b'{"job_id": "j", "wall_s": 1.0}')
>>> seal.open("tick", sealed)
b'{"job_id": "j", "wall_s": 1.0}'
>>> seal.open("health", sealed) is None, Seal(b"x" * 32).open("tick", sealed) is None
(True, True)
>>> decode_tick(seal.open("tick", sealed), max_wall=10.0)
Tick(job_id='j', wall_s=1.0)
>>> decode_tick(b'{"job_id": "j", "wall_s": 11.0}', max_wall=10.0)
Traceback (most recent call last):
...
pipeline.services.worker.seal.TickError: tick wall_s 11.0 is beyond this worker's clock 10.0

A forwarded health report is sealed as ``health@<partition>``: the partition of the
health topic it came by, the *path* whose watermark judges its node's silence. Each
worker's timer writes the watermarks of the health partitions it reads to every
partition of the jobs topic (a ``paths`` record, after what it forwarded): per
partition, ``null`` when its reader has read to the partition's end (every report of
it is ahead of the mark in the jobs topic), else the event time of the newest report
it forwarded. A job judges a node silent only as far as its path has delivered
(:meth:`detectors.hang.presence.HealthPresence.delivered`), so one lagging partition,
or one whose reader died and was not yet replaced, never makes its nodes "missing".

>>> health_kind(3), health_path("health@3"), health_path("health"), health_path("health@x")
('health@3', 3, None, None)
>>> decode_watermarks(b'{"wall_s": 5.0, "paths": [[0, null], [3, 4.5]]}', max_wall=10.0)
Watermarks(wall_s=5.0, paths=[(0, None), (3, 4.5)])
>>> decode_watermarks(b'{"wall_s": 5.0, "paths": [[70000, null]]}', max_wall=10.0)
Traceback (most recent call last):
...
pipeline.services.worker.seal.TickError: watermarks: Expected `int` <= 65535 - at `$.paths[0][0]`
"""

from __future__ import annotations

import hashlib
import hmac
import math
import os
from typing import Annotated

import msgspec
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

from pipeline.io.errors import StepguardError
from pipeline.io.trust import SigningKey

__all__ = [
    "SEAL_MAGIC",
    "Seal",
    "Tick",
    "TickError",
    "Watermarks",
    "decode_tick",
    "decode_watermarks",
    "derive_key",
    "health_kind",
    "health_path",
]

SEAL_MAGIC = b"SGW1"
_TAG = 32
_LABEL = b"stepguard worker internal records v1\x00"


def derive_key(key: SigningKey) -> bytes:
    """The MAC key of the worker's internal records, derived from its private key
    (one-way: the MAC key does not reveal the signing key)."""
    raw = key.private.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return hashlib.sha256(_LABEL + raw).digest()


class Seal:
    """Seals and opens the worker's internal records with one MAC key.

    Parameters
    ----------
    key
        32 bytes or more (:func:`derive_key`); None: a random key of this process only
        (tests, and a worker alone: what it wrote before a restart does not open).
    """

    def __init__(self, key: bytes | None = None) -> None:
        key = os.urandom(32) if key is None else key
        if len(key) < 32:
            raise ValueError(f"a seal key has at least 32 bytes, got {len(key)}")
        self._key = key

    def _tag(self, kind: str, payload: bytes, job: str) -> bytes:
        mac = hmac.new(self._key, kind.encode() + b"\x00", hashlib.sha256)
        if job:
            mac.update(job.encode() + b"\x00")
        mac.update(payload)
        return mac.digest()

    def seal(self, kind: str, payload: bytes, *, job: str = "") -> bytes:
        """``payload`` as a record only a holder of the key could have written."""
        return SEAL_MAGIC + self._tag(kind, payload, job) + payload

    def open(self, kind: str, value: bytes | None, *, job: str = "") -> bytes | None:
        """The payload of a record sealed for ``kind`` (and ``job``), or None."""
        if value is None or len(value) < len(SEAL_MAGIC) + _TAG:
            return None
        if not value.startswith(SEAL_MAGIC):
            return None
        tag, payload = value[4 : 4 + _TAG], value[4 + _TAG :]
        if not hmac.compare_digest(tag, self._tag(kind, payload, job)):
            return None
        return payload


class TickError(StepguardError):
    """A tick that is not one the worker could have written."""


class Tick(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One timer tick of the worker's jobs topic: check ``job_id``'s clock at wall time
    ``wall_s`` (epoch seconds)."""

    job_id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    wall_s: Annotated[float, msgspec.Meta(ge=0.0, le=1e11)]


_TICK = msgspec.json.Decoder(Tick)


def decode_tick(payload: bytes | None, *, max_wall: float) -> Tick:
    """A bounded tick; :class:`TickError` for anything else, including a ``wall_s``
    beyond ``max_wall`` (this worker's clock plus the skew it allows between workers):
    even a sealed tick never moves a job's clock past the present."""
    try:
        tick = _TICK.decode(payload or b"")
    except msgspec.DecodeError as exc:
        raise TickError(f"tick: {exc}") from exc
    if not math.isfinite(tick.wall_s) or tick.wall_s > max_wall:
        raise TickError(f"tick wall_s {tick.wall_s!r} is beyond this worker's clock {max_wall!r}")
    return tick


#: the most partitions a health topic may have here (a watermark's path is one)
MAX_PATH = 1 << 16


def health_kind(partition: int) -> str:
    """The kind a health report forwarded from ``partition`` of the health topic is
    sealed as (the seal binds its path)."""
    return f"health@{partition}"


def health_path(kind: str) -> int | None:
    """The partition a ``health@<partition>`` kind names; None for any other kind."""
    head, sep, tail = kind.partition("@")
    if head != "health" or not sep or not tail.isdecimal() or len(tail) > 5:
        return None
    path = int(tail)
    return path if path < MAX_PATH else None


class Watermarks(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How far each health partition a worker reads has delivered, written at wall
    time ``wall_s``: ``(partition, None)`` read to its end, ``(partition, ts)`` the
    event time of the newest report forwarded from it."""

    wall_s: Annotated[float, msgspec.Meta(ge=0.0, le=1e11)]
    paths: Annotated[
        list[
            tuple[
                Annotated[int, msgspec.Meta(ge=0, lt=MAX_PATH)],
                Annotated[float, msgspec.Meta(ge=0.0, le=1e11)] | None,
            ]
        ],
        msgspec.Meta(max_length=4096),
    ]


_WATERMARKS = msgspec.json.Decoder(Watermarks)


def decode_watermarks(payload: bytes | None, *, max_wall: float) -> Watermarks:
    """Bounded watermarks; :class:`TickError` for anything else, including a
    ``wall_s`` beyond ``max_wall``."""
    try:
        marks = _WATERMARKS.decode(payload or b"")
    except msgspec.DecodeError as exc:
        raise TickError(f"watermarks: {exc}") from exc
    if not math.isfinite(marks.wall_s) or marks.wall_s > max_wall:
        raise TickError(f"watermarks wall_s {marks.wall_s!r} is beyond this worker's clock")
    return marks
