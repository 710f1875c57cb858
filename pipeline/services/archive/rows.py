"""Turn messages into columnar rows for the archive tables (one mapping per model).

Every row's partition time comes from the message itself (or the broker's record
time for messages without one), so a replay lands in the same partition and the
ReplacingMergeTree collapses it.

The replacing version ``ver`` is the record's ingest position, never a time the writer
chose: :func:`ingest_version` of its offset in its partition, so the *first* record
stored under a key wins. A replay re-inserts the same offsets, hence the same
versions, and collapses to the same rows; a later record that repeats a key (a forged
"correction", or a relaunched run that did not change its ``run``) cannot rewrite what
is archived. Rows archived before migration 005 carry :data:`ARCHIVED_VERSION`, above
every ingest version.

Of the kinds that are signed (alerts, commands, action records, approvals, control
changes, command results), a row whose signature did not verify
(:mod:`pipeline.services.archive.trust`) takes its version from a lower band
(:func:`unverified_version`): a verified row always replaces it, whatever came first,
so a forgery stored first under a real message's key cannot make the real one vanish
from ``FINAL`` reads.
"""

from __future__ import annotations

import base64
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeline.io import statecodec
from pipeline.io.errors import ArchiveRowError
from pipeline.io.fastdecode import StepColumns, decode_steps, from_models
from pipeline.services.archive.backend import Columns
from schemas import (
    Acknowledgement,
    ActionRecord,
    Alert,
    Approval,
    Command,
    CommandResult,
    ControlMessage,
    DeadLetter,
    FaultTruth,
    JobEvent,
    Message,
    NodeHealth,
    StepTelemetry,
)
from schemas.telemetry import FIELDS, INT_FIELDS

__all__ = ["ARCHIVED_VERSION", "SIGNED_KINDS", "TABLE_OF", "StepRows", "ingest_version",
           "pack_values", "result_at_ms", "rows_for", "step_rows", "step_rows_file",
           "step_rows_of", "step_rows_packed", "step_table", "unverified_version"]  # fmt: skip

Row = dict[str, Any]

#: ``ver`` of the rows migration 005 carried over: older than anything ingested since.
ARCHIVED_VERSION = 2**63
_VERSION_TOP = 2**63 - 1


def ingest_version(offset: Any) -> Any:
    """The replacing version of a record at ``offset`` in its partition (an int, or a
    numpy array of them): larger for earlier records, so the first one stored under a
    key wins and a replay of the same record ties with itself.

    >>> ingest_version(0) > ingest_version(1) > 0
    True
    >>> ingest_version(np.array([0, 5])).dtype
    dtype('uint64')
    """
    if isinstance(offset, np.ndarray):
        return (_VERSION_TOP - offset.astype(np.int64)).astype(np.uint64)
    if not 0 <= offset <= _VERSION_TOP:
        raise ValueError(f"offset {offset} is outside 0 .. 2**63 - 1")
    return _VERSION_TOP - offset


#: The signed kinds: an unverified row of these is versioned below every verified one.
SIGNED_KINDS: frozenset[type[Message]] = frozenset(
    {Alert, Command, CommandResult, Approval, ControlMessage, ActionRecord, Acknowledgement}
)
_UNVERIFIED_BAND = 2**62


def unverified_version(offset: int) -> int:
    """The replacing version of an unverified signed-kind row at ``offset``: first one
    wins among them too, but every verified row (:func:`ingest_version`) is above it.

    >>> ingest_version(10**9) > unverified_version(0) > unverified_version(1) >= 0
    True
    """
    return max(0, ingest_version(offset) - _UNVERIFIED_BAND)


def _ms(ts: datetime) -> int:
    return int(ts.timestamp() * 1000)


def _utc(ts: datetime) -> datetime:
    return ts.astimezone(UTC)


