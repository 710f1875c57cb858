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

import itertools
import json
import multiprocessing
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from detectors.frame import PHASE_CODES as FRAME_PHASES
from detectors.frame import StepFrame, optional_columns, step_times
from pipeline.io.fastdecode import PHASE_CODES, StepColumns, decode_steps, from_models
from schemas import JobEvent, NodeHealth, Rejected, StepTelemetry, decode
from schemas.telemetry import OPTIONAL_FIELDS

__all__ = ["BATCH_LINES", "PARALLEL_BYTES", "Part", "decode_file", "decode_lines", "frame_of"]

assert all(FRAME_PHASES[p] == c for p, c in PHASE_CODES.items()), "phase codes differ"

#: Lines decoded together.
BATCH_LINES = 2048
#: A file at least this large is decoded by another process while this one detects.
PARALLEL_BYTES = 32 << 20
#: Bytes of a file one decode task reads (whole lines).
CHUNK_BYTES = 4 << 20


class Part(NamedTuple):
    """One accepted step message: message ``k`` of ``cols``, its samples
    ``lo .. hi - 1``, and its ``(job, run, step)``. A tuple: a long file makes one a
    node and step, and a frozen dataclass cost a microsecond each to build."""

    cols: StepColumns
    k: int
    lo: int
    hi: int
    key: tuple[str, str, int]


def _kind(obj: dict[str, Any]) -> str:
    """Which message a JSON object is, by its fields."""
    if "samples" in obj or "columns" in obj:  # columns: StepTelemetry version 3
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


def decode_file(
    path: Path, refuse: Any, processes: int = 0
) -> Iterator[tuple[int, Part | NodeHealth | JobEvent]]:
    """:func:`decode_lines` of the file at ``path``; with ``processes`` > 0, its chunks
    (:data:`CHUNK_BYTES` of whole lines) are read and decoded by that many other
    processes (spawned) ahead of the caller, who gets them in file order: a long
    file's decoding overlaps its detection."""
    if processes < 1:
        row = 1
        with path.open("rb") as f:
            while block := f.read(CHUNK_BYTES):
                if not block.endswith(b"\n"):
                    block += f.readline()  # whole lines only
                lines = block.split(b"\n")
                if not lines[-1]:
                    lines.pop()
                yield from _decode_list(lines, refuse, row)
                row += len(lines)
        return
    bounds = _chunks(path)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(processes, mp_context=ctx) as pool:
        ahead: list[Future[tuple[int, list[Any], list[tuple[int, str]]]]] = []
        todo = iter(bounds)
        for lo, hi in itertools.islice(todo, processes + 1):
            ahead.append(pool.submit(_decode_chunk, str(path), lo, hi))
        rows_before = 0
        while ahead:
            n_lines, items, refused = ahead.pop(0).result()
            nxt = next(todo, None)
            if nxt is not None:
                ahead.append(pool.submit(_decode_chunk, str(path), *nxt))
            for row, why in refused:
                refuse(rows_before + row, why)
            for row, item in items:
                yield rows_before + row, item
            rows_before += n_lines


def _decode_list(
    lines: list[bytes], refuse: Any, first_row: int = 1, batch: int = BATCH_LINES
) -> Iterator[tuple[int, Part | NodeHealth | JobEvent]]:
    """:func:`decode_lines` of lines already in memory, ``lines[0]`` being row
    ``first_row``: a batch's lines are stripped in one pass, not one by one."""
    for lo in range(0, len(lines), batch):
        raws = [line.strip() for line in lines[lo : lo + batch]]
        rows: Sequence[int] = range(first_row + lo, first_row + lo + len(raws))
        if b"" in raws:  # blank lines: skipped, the others keep their numbers
            keep = [i for i, raw in enumerate(raws) if raw]
            raws, rows = [raws[i] for i in keep], [rows[i] for i in keep]
        if raws:
            yield from _batch(raws, rows, refuse)


def _chunks(path: Path) -> list[tuple[int, int]]:
    """Byte ranges of ``path`` of about :data:`CHUNK_BYTES`, each ending at a line end."""
    out = []
    with path.open("rb") as f:
        size = f.seek(0, 2)
        start = 0
        while start < size:
            end = min(size, start + CHUNK_BYTES)
            if end < size:
                f.seek(end)
                f.readline()
                end = f.tell()
            out.append((start, end))
            start = end
    return out


def _decode_chunk(path: str, lo: int, hi: int) -> tuple[int, list[Any], list[tuple[int, str]]]:
    """A decode process's task: the lines of bytes ``lo .. hi`` of ``path``, decoded:
    (lines read, items by row within the chunk, refusals by row)."""
    with open(path, "rb") as f:
        f.seek(lo)
        lines = f.read(hi - lo).split(b"\n")
    if lines and not lines[-1]:
        lines.pop()
    refused: list[tuple[int, str]] = []
    items = list(_decode_list(lines, lambda row, why: refused.append((row, why))))
    return len(lines), items, refused


def _batch(
    raws: list[bytes], rows: Sequence[int], refuse: Any
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
    where = cols.messages.tolist() if at is None else [at] * len(ends)
    keys = zip(cols.job_id, cols.run, cols.step.tolist(), strict=True)
    lo = 0
    for k, (hi, i, key) in enumerate(zip(ends, where, keys, strict=True)):
        out[i] = Part(cols, k, lo, hi, key)
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

    nodes: dict[str, int] = {}
    codes: list[int] = []  # node of each run of samples (a message's, in order)
    counts: list[int] = []
    for p in parts:
        names = p.cols.sample_node[p.lo : p.hi]
        if names.count(names[0]) == len(names):  # one node's message (or rack's, of one)
            codes.append(nodes.setdefault(names[0], len(nodes)))
            counts.append(len(names))
        else:  # a rack's message: every sample its own node
            codes += [nodes.setdefault(n, len(nodes)) for n in names]
            counts += [1] * len(names)
    node_idx = np.repeat(np.array(codes, dtype=np.int32), counts)
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
    ts, ts_start = step_times(ends, starts)  # no one node moves the step's clock
    loss_null, grad_null = col("loss_null", bool), col("grad_norm_null", bool)
    return StepFrame(
        job_id=parts[0].cols.job_id[parts[0].k],
        step=int(parts[0].cols.step[parts[0].k]),
        ts=ts,
        ts_start=ts_start,
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
        **optional_columns({w: work(w) for w in OPTIONAL_FIELDS}),
    )
