"""Group per-rank step records into one StepTelemetry per node and step."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Literal, NamedTuple

from pydantic import ValidationError

from schemas import RankSample, StepTelemetry

__all__ = ["WIRE_FIELDS", "RankRecord", "StepBatcher"]

log = logging.getLogger(__name__)


class RankRecord(NamedTuple):
    """One rank's step as the hook records it (cheap to build: no validation)."""

    job_id: str
    node: str
    step: int
    rank: int
    local_rank: int
    phase: str
    dp_group: int
    pp_stage: int
    tp_group: int
    step_time_s: float
    compute_s: float
    comm_wait_s: float
    data_wait_s: float
    loss: float | None
    grad_norm: float | None
    ts_start: float
    ts_end: float
    arrived: float  #: monotonic time the record was taken (for max_wait_s)
    run: str = ""  #: the exporter's run or attempt id (StepTelemetry.run)
    tokens: int | None = None  #: the work the step did, when the rank said it
    flops: float | None = None
    max_seq_len: int | None = None


#: A record's fields before ``arrived``: what a rank sends the node aggregator, then
#: its ``run``, then (only when the rank said any) a JSON object of its work fields.
WIRE_FIELDS = RankRecord._fields.index("arrived")
#: The work fields a record may carry, by name (the wire's trailing object).
WORK_FIELDS: tuple[str, ...] = ("tokens", "flops", "max_seq_len")


class StepBatcher:
    """Collect records per (job, node, step); release a message when the node's
    ``ranks_per_node`` ranks are all in or ``max_wait_s`` passed (a dead rank must not
    hold its node back). Without ``ranks_per_node``, a record ``lag_steps`` steps later
    also releases a step. A message is StepTelemetry version 1 (rows: a node's eight
    ranks decode faster so today), version 3 (columns) with ``columnar``.

    >>> b = StepBatcher(ranks_per_node=2)
    >>> r = RankRecord("j", "n0", 3, 0, 0, "train", 0, 0, 0, 1.0, 0.8, 0.1, 0.1,
    ...                None, None, 10.0, 11.0, 0.0)
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
                samples.append(
                    RankSample(
                        rank=r.rank,
                        local_rank=r.local_rank,
                        dp_group=r.dp_group,
                        pp_stage=r.pp_stage,
                        tp_group=r.tp_group,
                        phase=r.phase,
                        step_time_s=r.step_time_s,
                        compute_s=r.compute_s,
                        comm_wait_s=r.comm_wait_s,
                        data_wait_s=r.data_wait_s,
                        loss=r.loss,
                        grad_norm=r.grad_norm,
                        tokens=r.tokens,
                        flops=r.flops,
                        max_seq_len=r.max_seq_len,
                    )
                )
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