def _steps(m: StepTelemetry, _rec_ms: int) -> Iterable[Row]:
    cols = _model_step_columns([m], [0])
    del cols["ver"]
    for i in range(len(m.samples)):
        yield {c: _plain(v[i]) for c, v in cols.items()}


def _plain(value: Any) -> Any:
    if value is np.ma.masked:
        return None
    return value.item() if isinstance(value, np.generic) else value


def _health(m: NodeHealth, _rec_ms: int) -> Iterable[Row]:
    ms = _ms(m.ts)
    for g in m.gpus:
        yield {
            "job_id": m.job_id or "", "node": m.node, "gpu": g.index,
            "temperature_c": g.temperature_c, "power_w": g.power_w,
            "sm_clock_mhz": g.sm_clock_mhz, "utilization_pct": g.utilization_pct,
            "ecc_corrected": g.ecc_corrected, "ecc_uncorrected": g.ecc_uncorrected,
            "xid_codes": list(g.xid_codes), "throttle_reasons": list(g.throttle_reasons),
            "nvlink_errors": g.nvlink_errors, "nic_errors": m.nic_errors,
            "nic_retransmits": m.nic_retransmits, "interval_s": m.interval_s,
            "ts": _utc(m.ts), "ts_ms": ms,
            # NodeHealth v2 (migration 006)
            "nvlink_crc_errors": g.nvlink_crc_errors,
            "nvlink_replay_errors": g.nvlink_replay_errors,
            "nvlink_links_down": g.nvlink_links_down, "pcie_gen": g.pcie_gen,
            "pcie_gen_max": g.pcie_gen_max, "pcie_width": g.pcie_width,
            "pcie_width_max": g.pcie_width_max, "remap_pending": int(g.remap_pending),
            "remap_failed": int(g.remap_failed),
        }  # fmt: skip


def _alert(m: Alert, _rec_ms: int) -> Iterable[Row]:
    ms, e = _ms(m.ts), m.evidence
    yield {
        "fingerprint": m.fingerprint, "seq": m.seq, "kind": m.kind.value,
        "grade": m.grade.value, "state": m.state.value, "job_id": m.job_id,
        "node": m.node or "", "rank": -1 if m.rank is None else m.rank,
        "step": -1 if m.step is None else m.step, "metric": e.metric, "value": e.value,
        "peer_median": e.peer_median, "baseline": e.baseline, "deviation": e.deviation,
        "trend": e.trend, "detail": e.detail, "recommended_action": m.recommended_action.value,
        "summary": m.summary, "started_at": _utc(m.started_at), "ts": _utc(m.ts),
        "ts_ms": ms, "incident": m.incident, "signed": int(m.signature is not None),
    }  # fmt: skip


def _command(m: Command, _rec_ms: int) -> Iterable[Row]:
    ms = _ms(m.issued_at)
    yield {
        "command_id": m.command_id, "kind": m.kind.value, "job_id": m.job_id,
        "targets": list(m.targets), "replacements": list(m.replacements),
        "checkpoint_step": -1 if m.checkpoint_step is None else m.checkpoint_step,
        "reason": list(m.reason), "mode": m.mode.value, "summary": m.summary,
        "signed": int(m.signature is not None), "ts": _utc(m.issued_at), "ts_ms": ms,
    }  # fmt: skip


def _result(m: CommandResult, _rec_ms: int) -> Iterable[Row]:
    ms = _ms(m.ts)
    # at_ms (migration 011) is set by rows_for from the archiver's receive time
    yield {
        "command_id": m.command_id, "job_id": m.job_id, "executor": m.executor,
        "status": m.status.value, "detail": m.detail, "ts": _utc(m.ts), "ts_ms": ms,
        "signed": int(m.signature is not None), "at_ms": ms,
    }  # fmt: skip


