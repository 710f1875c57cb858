"""The mark an ended job leaves in the worker's table, in place of a tombstone.

When a job ends (or is abandoned) the worker drops its state. A plain tombstone
forgot the end with it: the worker that took the partition over after a crash read
the job's steps again from the partition's committed offset, which other jobs' held
records can keep behind the end, while the end itself, on the jobs topic, had been
committed. The replayed steps made the job anew, with no end to come, and its
silence became a hang of a finished job (the chaos soak: a job ended 3 s before its
worker was killed). So the job's table entry becomes an :class:`EndMark`: the end's
event time (records up to it belong to the ended run), the steps partition it lives
on, and the worker's wall clock when it was written. Whoever owns the partition next
reads it back (:meth:`~pipeline.services.worker.takeover.Takeover.state`, the
tick loop's adopt) and ignores the ended run's records; a record newer than the end
(a new run under the same id) starts afresh. The mark is deleted once it is older
than the worker's job idle time (``STEPGUARD_JOB_IDLE_TTL_S``: by then no replay
reaches back to the ended run), or sooner when more marks than the ended jobs a worker
remembers (``max_ended``) pile up, oldest first: the tick loop sends a sealed
``expire`` record for it to its partition of the jobs topic, and handling that record
writes the tombstone (Faust writes a table's changelog only while a record is handled).

A mark is what the worker writes for itself: sealed like a snapshot, under its own
kind (a snapshot never opens as a mark, nor a mark as a snapshot), bounded when read.

Examples
--------
>>> from pipeline.services.worker.seal import Seal
>>> seal = Seal(b"k" * 32)
>>> blob = write_mark(EndMark("j", end_ts=100.0, partition=3, wall_s=200.0), seal)
>>> read_mark("j", blob, seal)
EndMark(job_id='j', end_ts=100.0, partition=3, wall_s=200.0)
>>> read_mark("other", blob, seal) is None, read_mark("j", blob, Seal(b"x" * 32)) is None
(True, True)
>>> read_mark("j", b"SGST...a snapshot", None) is None
True
"""

from __future__ import annotations

from typing import Annotated

import msgspec

from pipeline.services.worker.seal import Seal

__all__ = ["END_MAGIC", "EndMark", "read_mark", "write_mark"]

END_MAGIC = b"SGEN"
_MAX_BYTES = 1024
_KIND = "ended"


class EndMark(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A job's end, kept in the table under the job's id."""

    job_id: Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
    #: event time of the end: the job's records up to it are the ended run's
    end_ts: Annotated[float, msgspec.Meta(ge=0.0, le=1e11)]
    #: the job's partition of the steps (and jobs) topic: whoever owns it expires it
    partition: Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
    #: wall clock of the worker that wrote it (epoch seconds)
    wall_s: Annotated[float, msgspec.Meta(ge=0.0, le=1e11)]


_DECODER = msgspec.json.Decoder(EndMark)
_ENCODER = msgspec.json.Encoder()


def write_mark(mark: EndMark, seal: Seal | None) -> bytes:
    """The table value of ``mark`` (sealed when the worker seals its records)."""
    body = END_MAGIC + _ENCODER.encode(mark)
    return seal.seal(_KIND, body, job=mark.job_id) if seal is not None else body


def read_mark(job_id: str, blob: bytes | None, seal: Seal | None) -> EndMark | None:
    """The end mark stored under ``job_id``, or None when ``blob`` is anything else (a
    snapshot, a record no worker of the group sealed, or a mark of another job)."""
    if blob is None or len(blob) > _MAX_BYTES + 64:
        return None
    if seal is not None:
        blob = seal.open(_KIND, blob, job=job_id)
        if blob is None:
            return None
    if not blob.startswith(END_MAGIC):
        return None
    try:
        mark = _DECODER.decode(blob[len(END_MAGIC) :])
    except msgspec.DecodeError:
        return None
    return mark if mark.job_id == job_id else None
