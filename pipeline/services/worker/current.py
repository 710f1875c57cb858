"""The record a batch handler is on, as Faust's tables and attachments see it.

The worker takes its records in batches (``Stream.noack_take``), so Faust has no
"current event" while a batch is handled; its table writes take the changelog
partition from one (:func:`faust.streams.current_event`), and so do sends attached
to a source record. :func:`make_current` names the record being handled there.

It must set only the context variable. ``Stream._set_current_event`` also writes
``stream.current_event``, and that attribute is where ``noack_take``'s background
buffer reads the record it has just been handed, *after* waiting for the batch
being handled to finish: overwritten by the batch's last record, the next batch
then began with a copy of the last record of the one before, and the record it had
been handed was never seen (measured: a refused job's 640 step records gave 7
records handled twice and 8 never, each a pair at a batch boundary, offsets X and
X+1). The context variable is the handling task's own (the buffer is filled in
another task, which copied its context when it started), so setting it cannot reach
the buffer.
"""

from __future__ import annotations

import weakref
from typing import Any

from faust import streams

__all__ = ["make_current"]

_CURRENT = streams._current_event  # faust-streaming 0.15: the one Faust itself reads


def make_current(event: Any) -> None:
    """Make ``event`` the current event of this task (tables, attachments)."""
    _CURRENT.set(weakref.ref(event))