def _approval(m: Approval, _rec_ms: int) -> Iterable[Row]:
    ms = _ms(m.ts)
    # the column kept the name Approval had before version 2: no rename on ClickHouse 18.16
    yield {
        "command_id": m.action_id, "decision": m.decision.value, "by": m.by,
        "reason": m.reason, "signed": int(m.signature is not None), "ts": _utc(m.ts),
        "ts_ms": ms,
    }  # fmt: skip


def _dead(m: DeadLetter, _rec_ms: int) -> Iterable[Row]:
    ms = _ms(m.ts)
    yield {
        "source_topic": m.source_topic, "partition": m.partition, "offset": m.offset,
        "stage": m.stage, "error": m.error, "raw": base64.b64encode(m.raw).decode(),
        "ts": _utc(m.ts), "ts_ms": ms,
    }  # fmt: skip


def _truth(m: FaultTruth, rec_ms: int) -> Iterable[Row]:
    yield {
        "scenario": m.scenario, "job_id": m.job_id, "fault_id": m.fault_id,
        "kind": m.kind.value, "is_trap": int(m.is_trap), "node": m.node or "",
        "rank": -1 if m.rank is None else m.rank, "onset_step": m.onset_step,
        "end_step": -1 if m.end_step is None else m.end_step, "magnitude": m.magnitude,
        "detail": m.detail, "ts": datetime.fromtimestamp(rec_ms / 1000, UTC),
        "ts_ms": rec_ms,
    }  # fmt: skip


def _control(m: ControlMessage, _rec_ms: int) -> Iterable[Row]:
    ms = _ms(m.ts)
    yield {
        "change_id": m.change_id, "scope": m.scope,
        "mode": m.mode.value if m.mode is not None else "",
        "change": m.model_dump_json(exclude={"key_id", "signature"}), "by": m.by,
        "reason": m.reason, "signed": int(m.signature is not None), "ts": _utc(m.ts),
        "ts_ms": ms,
    }  # fmt: skip


def _action(m: ActionRecord, _rec_ms: int) -> Iterable[Row]:
    ms = _ms(m.ts)
    yield {
        "action_id": m.action_id, "state": m.state.value, "job_id": m.job_id,
        "mode": m.mode.value, "kinds": [c.kind.value for c in m.commands],
        "targets": sorted({t for c in m.commands for t in c.targets}),
        "reason": list(m.reason), "summary": m.summary, "detail": m.detail,
        "by": m.by or "", "signed": int(m.signature is not None), "ts": _utc(m.ts),
        "ts_ms": ms,
    }  # fmt: skip


def _ack(m: Acknowledgement, _rec_ms: int) -> Iterable[Row]:
    ms = _ms(m.ts)
    yield {
        "subject": m.subject, "request": m.request, "source_topic": m.source_topic,
        "source_partition": m.partition, "source_offset": m.offset,
        "outcome": m.outcome.value, "state": m.state.value if m.state is not None else "",
        "detail": m.detail, "by": m.by, "commands": list(m.commands), "mode": m.mode.value,
        "signed": int(m.signature is not None), "ts": _utc(m.ts), "ts_ms": ms,
    }  # fmt: skip


def _job_event(m: JobEvent, _rec_ms: int) -> Iterable[Row]:
    ms = _ms(m.ts)
    yield {
        "event_id": m.event_id, "job_id": m.job_id, "kind": m.kind.value,
        "step": -1 if m.step is None else m.step,
        "phase": m.phase.value if m.phase is not None else "",
        "expected_s": m.expected_s or 0.0,
        "reason": m.reason.value if m.reason is not None else "", "run": m.run,
        "source": m.source, "detail": m.detail, "ts": _utc(m.ts), "ts_ms": ms,
    }  # fmt: skip


