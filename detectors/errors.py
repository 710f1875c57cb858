"""Errors the detection core raises.

The core does no I/O, so its only error is a record that would take it beyond a bound:
:class:`CapacityError`. The services floor re-exports it in its exception tree
(``pipeline.io.errors``) and dead-letters the record.
"""

from __future__ import annotations

__all__ = ["CapacityError"]


class CapacityError(ValueError):
    """A record would take the core beyond one of its configured bounds (jobs per
    worker, ranks per job): the record is refused, the caller goes on."""
