"""The fast decoder's half for StepTelemetry version 3: columns, not samples.

A version-3 message carries one base64 array per sample field
(:mod:`schemas.columnar`); msgspec turns each into bytes, and a batch's messages become
:class:`~pipeline.io.fastdecode.StepColumns` by joining each field's bytes and one
``np.frombuffer`` per field: no Python object per sample or field. The schema's rules
(lengths, ranges, NaN and null, no rank twice in a message) are checked vectorised over
the batch; a message that breaks one, or that the fast path does not take (an unknown
field, an escape in a name, a seventh fractional digit of a time), goes to ``slow``
for ``schemas.decode`` to give its exact error.

The worker decodes a fetch at once (:mod:`pipeline.io.fetchcolumns`: a job step's
messages as one block); a record alone (:func:`view_of`, through
:func:`~pipeline.io.fastdecode.decode_step`) is a :class:`ColumnView` of arrays that
:meth:`~detectors.frame.StepFrame.from_messages` concatenates, checked by a fixed
number of numpy calls a message; a message of at most :data:`SMALL` samples (a node's)
is checked and viewed in Python instead, where numpy's fixed cost is more than the
work (BENCHMARKS.md, "Columns on the wire").

>>> from datetime import UTC, datetime
>>> from schemas import RankSample, StepTelemetry, encode
>>> t = datetime(2026, 1, 1, tzinfo=UTC)
>>> s = [RankSample(rank=r, local_rank=r, step_time_s=0.5, compute_s=0.4,
...                 comm_wait_s=0.1, data_wait_s=0.0) for r in range(2)]
>>> raw = encode(StepTelemetry(schema_version=3, job_id="j", node="n0", step=3,
...                            ts_start=t, ts_end=t, samples=tuple(s)))
>>> is_columnar(raw), parse(raw).columns.n
(True, 2)
"""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Callable, Sequence
from operator import attrgetter
from typing import Annotated, Any, Final, Literal

import msgspec
import numpy as np
import numpy.typing as npt
from msgspec.structs import astuple

from detectors.frame import ROW_FIELDS
from schemas.columnar import COLUMNS, MAX_COLUMN_SAMPLES, PHASES
from schemas.telemetry import (
    FIELDS,
    INT_FIELDS,
    MAX_LOCAL_RANK,
    MAX_RANKS_PER_JOB,
    MAX_STEP,
    MAX_STEP_SECONDS,
    OPTIONAL_FIELDS,
    SIGNAL_FIELDS,
    TIME_FIELDS,
)

#: :class:`~pipeline.io.fastdecode.StepColumns` (this module stands below that one, which
#: hands its classes and checks in)
StepColumns = Any

__all__ = [
    "ColumnView", "Columnar", "decode", "is_columnar", "merge", "parse", "sample_columns",
    "times_of", "view_of",
]  # fmt: skip

_Name = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
_Nodes = Annotated[list[_Name], msgspec.Meta(min_length=1, max_length=MAX_COLUMN_SAMPLES)]
_NAN: Final = struct.pack("<d", float("nan"))
_MARK: Final = b'"columns":'


#: The columns every message has (the rest may be absent: no sample said them).
_REQUIRED: Final = tuple(n for n, f in FIELDS.items() if f.kind in ("int", "phase", "time"))
#: A version-3 message's columns as msgspec reads them: :data:`~schemas.columnar.COLUMNS`.
_Cols = msgspec.defstruct(
    "_Cols",
    [("n", Annotated[int, msgspec.Meta(ge=1, le=MAX_COLUMN_SAMPLES)]),
     *((c, bytes) for c in COLUMNS if c in _REQUIRED),
     *((c, bytes | None, None) for c in COLUMNS if c not in _REQUIRED),
     ("nodes", _Nodes | None, None)],
    gc=False, forbid_unknown_fields=True, module=__name__,
)  # fmt: skip
#: The per-sample columns of StepColumns a message gives (a sample's node apart).
_PER_SAMPLE: Final = tuple(c for c in COLUMNS if c != "node_idx")
#: Hot-path getters and names, made once from the lists above.
_INTS_OF: Final = attrgetter(*INT_FIELDS)
_TIMES_OF: Final = attrgetter(*TIME_FIELDS)
_SIGNALS: Final = tuple((s, f"{s}_null", f"has_{s}") for s in SIGNAL_FIELDS)
#: optional field -> (lowest, highest, integral), the schema's bounds
_BOUNDS: Final = {
    w: (-math.inf if FIELDS[w].low is None else FIELDS[w].low,
        math.inf if FIELDS[w].high is None else FIELDS[w].high, FIELDS[w].integral)
    for w in OPTIONAL_FIELDS
}  # fmt: skip