#: Model -> (table, row mapper taking the message and the broker record time in ms).
TABLE_OF: dict[type[Message], tuple[str, Callable[[Any, int], Iterable[Row]]]] = {
    StepTelemetry: ("steps", _steps),
    NodeHealth: ("health", _health),
    Alert: ("alerts", _alert),
    Command: ("commands", _command),
    CommandResult: ("command_results", _result),
    Approval: ("approvals", _approval),
    DeadLetter: ("dead_letters", _dead),
    FaultTruth: ("fault_truth", _truth),
    ControlMessage: ("control_changes", _control),
    ActionRecord: ("actions", _action),
    JobEvent: ("job_events", _job_event),
    Acknowledgement: ("acks", _ack),
}


# Value ranges of the steps table's integer columns (schemas/sql/001_*.sql); the
# schema itself only says "non-negative", and numpy would wrap a value silently.
_UINT_MAX = {"rank": 2**32 - 1, "local_rank": 2**16 - 1, "dp_group": 2**32 - 1,
             "pp_stage": 2**32 - 1, "tp_group": 2**32 - 1}  # fmt: skip
_UINT_TYPE = {"rank": np.uint32, "local_rank": np.uint16, "dp_group": np.uint32,
              "pp_stage": np.uint32, "tp_group": np.uint32}  # fmt: skip
assert set(_UINT_TYPE) == set(_UINT_MAX) == set(INT_FIELDS), "an integer field's column type"
_DATETIME_MAX_S = 2**32 - 1  # DateTime is seconds since 1970 in a UInt32


def step_table(cols: StepColumns) -> tuple[Columns, dict[int, str]]:
    """The steps table's columns (numpy arrays) for decoded telemetry, built without a
    Python object per row, and the rows the table would reject.

    Returns ``(columns, rejected)``: ``rejected`` maps a message position in ``cols``
    (0 .. len(cols.messages) - 1) to the reason its rows cannot be stored (a rank
    beyond the column's type, a time outside DateTime's range); their rows are left
    out of ``columns``. Enum ``phase`` is given as its Int8 codes, ``ts`` as UInt32
    seconds, and the nullable floats as masked arrays (mask = NULL, NaN kept). ``ver``
    is not among the columns: it is the ingest position, which the caller knows
    (:func:`ingest_version`).
    """
    rejected: dict[int, str] = {}
    for name, top in _UINT_MAX.items():
        values = getattr(cols, name)
        for pos in np.unique(cols.sample_message[values > top]).tolist():
            rejected.setdefault(pos, f"steps.{name}: value exceeds {top}")
    ts_s = np.array([int(t.timestamp()) for t in cols.ts_end], dtype=np.int64)
    ts_ms = np.array([_ms(t) for t in cols.ts_end], dtype=np.int64)
    out_of_range = (ts_s < 0) | (ts_s > _DATETIME_MAX_S) | (ts_ms < 0)
    for pos in np.flatnonzero(out_of_range).tolist():
        rejected.setdefault(pos, f"steps.ts: {cols.ts_end[pos].isoformat()} is outside DateTime")
    keep: npt.NDArray[np.bool_] | slice = slice(None)
    if rejected:
        keep = ~np.isin(cols.sample_message, np.fromiter(rejected, dtype=np.int64))
    per_sample = cols.sample_message[keep]
    table: Columns = {
        "job_id": np.array(cols.job_id, dtype=object)[per_sample],
        "step": cols.step.astype(np.uint64)[per_sample],
        "node": np.array(cols.node, dtype=object)[per_sample],
        "run": np.array(cols.run, dtype=object)[per_sample],
    }
    for name, f in FIELDS.items():  # a column per sample field (the table's node: above)
        if f.kind == "int":
            table[name] = getattr(cols, name)[keep].astype(_UINT_TYPE[name])
        elif f.kind in ("phase", "time"):  # phase: Enum8 as its Int8 codes
            table[name] = getattr(cols, name)[keep]
        elif f.kind == "signal":
            table[name] = _nullable(getattr(cols, name)[keep], getattr(cols, f"{name}_null")[keep])
        elif f.kind == "optional":  # Nullable(UInt64) if integral, else Nullable(Float64)
            said = getattr(cols, name)[keep]
            unsaid = np.isnan(said)
            if f.integral:
                said = np.where(unsaid, 0, said).astype(np.uint64)
            table[name] = _nullable(said, unsaid)
    table["ts"] = ts_s.astype(np.uint32)[per_sample]
    table["ts_ms"] = ts_ms.astype(np.uint64)[per_sample]
    return table, rejected


