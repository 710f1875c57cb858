"""A fetch's steps records decoded together: version 3 (columns) per job step at once.

The worker reads the steps topic a fetch at a time. :func:`decode_fetch` decodes a
fetch's values in one go: each version-3 message by msgspec (its columns as bytes,
:func:`~pipeline.io.fastcolumns.parse`), then the messages of one job step as one
:class:`~detectors.framing.ColumnBlock` (every column one ``b"".join`` and one
``np.frombuffer`` for them all), checked vectorised over the block with the rules of
:func:`~pipeline.io.fastcolumns.view_of` (the schema's ranges, NaN, a rank twice in a
message, a node index outside the message's table). Each accepted message is a
:class:`SpanView`, a span of its block: what the frame and the detection core's rank
checks read as arrays (:mod:`detectors.framing`), with ``samples`` built only for a
reader that asks. Other versions go through :func:`~pipeline.io.fastdecode.decode_step`
record by record; a value the fast path does not take is None (pydantic decides, and
writes the dead letter's error).

>>> from datetime import UTC, datetime
>>> from schemas import RankSample, StepTelemetry, encode
>>> t = datetime(2026, 1, 1, tzinfo=UTC)
>>> def msg(node, first, version=3):
...     s = [RankSample(rank=r, local_rank=r - first, step_time_s=0.5, compute_s=0.4,
...                     comm_wait_s=0.1, data_wait_s=0.0) for r in (first, first + 1)]
...     return encode(StepTelemetry(schema_version=version, job_id="j", node=node, step=3,
...                                 ts_start=t, ts_end=t, samples=tuple(s)))
>>> out = decode_fetch([msg("n0", 0), b"{oops", msg("n1", 2), msg("n2", 4, 1)])
>>> [type(v).__name__ for v in out]
['SpanView', 'NoneType', 'SpanView', 'StepView']
>>> out[0].block is out[2].block, out[2].lo, out[2].samples[1].rank
(True, 2, 3)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime
from itertools import chain
from operator import attrgetter
from typing import Any, Final

import numpy as np
import numpy.typing as npt
from msgspec.structs import astuple

from detectors.frame import ROW_FIELDS
from detectors.framing import ColumnBlock
from pipeline.io import fastcolumns, fastdecode
from schemas.codec import MAX_MESSAGE_BYTES
from schemas.columnar import COLUMNS, PHASES
from schemas.sample import FIELDS, INT_FIELDS, OPTIONAL_FIELDS, SIGNAL_FIELDS, TIME_FIELDS

__all__ = ["SpanView", "decode_fetch"]

_NAN: Final = fastcolumns._NAN
# the record's columns, as the schema defines them (schemas.sample), and the frame's names
_INTS: Final = INT_FIELDS
_TIMES: Final = tuple((t, t.removesuffix("_s")) for t in TIME_FIELDS)
_SIGNALS: Final = SIGNAL_FIELDS
_WORK: Final = OPTIONAL_FIELDS
#: a message's column by name (one C call per message and column)
_GET: Final = {name: attrgetter(name) for name in COLUMNS}


class SpanView:
    """One accepted version-3 message: its envelope, and its samples as the span
    ``lo:hi`` of ``block`` (:class:`~detectors.framing.ColumnBlock`). ``nodes`` is the
    message's node table (empty for a node's own message)."""

    __slots__ = ("block", "hi", "job_id", "lo", "node", "nodes", "rank_bytes", "run", "step",
                 "ts_end", "ts_start")  # fmt: skip

    def __init__(
        self, m: fastcolumns.Columnar, when: tuple[datetime, datetime], block: ColumnBlock,
        lo: int,
    ) -> None:  # fmt: skip
        self.job_id, self.node, self.step, self.run = m.job_id, m.node, m.step, m.run
        self.ts_start, self.ts_end = when
        self.nodes: tuple[str, ...] = () if m.columns.nodes is None else tuple(m.columns.nodes)
        self.block, self.lo, self.hi = block, lo, lo + m.columns.n
        self.rank_bytes = m.columns.rank  #: its ranks as sent (the core's "same ranks?")

    @property
    def samples(self) -> list[Any]:
        """The samples as :class:`~pipeline.io.fastcolumns.ColumnView`'s (built now)."""
        c, lo, hi = self.block.cols, self.lo, self.hi

        def said(a: npt.NDArray[np.float64], integral: bool) -> list[Any]:
            return [None if math.isnan(x) else int(x) if integral else x
                    for x in a[lo:hi].tolist()]  # fmt: skip

        def signal(name: str) -> list[Any]:
            has = c[f"has_{name}"][lo:hi].tolist()
            return [x if h else None for x, h in zip(c[name][lo:hi].tolist(), has, strict=True)]

        names = self.block.names
        by_kind = {
            "int": lambda n: c[n][lo:hi].tolist(),
            "time": lambda n: c[n.removesuffix("_s")][lo:hi].tolist(),
            "phase": lambda n: [PHASES[p] for p in c["phase"][lo:hi].tolist()],
            "signal": signal,
            "optional": lambda n: said(c[n], FIELDS[n].integral),
            "node": lambda n: [names[k] if self.nodes else None
                               for k in self.block.node_id[lo:hi].tolist()],
        }  # fmt: skip
        fields = zip(*(by_kind[FIELDS[n].kind](n) for n in ROW_FIELDS), strict=True)
        return [fastcolumns._ViewSample(*f) for f in fields]

    def rows(self) -> list[tuple[Any, ...]]:
        return list(map(astuple, self.samples))

    def frame_columns(self) -> dict[str, Any]:
        """Its columns as a per-record view gives them (a step that mixes it with
        messages of other versions is framed part by part)."""
        c, lo, hi = self.block.cols, self.lo, self.hi
        out = {k: v[lo:hi] for k, v in c.items()}
        for w in _WORK:
            if bool(np.isnan(out[w]).all()):
                out[w] = None
        out["node_idx"] = out["node_order"] = None
        if self.nodes:
            table = {name: k for k, name in enumerate(self.nodes)}
            ids = self.block.node_id[lo:hi]
            lut = np.array([table.get(name, -1) for name in self.block.names], dtype=np.int32)
            idx = lut[ids]
            seen, first = np.unique(idx, return_index=True)
            out["node_idx"], out["node_order"] = idx, seen[np.argsort(first)].tolist()
        return out


