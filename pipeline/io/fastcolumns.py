"""The fast decoder's half for StepTelemetry version 3: columns, not samples.

A version-3 message carries one base64 array per sample field
(:mod:`schemas.columnar`); msgspec turns each into bytes, and a batch's messages become
:class:`~pipeline.io.fastdecode.StepColumns` by joining each field's bytes and one
``np.frombuffer`` per field: no Python object per sample or field. The schema's rules
(lengths, ranges, NaN and null, no rank twice in a message) are checked vectorised over
the batch; a message that breaks one, or that the fast path does not take (an unknown
field, an escape in a name, a seventh fractional digit of a time), goes to ``slow``
for ``schemas.decode`` to give its exact error.

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
from collections.abc import Callable, Sequence
from typing import Annotated, Any, Final, Literal

import msgspec
import numpy as np
import numpy.typing as npt

from schemas.columnar import COLUMNS, MAX_COLUMN_SAMPLES, PHASES
from schemas.telemetry import (
    MAX_FLOPS,
    MAX_LOCAL_RANK,
    MAX_RANKS_PER_JOB,
    MAX_STEP,
    MAX_STEP_SECONDS,
    MAX_TOKENS,
)

#: :class:`~pipeline.io.fastdecode.StepColumns` (this module stands below that one, which
#: hands its classes and checks in)
StepColumns = Any

__all__ = [
    "Columnar", "decode", "is_columnar", "merge", "parse", "sample_columns", "times_of", "view",
]  # fmt: skip

_Name = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
_Nodes = Annotated[list[_Name], msgspec.Meta(min_length=1, max_length=MAX_COLUMN_SAMPLES)]
_NAN: Final = struct.pack("<d", float("nan"))
_MARK: Final = b'"columns":'


class _Cols(msgspec.Struct, gc=False, forbid_unknown_fields=True):
    n: Annotated[int, msgspec.Meta(ge=1, le=MAX_COLUMN_SAMPLES)]
    rank: bytes
    local_rank: bytes
    dp_group: bytes
    pp_stage: bytes
    tp_group: bytes
    phase: bytes
    step_time_s: bytes
    compute_s: bytes
    comm_wait_s: bytes
    data_wait_s: bytes
    loss: bytes | None = None
    loss_null: bytes | None = None
    grad_norm: bytes | None = None
    grad_norm_null: bytes | None = None
    tokens: bytes | None = None
    flops: bytes | None = None
    max_seq_len: bytes | None = None
    node_idx: bytes | None = None
    nodes: (
        Annotated[list[_Name], msgspec.Meta(min_length=1, max_length=MAX_COLUMN_SAMPLES)] | None
    ) = None


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
_REQUIRED: Final = ("rank", "local_rank", "dp_group", "pp_stage", "tp_group", "phase",
                    "step_time_s", "compute_s", "comm_wait_s", "data_wait_s")  # fmt: skip


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
    if (c.loss_null is not None and c.loss is None) or (
        c.grad_norm_null is not None and c.grad_norm is None
    ):
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
    for signal in ("loss", "grad_norm"):
        out[signal] = field(signal, _NAN).astype(np.float64)
        has = [getattr(m.columns, signal) is not None for m in msgs]
        masks = (
            getattr(m.columns, f"{signal}_null") or (b"\0" if h else b"\1") * k
            for m, h, k in zip(msgs, has, counts, strict=True)
        )
        out[f"{signal}_null"] = np.frombuffer(b"".join(masks), dtype=np.uint8)
    for work in ("tokens", "flops", "max_seq_len"):
        out[work] = field(work, _NAN).astype(np.float64)
    bad = _refused(out)
    for name in ("rank", "local_rank", "dp_group", "pp_stage", "tp_group"):
        out[name] = out[name].astype(np.int64)
    out["phase"] = out["phase"].astype(np.int8)
    for name in ("step_time_s", "compute_s", "comm_wait_s", "data_wait_s"):
        out[name] = out[name].astype(np.float64)
    for signal in ("loss", "grad_norm"):
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
    bad = (c["rank"] < 0) | (c["rank"] >= MAX_RANKS_PER_JOB)
    bad |= (c["local_rank"] < 0) | (c["local_rank"] > MAX_LOCAL_RANK)
    for g in ("dp_group", "pp_stage", "tp_group"):  # int32: never above MAX_GROUP_ID
        bad |= c[g] < 0
    bad |= c["phase"] >= len(PHASES)
    for t in ("step_time_s", "compute_s", "comm_wait_s", "data_wait_s"):
        bad |= ~((c[t] >= 0) & (c[t] <= MAX_STEP_SECONDS))  # NaN fails both
    for s in ("loss_null", "grad_norm_null"):
        bad |= c[s] > 1
    for w, top in (("tokens", MAX_TOKENS), ("flops", MAX_FLOPS), ("max_seq_len", MAX_TOKENS)):
        v = c[w]
        said = ~np.isnan(v)
        ok = (v >= 0) & (v <= top)
        if w != "flops":
            ok &= np.floor(v) == v
        bad |= said & ~ok
    return bad


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
    for name in ("rank", "local_rank", "dp_group", "pp_stage", "tp_group", "phase",
                 "step_time_s", "compute_s", "comm_wait_s", "data_wait_s", "loss",
                 "loss_null", "grad_norm", "grad_norm_null", "tokens", "flops",
                 "max_seq_len"):  # fmt: skip
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
    slow += [index[j] for j in range(len(msgs)) if j not in set(alive)]
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
            ts_start=[times[2 * j] for j in alive],  # type: ignore[misc]
            ts_end=[times[2 * j + 1] for j in alive],  # type: ignore[misc]
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
        alive = [j for k, j in enumerate(alive) if k not in set(bad)]


def view(
    cols: StepColumns, rack: bool, make: Callable[..., Any], sample: Callable[..., Any]
) -> Any:
    """The one version-3 message of ``cols`` as a view (``make``: StepView, ``sample``:
    its samples' struct), or None (pydantic decides)."""
    if cols.slow:
        return None
    n = len(cols.rank)

    def said(a: npt.NDArray[np.float64], integral: bool) -> list[Any]:
        if np.isnan(a).all():
            return [None] * n
        return [None if math.isnan(x) else int(x) if integral else x for x in a.tolist()]

    def signal(a: npt.NDArray[np.float64], null: npt.NDArray[np.bool_]) -> list[Any]:
        if null.all():
            return [None] * n
        return [None if z else x for x, z in zip(a.tolist(), null.tolist(), strict=True)]

    phases = [PHASES[p] for p in cols.phase.tolist()]
    fields = zip(
        cols.rank.tolist(), cols.local_rank.tolist(), cols.step_time_s.tolist(),
        cols.compute_s.tolist(), cols.comm_wait_s.tolist(), cols.data_wait_s.tolist(),
        cols.dp_group.tolist(), cols.pp_stage.tolist(), cols.tp_group.tolist(), phases,
        signal(cols.loss, cols.loss_null), signal(cols.grad_norm, cols.grad_norm_null),
        said(cols.tokens, True), said(cols.flops, False), said(cols.max_seq_len, True),
        cols.sample_node if rack else [None] * n, strict=True,
    )  # fmt: skip
    samples = [sample(*f) for f in fields]
    return make(cols.job_id[0], cols.node[0], int(cols.step[0]), cols.ts_start[0],
                cols.ts_end[0], samples, cols.run[0])  # fmt: skip
