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

__all__ = ["SEAL_MAGIC", "Seal", "Tick", "TickError", "decode_tick", "derive_key"]

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