def decode_fetch(values: Sequence[bytes | None], max_bytes: int = MAX_MESSAGE_BYTES) -> list[Any]:
    """Each value's decoded message (a :class:`SpanView` for version 3, else
    :func:`~pipeline.io.fastdecode.decode_step`'s), or None for pydantic to decide (a
    value over ``max_bytes`` too)."""
    out: list[Any] = [None] * len(values)
    steps: dict[tuple[str, int], list[int]] = {}
    parsed: dict[int, fastcolumns.Columnar] = {}
    top = min(max_bytes, MAX_MESSAGE_BYTES)
    for i, raw in enumerate(values):
        if raw is None or len(raw) > top or not raw.isascii():
            continue
        if not fastcolumns.is_columnar(raw):
            out[i] = fastdecode.decode_step(raw)
            continue
        m = fastcolumns.parse(raw)
        if m is not None:
            parsed[i] = m
            steps.setdefault((m.job_id, m.step), []).append(i)
    if not parsed:
        return out
    order = list(parsed)
    raw_times = fastdecode._times(fastcolumns.times_of([parsed[i] for i in order]))
    when: dict[int, tuple[datetime, datetime]] = {}
    for k, i in enumerate(order):
        start, end = raw_times[2 * k], raw_times[2 * k + 1]
        if start is not None and end is not None and end >= start:
            when[i] = (start, end)
    for found in steps.values():
        where = [i for i in found if i in when]
        if where:
            _block(where, parsed, when, out)
    return out