class Columnar(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    """A version-3 message as msgspec decoded it (times still raw JSON tokens)."""

    job_id: _Name
    node: _Name
    step: Annotated[int, msgspec.Meta(ge=0, le=MAX_STEP)]
    ts_start: msgspec.Raw
    ts_end: msgspec.Raw
    columns: _Cols
    schema_version: Literal[3]
    run: Annotated[str, msgspec.Meta(max_length=256)] = ""


_DECODER = msgspec.json.Decoder(Columnar)
_SIZES: Final = {name: np.dtype(dt).itemsize for name, (dt, _) in COLUMNS.items()}


def is_columnar(raw: bytes) -> bool:
    """Whether ``raw`` looks like a version-3 message (the fast path tries it as one)."""
    return _MARK in raw


def parse(raw: bytes) -> Columnar | None:
    """msgspec's decode and the columns' shape (lengths, pairs), or None for pydantic."""
    try:
        m = _DECODER.decode(raw)
    except msgspec.DecodeError:
        return None
    c = m.columns
    n = c.n
    for name, size in _SIZES.items():
        buf = getattr(c, name)
        if buf is not None and len(buf) != n * size:
            return None
    for signal, null, _ in _SIGNALS:
        if getattr(c, null) is not None and getattr(c, signal) is None:
            return None
    if (c.nodes is None) != (c.node_idx is None):
        return None
    return m


def sample_columns(
    msgs: Sequence[Columnar],
) -> tuple[dict[str, npt.NDArray[Any]], list[str], npt.NDArray[np.bool_]]:
    """The batch's per-sample columns (StepColumns' names), each sample's node, and a
    mask of the samples whose values the schema refuses."""
    counts = [m.columns.n for m in msgs]

    def field(name: str, fill: bytes) -> npt.NDArray[Any]:
        raw = b"".join(
            buf if (buf := getattr(m.columns, name)) is not None else fill * k
            for m, k in zip(msgs, counts, strict=True)
        )
        return np.frombuffer(raw, dtype=COLUMNS[name][0])

    out: dict[str, npt.NDArray[Any]] = {}
    for name in _REQUIRED:
        out[name] = field(name, b"")
    for signal in SIGNAL_FIELDS:
        out[signal] = field(signal, _NAN).astype(np.float64)
        has = [getattr(m.columns, signal) is not None for m in msgs]
        masks = (
            getattr(m.columns, f"{signal}_null") or (b"\0" if h else b"\1") * k
            for m, h, k in zip(msgs, has, counts, strict=True)
        )
        out[f"{signal}_null"] = np.frombuffer(b"".join(masks), dtype=np.uint8)
    for work in OPTIONAL_FIELDS:
        out[work] = field(work, _NAN).astype(np.float64)
    bad = _refused(out)
    for name in INT_FIELDS:
        out[name] = out[name].astype(np.int64)
    out["phase"] = out["phase"].astype(np.int8)
    for name in TIME_FIELDS:
        out[name] = out[name].astype(np.float64)
    for signal in SIGNAL_FIELDS:
        out[f"{signal}_null"] = out[f"{signal}_null"].astype(np.bool_)
    nodes: list[str] = []
    for m, k in zip(msgs, counts, strict=True):
        c = m.columns
        if c.nodes is None:
            nodes += [m.node] * k
            continue
        idx = np.frombuffer(c.node_idx or b"", dtype="<i4")
        inside = (idx >= 0) & (idx < len(c.nodes))
        if not inside.all():
            start = len(nodes)
            bad[start : start + k] |= ~inside
            idx = np.where(inside, idx, 0)
        names = np.array(c.nodes, dtype=object)
        nodes += names[idx].tolist()
    return out, nodes, bad


def _refused(c: dict[str, npt.NDArray[Any]]) -> npt.NDArray[np.bool_]:
    """Samples out of the schema's range (:class:`~schemas.RankSample`'s bounds)."""
    bad = np.zeros(c["rank"].shape[0], dtype=np.bool_)
    for name in INT_FIELDS:  # int32: a bound at 2**31 - 1 holds already
        f = FIELDS[name]
        bad |= c[name] < f.low if f.high is None or f.high >= 2**31 - 1 else (
            (c[name] < f.low) | (c[name] > f.high))  # fmt: skip
    bad |= c["phase"] >= len(PHASES)
    for t in TIME_FIELDS:
        bad |= ~((c[t] >= FIELDS[t].low) & (c[t] <= FIELDS[t].high))  # NaN fails both
    for s in SIGNAL_FIELDS:
        bad |= c[f"{s}_null"] > 1
    for w in OPTIONAL_FIELDS:
        v = c[w]
        said = ~np.isnan(v)
        ok = _within(v, w)
        if FIELDS[w].integral:
            ok &= np.floor(v) == v
        bad |= said & ~ok
    return bad


def _within(v: npt.NDArray[np.float64], name: str) -> npt.NDArray[np.bool_]:
    """Where values lie in a field's bounds (NaN nowhere)."""
    f = FIELDS[name]
    low = -np.inf if f.low is None else f.low
    high = np.inf if f.high is None else f.high
    return (v >= low) & (v <= high)  # type: ignore[no-any-return]


def merge(a: StepColumns, b: StepColumns) -> StepColumns:
    """Two decoded parts of one batch as one, messages in input order (``messages``
    of each indexes the whole batch)."""
    messages = np.concatenate([a.messages, b.messages])
    order = np.argsort(messages, kind="stable")
    glob = np.concatenate([a.messages[a.sample_message], b.messages[b.sample_message]])
    perm = np.argsort(glob, kind="stable")  # a message's samples stay in their order

    def per_message(x: list[Any], y: list[Any]) -> list[Any]:
        both = x + y
        return [both[i] for i in order.tolist()]

    def per_sample(x: npt.NDArray[Any], y: npt.NDArray[Any]) -> npt.NDArray[Any]:
        return np.concatenate([x, y])[perm]

    sorted_messages = messages[order]
    nodes = a.sample_node + b.sample_node
    kw: dict[str, Any] = {
        "messages": sorted_messages,
        "job_id": per_message(a.job_id, b.job_id),
        "node": per_message(a.node, b.node),
        "run": per_message(a.run, b.run),
        "step": np.concatenate([a.step, b.step])[order],
        "ts_start": per_message(a.ts_start, b.ts_start),
        "ts_end": per_message(a.ts_end, b.ts_end),
        "n_samples": np.concatenate([a.n_samples, b.n_samples])[order],
        "sample_message": np.searchsorted(sorted_messages, glob[perm]).astype(np.int64),
        "slow": sorted([*a.slow, *b.slow]),
        "sample_node": [nodes[i] for i in perm.tolist()],
    }
    for name in _PER_SAMPLE:
        kw[name] = per_sample(getattr(a, name), getattr(b, name))
    return type(a)(**kw)


def times_of(msgs: Sequence[Columnar]) -> list[msgspec.Raw]:
    """The time tokens of the messages, start and end alternating."""
    return [t for m in msgs for t in (m.ts_start, m.ts_end)]


def decode(
    values: Sequence[bytes | None],
    where: list[int],
    make: Callable[..., StepColumns],
    times_of_raw: Callable[[list[msgspec.Raw]], list[Any]],
    invalid: Callable[[StepColumns], npt.NDArray[np.int64]],
) -> StepColumns:
    """The columns of the version-3 messages at ``where`` (``messages`` and ``slow``
    index ``values``): every field one ``np.frombuffer`` for the whole batch."""
    slow: list[int] = []
    msgs: list[Columnar] = []
    index: list[int] = []
    for i in where:
        raw = values[i]
        m = parse(raw) if raw is not None and raw.isascii() else None
        if m is None:
            slow.append(i)
        else:
            msgs.append(m)
            index.append(i)
    times = times_of_raw(times_of(msgs))
    alive = [
        j for j, (s, e) in enumerate(zip(times[0::2], times[1::2], strict=True))
        if s is not None and e is not None and e >= s
    ]  # fmt: skip
    kept = set(alive)
    slow += [index[j] for j in range(len(msgs)) if j not in kept]
    while True:  # twice at most: the messages the schema refuses go, the rest again
        now = [msgs[j] for j in alive]
        per_sample, nodes, refused = sample_columns(now)
        n_samples = np.fromiter((m.columns.n for m in now), dtype=np.int64, count=len(now))
        sample_message = np.repeat(np.arange(len(now), dtype=np.int64), n_samples)
        cols = make(
            messages=np.asarray([index[j] for j in alive], dtype=np.int64),
            job_id=[m.job_id for m in now],
            node=[m.node for m in now],
            run=[m.run for m in now],
            step=np.fromiter((m.step for m in now), dtype=np.int64, count=len(now)),
            ts_start=[times[2 * j] for j in alive],
            ts_end=[times[2 * j + 1] for j in alive],
            n_samples=n_samples,
            sample_message=sample_message,
            slow=sorted(slow),
            sample_node=nodes,
            **per_sample,
        )
        bad = np.union1d(sample_message[refused], invalid(cols)).tolist()
        if not bad:
            return cols
        slow += [index[alive[k]] for k in bad]
        dropped = set(bad)
        alive = [j for k, j in enumerate(alive) if k not in dropped]


class _ViewSample(msgspec.Struct, gc=False):
    """A rank's sample of a :class:`ColumnView`: :data:`~detectors.frame.ROW_FIELDS`, in
    that order (asserted below), values already checked. Spelled out, not made from the
    list: a class-made struct builds faster, and this is the per-record path."""

    rank: int
    local_rank: int
    step_time_s: float
    compute_s: float
    comm_wait_s: float
    data_wait_s: float
    dp_group: int
    pp_stage: int
    tp_group: int
    phase: str
    loss: float | None
    grad_norm: float | None
    tokens: int | None
    flops: float | None
    max_seq_len: int | None
    node: str | None


if _ViewSample.__struct_fields__ != ROW_FIELDS:  # a field the schema gained: made, slower
    _ViewSample = msgspec.defstruct(  # type: ignore[misc]
        "_ViewSample", [(f, Any) for f in ROW_FIELDS], gc=False, module=__name__
    )
_I4: Final = np.dtype("<i4")
_F8: Final = np.dtype("<f8")


class ColumnView:
    """One version-3 message the worker's per-record fast path took, as arrays: what
    :meth:`detectors.frame.StepFrame.from_messages` concatenates (``frame_columns``),
    with ``samples`` built only when a reader asks for them."""

    __slots__ = (
        "_samples",
        "columns",
        "job_id",
        "node",
        "nodes",
        "run",
        "step",
        "ts_end",
        "ts_start",
    )  # fmt: skip

    def __init__(
        self, m: Columnar, start: Any, end: Any, columns: dict[str, Any] | None,
        samples: list[_ViewSample] | None = None,
    ) -> None:  # fmt: skip
        self.job_id, self.node, self.step, self.run = m.job_id, m.node, m.step, m.run
        self.ts_start, self.ts_end = start, end
        self.nodes: tuple[str, ...] | None = (
            None if m.columns.nodes is None else tuple(m.columns.nodes)
        )
        self.columns = columns
        self._samples = samples

    def frame_columns(self) -> dict[str, Any] | None:
        """The frame's columns of this message (``node_idx`` indexes ``nodes``; None: every
        sample is the message's node), or None for a small one: read its ``rows()``."""
        return self.columns

    @property
    def samples(self) -> list[_ViewSample]:
        if self._samples is None:
            c = self.columns
            assert c is not None  # a small view is built with its samples
            n = len(c["rank"])

            def said(a: npt.NDArray[np.float64] | None, integral: bool) -> list[Any]:
                if a is None:
                    return [None] * n
                return [None if math.isnan(x) else int(x) if integral else x for x in a.tolist()]

            def signal(a: npt.NDArray[np.float64], has: npt.NDArray[np.bool_]) -> list[Any]:
                return [x if h else None for x, h in zip(a.tolist(), has.tolist(), strict=True)]

            names = (
                [None] * n if self.nodes is None
                else [self.nodes[k] for k in c["node_idx"].tolist()]
            )  # fmt: skip
            lists: dict[str, list[Any]] = {"node": names}
            for name, f in FIELDS.items():
                if f.kind in ("int", "time"):
                    lists[name] = c[_FRAME.get(name, name)].tolist()
                elif f.kind == "phase":
                    lists[name] = [PHASES[p] for p in c["phase"].tolist()]
                elif f.kind == "signal":
                    lists[name] = signal(c[name], c[f"has_{name}"])
                elif f.kind == "optional":
                    lists[name] = said(c.get(name), f.integral)
            fields = zip(*(lists[f] for f in ROW_FIELDS), strict=True)
            self._samples = [_ViewSample(*f) for f in fields]
        return self._samples

    def rows(self) -> list[tuple[Any, ...]]:
        return list(map(astuple, self.samples))


#: The frame's names of the timings (the schema's without ``_s``).
_FRAME: Final = {t: t.removesuffix("_s") for t in TIME_FIELDS}
_FRAME_TIMES: Final = tuple(_FRAME.values())
#: The order :func:`_small` builds a sample's fields in: ROW_FIELDS' (a schema whose
#: fields break it fails here, at import, not in a view).
_SMALL_ORDER: Final = ("rank", "local_rank", *TIME_FIELDS, *INT_FIELDS[2:], "phase",
                       *SIGNAL_FIELDS, *OPTIONAL_FIELDS, "node")  # fmt: skip
assert ROW_FIELDS == _SMALL_ORDER, f"_small builds {_SMALL_ORDER}, rows are {ROW_FIELDS}"
#: A message of at most this many samples is checked and viewed in Python (a node's
#: message: numpy's fixed cost per call is more than the work on eight values).
SMALL: Final = 16


def _small(m: Columnar, when: tuple[Any, Any]) -> ColumnView | None:
    """:func:`view_of` for a small message: its samples built at once, the same checks."""
    c, n = m.columns, m.columns.n

    def ints(b: bytes) -> list[int]:
        return memoryview(b).cast("i").tolist()

    def floats(b: bytes | None) -> list[float] | None:
        return None if b is None else memoryview(b).cast("d").tolist()

    flat = ints(b"".join(_INTS_OF(c)))
    rank, local = flat[:n], flat[n : 2 * n]
    groups = [flat[2 * n : 3 * n], flat[3 * n : 4 * n], flat[4 * n :]]
    if min(flat) < 0 or max(rank) >= MAX_RANKS_PER_JOB or max(local) > MAX_LOCAL_RANK:
        return None
    spans = floats(b"".join(_TIMES_OF(c))) or []
    total = sum(spans)  # NaN when a value is (or inf and -inf are)
    if math.isnan(total) or min(spans) < 0 or max(spans) > MAX_STEP_SECONDS:
        return None
    if max(c.phase) >= len(PHASES) or len(set(rank)) != n:
        return None
    times = [spans[:n], spans[n : 2 * n], spans[2 * n : 3 * n], spans[3 * n :]]
    signals = []
    for signal, null_name, _ in _SIGNALS:
        values, null = getattr(c, signal), getattr(c, null_name)
        v = floats(values)
        if v is None:
            signals.append([None] * n)
        elif null is None:
            signals.append(v)
        elif max(null) > 1:
            return None
        else:
            signals.append([None if z else x for x, z in zip(v, null, strict=True)])
    work: list[list[Any]] = []
    for name, (low, high, integral) in _BOUNDS.items():
        v = floats(getattr(c, name))
        if v is None:
            work.append([None] * n)
            continue
        said = [x for x in v if not math.isnan(x)]
        if said and (min(said) < low or max(said) > high or (integral and not all(
            x.is_integer() for x in said))):  # fmt: skip
            return None
        work.append([None if math.isnan(x) else int(x) if integral else x for x in v])
    names: list[str | None] = [None] * n
    if c.nodes is not None:
        idx = ints(c.node_idx or b"")
        if min(idx) < 0 or max(idx) >= len(c.nodes):
            return None
        names = [c.nodes[k] for k in idx]
    # positional, in ROW_FIELDS' order (asserted with _SMALL_ORDER)
    samples = list(map(_ViewSample, rank, local, *times, *groups, [PHASES[p] for p in c.phase],
                       *signals, *work, names))  # fmt: skip
    return ColumnView(m, when[0], when[1], None, samples)


def view_of(raw: bytes, times: Callable[[Columnar], Any]) -> ColumnView | None:
    """The worker's per-record path for a version-3 message: a few numpy calls a
    message, whatever its size; None where pydantic decides (as :func:`decode`). A
    rack's ``node_order`` lists the indexes of ``nodes`` in the order the samples first
    name them (the frame names its nodes in that order, as it does a version-2
    message's): the table's own order when each node's samples come together (what
    ``merge_nodes`` sends), else found by a sort."""
    m = parse(raw)
    if m is None:
        return None
    when = times(m)
    if when is None:
        return None
    if m.columns.n <= SMALL and sys.byteorder == "little":
        return _small(m, when)
    c, n = m.columns, m.columns.n
    ints = np.frombuffer(b"".join(_INTS_OF(c)), dtype=_I4).reshape(len(INT_FIELDS), n)
    if ints.min() < 0 or ints[0].max() >= MAX_RANKS_PER_JOB or ints[1].max() > MAX_LOCAL_RANK:
        return None
    t = np.frombuffer(b"".join(_TIMES_OF(c)), dtype=_F8).reshape(len(TIME_FIELDS), n)
    if not (t.min() >= 0 and t.max() <= MAX_STEP_SECONDS):  # NaN fails too
        return None
    phase = np.frombuffer(c.phase, dtype=np.uint8)
    if phase.max() >= len(PHASES):
        return None
    rank = ints[0]
    if n > 1 and not (rank[1:] > rank[:-1]).all() and np.unique(rank).size != n:
        return None
    out: dict[str, Any] = dict(zip(INT_FIELDS, ints, strict=True))
    out.update(zip(_FRAME_TIMES, t, strict=True))
    out["rank"], out["phase"] = rank.astype(np.int64), phase.view(np.int8)
    for signal, null_name, has in _SIGNALS:
        values, null = getattr(c, signal), getattr(c, null_name)
        if values is None:
            out[signal], out[has] = np.full(n, np.nan), np.zeros(n, dtype=np.bool_)
            continue
        a = np.frombuffer(values, dtype=_F8)
        if null is None:
            out[signal], out[has] = a, np.ones(n, dtype=np.bool_)
            continue
        mask = np.frombuffer(null, dtype=np.uint8)
        if mask.max() > 1:
            return None
        out[signal], out[has] = np.where(mask == 1, np.nan, a), mask == 0
    for work, (low, high, integral) in _BOUNDS.items():
        raw_work = getattr(c, work)
        w = None if raw_work is None else np.frombuffer(raw_work, dtype=_F8)
        if w is not None:
            said: npt.NDArray[np.float64] = w[~np.isnan(w)]
            if not said.size:
                w = None
            elif not (said.min() >= low and said.max() <= high) or (
                integral and not (np.floor(said) == said).all()
            ):
                return None
        out[work] = w
    out["node_idx"] = out["node_order"] = None
    if c.nodes is not None:
        idx = np.frombuffer(c.node_idx or b"", dtype=_I4)
        steps = np.diff(idx)
        if idx[0] == 0 and idx[-1] == len(c.nodes) - 1 and not ((steps != 0) & (steps != 1)).any():
            out["node_order"] = list(range(len(c.nodes)))
        elif idx.min() < 0 or idx.max() >= len(c.nodes):
            return None
        else:
            seen, first = np.unique(idx, return_index=True)
            out["node_order"] = seen[np.argsort(first)].tolist()
        out["node_idx"] = idx
    return ColumnView(m, when[0], when[1], out)
