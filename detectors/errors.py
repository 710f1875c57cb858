"""Errors the detection core raises.

The core does no I/O, so its only error is a record that would take it beyond a bound:
:class:`CapacityError`. The services floor re-exports it in its exception tree
(``pipeline.io.errors``) and dead-letters the record.
"""

from __future__ import annotations

__all__ = ["CapacityError", "RefusedRecord"]


class CapacityError(ValueError):
    """A record would take the core beyond one of its configured bounds (jobs per
    worker, ranks per job): the record is refused, the caller goes on."""


class RefusedRecord(CapacityError):
    """A record that speaks for what its node does not own (another live node's ranks,
    a rank far beyond the job's): refused and dead-lettered like a capacity refusal,
    and noted on the job as an alert naming the node
    (:meth:`~detectors.job.JobDetection.on_step`)."""