def _block(
    where: list[int], parsed: dict[int, fastcolumns.Columnar],
    when: dict[int, tuple[datetime, datetime]], out: list[Any],
) -> None:  # fmt: skip
    """The messages at ``where`` (one job step) as one block; each accepted one's view
    into ``out``. Each column is one ``map`` over the messages, one join and one
    ``np.frombuffer`` (a message without the column: its fill)."""
    msgs = [parsed[i] for i in where]
    cs = [m.columns for m in msgs]
    counts = [c.n for c in cs]
    k = len(msgs)

    def joined(name: str, fill: bytes) -> bytes:
        bufs = list(map(_GET[name], cs))
        if None in bufs:
            bufs = [b if b is not None else fill * n for b, n in zip(bufs, counts, strict=True)]
        return b"".join(bufs)

    def column(name: str, fill: bytes = b"") -> npt.NDArray[Any]:
        return np.frombuffer(joined(name, fill), dtype=COLUMNS[name][0])

    raw: dict[str, npt.NDArray[Any]] = {name: column(name) for name in _INTS}
    raw["phase"] = column("phase")
    for name, _ in _TIMES:
        raw[name] = column(name)
    for signal in _SIGNALS:
        raw[signal] = column(signal, _NAN)
        nulls = list(map(_GET[f"{signal}_null"], cs))
        if None in nulls:  # a message without the mask: none null where it said the signal
            said = map(_GET[signal], cs)
            nulls = [x if x is not None else (b"\0" if s is not None else b"\1") * n
                     for x, s, n in zip(nulls, said, counts, strict=True)]  # fmt: skip
        raw[f"{signal}_null"] = np.frombuffer(b"".join(nulls), dtype=np.uint8)
    for work in _WORK:
        raw[work] = column(work, _NAN)
    bad = fastcolumns._refused(raw)
    # each sample's node: the message's table (or its own node) through the block's names
    tables = [c.nodes if c.nodes is not None else (m.node,) for m, c in zip(msgs, cs, strict=True)]
    table_len = np.fromiter(map(len, tables), dtype=np.int64, count=k)
    table_at = np.cumsum(table_len) - table_len
    index: dict[str, int] = {}
    lut = [index.setdefault(name, len(index)) for name in chain.from_iterable(tables)]
    names = list(index)
    idx = column("node_idx", b"\0\0\0\0")
    n_samples = np.asarray(counts, dtype=np.int64)
    sample_message = np.repeat(np.arange(k, dtype=np.int64), n_samples)
    inside = (idx >= 0) & (idx < table_len[sample_message])
    bad |= ~inside
    node_id = np.asarray(lut, dtype=np.int32)[table_at[sample_message] + np.where(inside, idx, 0)]
    rank = raw["rank"]
    if rank.size > 1:  # a rank twice in one message: pydantic's error
        same = sample_message[1:] == sample_message[:-1]
        if bool((same & (rank[1:] <= rank[:-1])).any()):
            order = np.lexsort((rank, sample_message))
            sm, r = sample_message[order], rank[order]
            twice = (sm[1:] == sm[:-1]) & (r[1:] == r[:-1])
            bad[order[1:][twice]] = True
    refused = np.zeros(k, dtype=np.bool_)
    refused[sample_message[bad]] = True
    cols: dict[str, npt.NDArray[Any]] = {"rank": rank.astype(np.int64)}
    for name in _INTS[1:]:
        cols[name] = raw[name]
    cols["phase"] = raw["phase"].view(np.int8)
    for name, frame_name in _TIMES:
        cols[frame_name] = raw[name]
    for signal in _SIGNALS:
        null = raw[f"{signal}_null"] == 1
        cols[signal] = np.where(null, np.nan, raw[signal])
        cols[f"has_{signal}"] = ~null
    for work in _WORK:
        cols[work] = raw[work]
    block = ColumnBlock(cols, node_id, names)
    starts = (np.cumsum(n_samples) - n_samples).tolist()
    for i, m, lo, no in zip(where, msgs, starts, refused.tolist(), strict=True):
        if not no:
            out[i] = SpanView(m, when[i], block, lo)