@dataclass(frozen=True, slots=True, eq=False)
class StepRows:
    """The steps table's rows for a batch of raw steps-topic values, ready to insert.

    Every input index is in exactly one of ``stored`` (its rows are in ``columns``),
    ``rejected`` (decoded, but the table refuses its rows: the reason) or ``slow``
    (left to ``schemas.decode``: unusual spelling, or invalid).
    """

    columns: Columns
    row_value: npt.NDArray[np.int64]  # per row: the input index of its message
    stored: list[int]
    rejected: dict[int, str]
    slow: list[int]


def step_rows(values: Sequence[bytes | None]) -> StepRows:
    """Decode raw steps-topic values (:func:`pipeline.io.fastdecode.decode_steps`) into the
    steps table's columns (:func:`step_table`), indexed by input position.

    >>> from datetime import UTC, datetime
    >>> from schemas import RankSample, encode
    >>> t = datetime(2026, 1, 1, tzinfo=UTC)
    >>> s = RankSample(rank=0, local_rank=0, step_time_s=1, compute_s=1, comm_wait_s=0,
    ...                data_wait_s=0)
    >>> ok = encode(StepTelemetry(job_id="j", node="n", step=1, ts_start=t, ts_end=t,
    ...                           samples=(s,)))
    >>> big = ok.replace(b'"rank":0', b'"rank":4294967296')
    >>> out = step_rows([b"{", ok, big])
    >>> out.stored, out.rejected, out.slow, out.row_value.tolist()
    ([1], {2: 'steps.rank: value exceeds 4294967295'}, [0], [1])
    """
    return step_rows_of(decode_steps(values))


def step_rows_of(cols: StepColumns) -> StepRows:
    """:class:`StepRows` of decoded columns (``decode_steps``, or ``from_models``),
    indexed as ``cols`` indexes its input; ``cols.slow`` becomes ``slow``."""
    table, rejected = step_table(cols)
    index = cols.messages
    kept = [pos for pos in range(len(index)) if pos not in rejected]
    row_pos = cols.sample_message
    if rejected:
        row_pos = row_pos[~np.isin(row_pos, np.fromiter(rejected, dtype=np.int64))]
    return StepRows(
        columns=table,
        row_value=index[row_pos],
        stored=index[kept].tolist(),
        rejected={int(index[pos]): reason for pos, reason in rejected.items()},
        slow=cols.slow,
    )


def pack_values(values: Sequence[bytes | None]) -> tuple[bytes, npt.NDArray[np.int64]]:
    """Values as one buffer and their end offsets (-1 for a missing value): handed
    to a decode process as two objects, instead of one per message."""
    ends = np.cumsum([len(v) if v is not None else 0 for v in values], dtype=np.int64)
    missing = [i for i, v in enumerate(values) if v is None]
    if missing:
        ends[missing] = -1
    return b"".join(v for v in values if v is not None), ends


def step_rows_file(src: str, ends: npt.NDArray[np.int64], out: str) -> str:
    """A decode process's entry point: :func:`step_rows_packed` of the buffer in file
    ``src``, written to file ``out`` (returned) by :mod:`pipeline.io.statecodec`. Both
    files are in a directory only the archiver's user can write (the archiver's own
    temporary directory)."""
    with open(src, "rb") as f:
        joined = f.read()
    rows = step_rows_packed(joined, ends)
    with open(out, "wb") as f:
        f.write(statecodec.dumps(rows, level=0))  # plain data, never pickle
    return out


