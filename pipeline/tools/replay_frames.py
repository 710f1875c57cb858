"""Step frames for ``stepguard replay``, built in bulk from decoded columns.

A recorded file holds every node's message of a step, usually next to each other:
the replay does not need the live assembler's per-message bookkeeping (it waits for
nodes that may still be on their way). Lines are decoded a batch at a time by the fast
decoder (:func:`~pipeline.io.fastdecode.decode_steps`, which checks them with the
schema's rules and leaves anything unusual to pydantic); the messages of one
``(run, step)`` become one :class:`~detectors.frame.StepFrame` straight from the column
arrays (:func:`frame_of`), which goes to the core's ``on_frame``, as the assembler's
frames do.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from detectors.frame import PHASE_CODES as FRAME_PHASES
from detectors.frame import StepFrame
from pipeline.io.fastdecode import PHASE_CODES, StepColumns, decode_steps, from_models
from schemas import JobEvent, NodeHealth, Rejected, StepTelemetry, decode

__all__ = ["BATCH_LINES", "Part", "decode_lines", "frame_of"]

assert all(FRAME_PHASES[p] == c for p, c in PHASE_CODES.items()), "phase codes differ"

#: Lines decoded together.
BATCH_LINES = 2048


@dataclass(frozen=True, slots=True)
class Part:
    """One accepted step message: message ``k`` of ``cols``, its samples
    ``lo .. hi - 1``."""

    cols: StepColumns
    k: int
    lo: int
    hi: int

    @property
    def key(self) -> tuple[str, str, int]:
        return self.cols.job_id[self.k], self.cols.run[self.k], int(self.cols.step[self.k])


def _kind(obj: dict[str, Any]) -> str:
    """Which message a JSON object is, by its fields."""
    if "samples" in obj:
        return "step"
    if "gpus" in obj or "interval_s" in obj or "nic_errors" in obj:
        return "health"
    if "kind" in obj and "ts" in obj:
        return "event"
    return "unknown"


def decode_lines(
    lines: Iterable[bytes], refuse: Any, batch: int = BATCH_LINES
) -> Iterator[tuple[int, Part | NodeHealth | JobEvent]]:
    """JSONL lines as ``(row, Part | NodeHealth | JobEvent)`` in file order; a bad line
    goes to ``refuse(row, reason)`` with the schema's error."""
    raws: list[bytes] = []
    rows: list[int] = []
    for row, line in enumerate(lines, start=1):
        raw = line.strip()
        if raw:
            raws.append(raw)
            rows.append(row)
        if len(raws) >= batch:
            yield from _batch(raws, rows, refuse)
            raws, rows = [], []
    if raws:
        yield from _batch(raws, rows, refuse)


def _batch(
    raws: list[bytes], rows: list[int], refuse: Any
) -> Iterator[tuple[int, Part | NodeHealth | JobEvent]]:
    cols = decode_steps(raws)
    out: dict[int, Part | NodeHealth | JobEvent] = {}
    _parts(cols, out)
    for i in cols.slow:
        msg = _slow(raws[i])
        if isinstance(msg, str):
            refuse(rows[i], msg)
        elif isinstance(msg, StepTelemetry):
            one = from_models([msg])
            if one.slow:  # a model beyond int64: cannot be one (the schema bounds it)
                refuse(rows[i], "StepTelemetry: an integer exceeds int64")
            else:
                _parts(one, out, at=i)
        else:
            out[i] = msg
    for i in sorted(out):
        yield rows[i], out[i]


def _parts(cols: StepColumns, out: dict[int, Any], at: int | None = None) -> None:
    ends = np.cumsum(cols.n_samples).tolist()
    lo = 0
    for k, hi in enumerate(ends):
        out[int(cols.messages[k]) if at is None else at] = Part(cols, k, lo, hi)
        lo = hi


def _slow(raw: bytes) -> StepTelemetry | NodeHealth | JobEvent | str:
    """A line the fast decoder left to pydantic: the message, or why it is refused."""
    try:
        obj = json.loads(raw)
    except ValueError as exc:
        return f"not JSON: {exc}"
    kind = _kind(obj) if isinstance(obj, dict) else "unknown"
    if kind == "unknown":
        return "neither StepTelemetry, NodeHealth nor JobEvent"
    model = {"step": StepTelemetry, "health": NodeHealth, "event": JobEvent}[kind]
    msg = decode(model, raw)
    if isinstance(msg, Rejected):
        return f"{model.__name__}: {msg.error}"
    return msg  # type: ignore[return-value]


def frame_of(parts: Sequence[Part]) -> StepFrame:
    """One step's frame from its messages' parts (same job, run and step): ranks in
    order, a rank sent twice kept once (its first message's sample), as
    :meth:`StepFrame.from_messages` does."""
    ranges: list[tuple[StepColumns, int, int]] = []
    for p in parts:  # adjacent messages of one batch: one slice
        if ranges and ranges[-1][0] is p.cols and ranges[-1][2] == p.lo:
            ranges[-1] = (p.cols, ranges[-1][1], p.hi)
        else:
            ranges.append((p.cols, p.lo, p.hi))

    def cat(name: str) -> npt.NDArray[Any]:
        arrays = [getattr(c, name)[lo:hi] for c, lo, hi in ranges]
        return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)

    names: list[str] = [n for c, lo, hi in ranges for n in c.sample_node[lo:hi]]
    nodes: dict[str, int] = {}
    node_idx = np.fromiter(
        (nodes.setdefault(n, len(nodes)) for n in names), dtype=np.int32, count=len(names)
    )
    rank = cat("rank")
    order = np.argsort(rank, kind="stable")
    if order.shape[0] > 1:
        ranked = rank[order]
        first = np.concatenate([[True], ranked[1:] != ranked[:-1]])
        order = order[first]

    def col(name: str, dtype: Any) -> npt.NDArray[Any]:
        return cat(name)[order].astype(dtype, copy=False)

    def work(name: str) -> npt.NDArray[np.float64] | None:
        values = cat(name)[order]
        return None if bool(np.isnan(values).all()) else values

    ends = [p.cols.ts_end[p.k].timestamp() for p in parts]
    starts = [p.cols.ts_start[p.k].timestamp() for p in parts]
    loss_null, grad_null = col("loss_null", bool), col("grad_norm_null", bool)
    return StepFrame(
        job_id=parts[0].cols.job_id[parts[0].k],
        step=int(parts[0].cols.step[parts[0].k]),
        ts=max(ends),
        ts_start=min(starts),
        nodes=tuple(nodes),
        rank=rank[order],
        node_idx=node_idx[order],
        local_rank=col("local_rank", np.int32),
        dp_group=col("dp_group", np.int32),
        pp_stage=col("pp_stage", np.int32),
        tp_group=col("tp_group", np.int32),
        phase=col("phase", np.int8),
        step_time=col("step_time_s", np.float64),
        compute=col("compute_s", np.float64),
        comm_wait=col("comm_wait_s", np.float64),
        data_wait=col("data_wait_s", np.float64),
        loss=np.where(loss_null, np.nan, col("loss", np.float64)),
        grad_norm=np.where(grad_null, np.nan, col("grad_norm", np.float64)),
        has_loss=~loss_null,
        has_grad_norm=~grad_null,
        tokens=work("tokens"),
        flops=work("flops"),
        max_seq_len=work("max_seq_len"),
    )
