"""Group per-rank step records into one StepTelemetry per node and step."""

from __future__ import annotations

import logging
from collections import namedtuple
from datetime import UTC, datetime
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Literal

from pydantic import ValidationError

from schemas import RankSample, StepTelemetry
from schemas.telemetry import FIELDS, SAMPLE_FIELDS

__all__ = ["NAMED_FIELDS", "WIRE_FIELDS", "RankRecord", "StepBatcher"]

log = logging.getLogger(__name__)

#: The fields a rank sends the node aggregator by position, in this order (the wire of
#: ``stepguard export-node`` since it began: never reordered, never grown). Every other
#: sample field travels by name (:data:`NAMED_FIELDS`).
_WIRE_HEAD = (
    "job_id", "node", "step", "rank", "local_rank", "phase", "dp_group", "pp_stage",
    "tp_group", "step_time_s", "compute_s", "comm_wait_s", "data_wait_s", "loss",
    "grad_norm", "ts_start", "ts_end",
)  # fmt: skip
#: A record's sample fields: RankSample's (:data:`~schemas.telemetry.SAMPLE_FIELDS`)
#: but ``node``, which a record names for its whole message.
_SAMPLE = tuple(f for f in SAMPLE_FIELDS if FIELDS[f].kind != "node")
#: The sample fields a record carries by name: on the wire, a JSON object after the
#: run, holding those a rank said (the work: tokens, flops, max_seq_len, and any field
#: added to the schema since).
NAMED_FIELDS: tuple[str, ...] = tuple(f for f in _SAMPLE if f not in _WIRE_HEAD)
_DEFAULTS = ("", *(FIELDS[f].default for f in NAMED_FIELDS))  # run's, then the schema's

if TYPE_CHECKING:
    RankRecord = Any
else:
    #: One rank's step as the hook records it (cheap to build: no validation): the wire's
    #: fields, ``arrived`` (monotonic time the record was taken, for max_wait_s), ``run``
    #: (the exporter's run or attempt id, StepTelemetry.run), then the named fields.
    RankRecord = namedtuple(
        "RankRecord", [*_WIRE_HEAD, "arrived", "run", *NAMED_FIELDS], defaults=_DEFAULTS
    )
    RankRecord.__doc__ = "One rank's step as the hook records it (cheap to build: no validation)."
    RankRecord.__module__ = __name__
assert set(_WIRE_HEAD) - {"job_id", "node", "step", "ts_start", "ts_end"} <= set(_SAMPLE)

#: A record's fields before ``arrived``: what a rank sends the node aggregator, then
#: its ``run``, then (only when the rank said any) a JSON object of its named fields.
WIRE_FIELDS = len(_WIRE_HEAD)
_SAMPLE_OF = attrgetter(*_SAMPLE)


class StepBatcher:
    """Collect records per (job, node, step); release a message when the node's
    ``ranks_per_node`` ranks are all in or ``max_wait_s`` passed (a dead rank must not
    hold its node back). Without ``ranks_per_node``, a record ``lag_steps`` steps later
    also releases a step. A message is StepTelemetry version 1 (rows: a node's eight
    ranks decode faster so today), version 3 (columns) with ``columnar``.

    >>> b = StepBatcher(ranks_per_node=2)
    >>> r = RankRecord(job_id="j", node="n0", step=3, rank=0, local_rank=0, phase="train",
    ...                dp_group=0, pp_stage=0, tp_group=0, step_time_s=1.0, compute_s=0.8,
    ...                comm_wait_s=0.1, data_wait_s=0.1, loss=None, grad_norm=None,
    ...                ts_start=10.0, ts_end=11.0, arrived=0.0)
    >>> b.add(r), [m.schema_version for m in b.add(r._replace(rank=1, local_rank=1))]
    ([], [1])
    """

    def __init__(
        self,
        ranks_per_node: int | None = None,
        lag_steps: int = 2,
        max_wait_s: float = 2.0,
        *,
        columnar: bool = False,
    ) -> None:
        if ranks_per_node is not None and ranks_per_node < 1:
            raise ValueError("ranks_per_node must be >= 1")
        if lag_steps < 1:
            raise ValueError("lag_steps must be >= 1")
        if max_wait_s <= 0:
            raise ValueError("max_wait_s must be positive")
        self.ranks_per_node = ranks_per_node
        self.lag_steps = lag_steps
        self.max_wait_s = max_wait_s
        self.schema_version: Literal[1, 3] = 3 if columnar else 1
        self._open: dict[tuple[str, str, int], dict[int, RankRecord]] = {}
        self._newest: dict[tuple[str, str], int] = {}
        self.invalid = 0

    def add(self, rec: RankRecord) -> list[StepTelemetry]:
        key = (rec.job_id, rec.node, rec.step)
        ranks = self._open.setdefault(key, {})
        ranks[rec.rank] = rec
        out: list[StepTelemetry] = []
        if self.ranks_per_node is not None and len(ranks) >= self.ranks_per_node:
            out += self._release(key)
        if self.ranks_per_node is not None:
            return out  # complete sets go at once; a missing rank waits max_wait_s
        node = (rec.job_id, rec.node)
        newest = max(self._newest.get(node, -1), rec.step)
        self._newest[node] = newest
        old = [k for k in self._open if k[:2] == node and k[2] <= newest - self.lag_steps]
        for k in sorted(old):
            out += self._release(k)
        return out

    def expire(self, now: float) -> list[StepTelemetry]:
        """Release steps whose first record is older than ``max_wait_s``."""
        out: list[StepTelemetry] = []
        for key in sorted(self._open):
            first = min(r.arrived for r in self._open[key].values())
            if now - first >= self.max_wait_s:
                out += self._release(key)
        return out

    def flush(self) -> list[StepTelemetry]:
        out: list[StepTelemetry] = []
        for key in sorted(self._open):
            out += self._release(key)
        return out

    def __len__(self) -> int:
        return len(self._open)

    def _release(self, key: tuple[str, str, int]) -> list[StepTelemetry]:
        records = self._open.pop(key, {})
        samples = []
        for r in records.values():
            try:
                samples.append(RankSample(**dict(zip(_SAMPLE, _SAMPLE_OF(r), strict=True))))
            except ValidationError as exc:
                self.invalid += 1
                log.warning(
                    "exporter: invalid record of rank %d step %d: %s",
                    r.rank,
                    r.step,
                    exc.errors(include_url=False)[0]["msg"],
                )
        if not samples:
            return []
        samples.sort(key=lambda s: s.rank)
        ts_start = min(r.ts_start for r in records.values())
        ts_end = max(r.ts_end for r in records.values())
        try:
            return [
                StepTelemetry(
                    schema_version=self.schema_version,
                    job_id=key[0],
                    node=key[1],
                    step=key[2],
                    ts_start=datetime.fromtimestamp(ts_start, UTC),
                    ts_end=datetime.fromtimestamp(max(ts_end, ts_start), UTC),
                    samples=tuple(samples),
                    run=next(iter(records.values())).run,
                )
            ]
        except ValidationError as exc:
            self.invalid += len(samples)
            log.warning("exporter: invalid step %s: %s", key, exc)
            return []