def step_rows_packed(joined: bytes, ends: npt.NDArray[np.int64]) -> StepRows:
    """:func:`step_rows` of values packed by :func:`pack_values`."""
    values: list[bytes | None] = []
    start = 0
    for end in ends.tolist():
        if end < 0:
            values.append(None)
            continue
        values.append(joined[start:end])
        start = end
    return step_rows(values)


def _nullable(values: npt.NDArray[Any], nulls: npt.NDArray[np.bool_]) -> Any:
    return np.ma.MaskedArray(values, mask=nulls)


def _model_step_columns(messages: list[StepTelemetry], offsets: Sequence[int]) -> Columns:
    """The steps table's columns for validated models at ``offsets``; ArchiveRowError
    when a row cannot be stored (see :func:`step_table`)."""
    cols = from_models(messages)
    if cols.slow:
        m = messages[cols.slow[0]]
        raise ArchiveRowError(f"steps: {m.job_id}/{m.node}/{m.step}: an integer exceeds int64")
    table, rejected = step_table(cols)
    if rejected:
        pos, reason = next(iter(rejected.items()))
        m = messages[int(cols.messages[pos])]
        raise ArchiveRowError(f"{reason} ({m.job_id}/{m.node}/{m.step})")
    per_row = cols.messages[cols.sample_message]
    table["ver"] = ingest_version(np.asarray(offsets, dtype=np.int64)[per_row])
    return table


def result_at_ms(ts_ms: int, received_ms: int) -> int:
    """When a command result counts as given (``command_results.at_ms``, what "the
    latest result" of a command is judged by): its own signed time, but never later
    than the archiver's receipt, so dating a result ahead (ten years, or the few
    seconds a clock may be off) gains it nothing over the results that follow it.

    >>> result_at_ms(1_000, 2_000), result_at_ms(10**12, 2_000)
    (1000, 2000)
    """
    return max(0, min(ts_ms, received_ms))


def rows_for(
    messages: Iterable[tuple[Message, int]],
    offsets: Sequence[int] | None = None,
    *,
    received_ms: int | None = None,
) -> dict[str, Columns]:
    """Group (message, record time ms) pairs into columnar inserts per table.

    ``offsets``: each message's offset in its partition, which sets its rows' ``ver``
    (:func:`ingest_version`); all 0 when not given (one offset for everything: rows
    with the same key then tie, and the last one inserted wins). ``received_ms``: the
    archiver's wall clock when it read them, which bounds a command result's ``at_ms``
    (:func:`result_at_ms`); not given, ``at_ms`` is the result's own time.
    """
    tables: dict[str, Columns] = {}
    buffers: dict[str, list[Row]] = defaultdict(list)
    steps: list[StepTelemetry] = []
    step_offsets: list[int] = []
    pairs = list(messages)
    if offsets is None:
        offsets = [0] * len(pairs)
    elif len(offsets) != len(pairs):
        raise ValueError(f"{len(offsets)} offsets for {len(pairs)} messages")
    for (msg, rec_ms), offset in zip(pairs, offsets, strict=True):
        if type(msg) is StepTelemetry:
            steps.append(msg)
            step_offsets.append(offset)
            continue
        table, mapper = TABLE_OF[type(msg)]
        unverified = type(msg) in SIGNED_KINDS and getattr(msg, "signature", None) is None
        ver = unverified_version(offset) if unverified else ingest_version(offset)
        mapped = [{**row, "ver": ver} for row in mapper(msg, rec_ms)]
        if received_ms is not None and type(msg) is CommandResult:
            for row in mapped:
                row["at_ms"] = result_at_ms(row["ts_ms"], received_ms)
        buffers[table].extend(mapped)
    if steps:
        tables["steps"] = _model_step_columns(steps, step_offsets)
    for table, rows in buffers.items():
        if rows:
            tables[table] = {col: [r[col] for r in rows] for col in rows[0]}
    return tables
