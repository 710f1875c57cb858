"""Columnar view of one job step: every reporting rank as numpy arrays.

Detectors work on a :class:`StepFrame` so that scoring 8k ranks is a handful of
vectorised numpy operations instead of a Python loop. The worker builds a frame from
the StepTelemetry messages of one step (one message per node); the simulator builds
frames directly.

Examples
--------
>>> from datetime import datetime, timezone
>>> from schemas import RankSample, StepTelemetry
>>> t = datetime(2026, 1, 1, tzinfo=timezone.utc)
>>> msgs = [StepTelemetry(job_id="j", node=f"n{n}", step=3, ts_start=t, ts_end=t,
...         samples=tuple(RankSample(rank=2 * n + g, local_rank=g, step_time_s=1.0,
...                       compute_s=0.8, comm_wait_s=0.1, data_wait_s=0.1)
...                       for g in range(2))) for n in range(2)]
>>> f = StepFrame.from_messages(msgs)
>>> f.n_ranks, f.nodes, f.node_of_rank(3)
(4, ('n0', 'n1'), 'n1')
>>> [m.node for m in f.to_messages()]
['n0', 'n1']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from operator import attrgetter
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from schemas.telemetry import FIELDS, OPTIONAL_FIELDS, Phase, RankSample, StepTelemetry

__all__ = [
    "NODE_CLOCK_SPREAD_S",
    "OPTIONAL_FIELDS",
    "PHASE_CODES",
    "PHASES",
    "ROW_FIELDS",
    "WORK_FIELDS",
    "NodeStep",
    "optional_columns",
    "RankRow",
    "StepFrame",
    "step_times",
]

#: Seconds the nodes of a synchronous step may disagree on when it ended (or began):
#: the step's time is its nodes' (low) median, and the latest node counts only this
#: far beyond it.
NODE_CLOCK_SPREAD_S = 2.0


def step_times(ends: Sequence[float], starts: Sequence[float]) -> tuple[float, float]:
    """The end and start of one step from its nodes' own times, so that no single node
    moves them: the latest end, but at most :data:`NODE_CLOCK_SPREAD_S` past the nodes'
    low median, and the earliest start, at most that much before their high median.
    One node dating its record +290 s (within the skew the worker accepts) moved the
    job's clock and made the job look hung for minutes while it kept stepping.

    >>> step_times([10.0, 10.1, 300.0], [9.0, 9.1, 8.9])
    (12.0, 8.9)
    >>> step_times([10.0, 300.0], [9.0, -500.0])
    (12.0, 7.0)
    >>> step_times([], [])
    (0.0, inf)
    """
    if not ends:
        return 0.0, float("inf")
    e, b = sorted(ends), sorted(starts)
    low, high = e[(len(e) - 1) // 2], b[len(b) // 2]
    return min(e[-1], low + NODE_CLOCK_SPREAD_S), max(b[0], high - NODE_CLOCK_SPREAD_S)


#: Phase <-> int8 code used in frames (keyed by the value too: Phase is a StrEnum).
PHASES: tuple[Phase, ...] = (Phase.WARMUP, Phase.TRAIN, Phase.EVAL, Phase.CHECKPOINT)
PHASE_CODES: dict[str, int] = {p: i for i, p in enumerate(PHASES)}

F64 = npt.NDArray[np.float64]
I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]
I8 = npt.NDArray[np.int8]
B = npt.NDArray[np.bool_]

#: One rank's sample as :meth:`StepFrame.from_messages` reads it: a tuple of these
#: attributes, in this order (what a message's ``rows()`` returns, when it has one):
#: RankSample's fields (:data:`~schemas.telemetry.SAMPLE_FIELDS`), those it requires
#: first (a msgspec struct's order), ``node`` last.
ROW_FIELDS: tuple[str, ...] = (
    *(n for n, f in FIELDS.items() if f.default is ...),
    *(n for n, f in FIELDS.items() if f.default is not ... and f.kind != "node"),
    *(n for n, f in FIELDS.items() if f.kind == "node"),
)
#: The work a step did (optional per rank): the frame's float64 columns of these names,
#: among the optional numbers (:data:`~schemas.telemetry.OPTIONAL_FIELDS`: each a float64
#: column, None when no rank of the step said it).
WORK_FIELDS: tuple[str, ...] = ("tokens", "flops", "max_seq_len")
assert set(WORK_FIELDS) <= set(OPTIONAL_FIELDS)
_ROW = attrgetter(*ROW_FIELDS)
_AT = {name: i for i, name in enumerate(ROW_FIELDS)}


class RankRow(Protocol):
    """What a frame reads from one rank's sample (:class:`~schemas.RankSample` has it)."""

    @property
    def rank(self) -> int: ...
    @property
    def local_rank(self) -> int: ...
    @property
    def dp_group(self) -> int: ...
    @property
    def pp_stage(self) -> int: ...
    @property
    def tp_group(self) -> int: ...
    @property
    def phase(self) -> str: ...
    @property
    def step_time_s(self) -> float: ...
    @property
    def compute_s(self) -> float: ...
    @property
    def comm_wait_s(self) -> float: ...
    @property
    def data_wait_s(self) -> float: ...
    @property
    def loss(self) -> float | None: ...
    @property
    def grad_norm(self) -> float | None: ...
    @property
    def tokens(self) -> int | None: ...
    @property
    def flops(self) -> float | None: ...
    @property
    def max_seq_len(self) -> int | None: ...
    @property
    def node(self) -> str | None: ...


class NodeStep(Protocol):
    """What a frame reads from one node's message for a step: a validated
    :class:`~schemas.StepTelemetry`, or a lighter view a fast decoder built from the
    same JSON. A message may also have a ``rows()`` method that returns its samples
    as tuples of :data:`ROW_FIELDS` (faster than the frame reading each attribute)."""

    @property
    def job_id(self) -> str: ...
    @property
    def node(self) -> str: ...
    @property
    def step(self) -> int: ...
    @property
    def ts_start(self) -> datetime: ...
    @property
    def ts_end(self) -> datetime: ...
    @property
    def samples(self) -> Sequence[RankRow]: ...


@dataclass(frozen=True, slots=True, eq=False)
class StepFrame:
    """One step of one job, one row per reporting rank, sorted by rank.

    ``node_idx`` indexes ``nodes``. ``loss``/``grad_norm`` hold NaN both where a rank did
    not report them and where the value was NaN; ``has_loss`` and ``has_grad_norm`` tell
    the two apart (a reported NaN is a divergence signal).

    The optional columns (:data:`~schemas.telemetry.OPTIONAL_FIELDS`: the work, and
    whatever the schema adds) are None when no rank said it, else float64, NaN for the
    ranks that did not; those not declared here are in ``extra`` (:meth:`column`).
    """

    job_id: str
    step: int
    ts: float  #: event time of the step end, epoch seconds
    nodes: tuple[str, ...]
    rank: I64
    node_idx: I32
    local_rank: I32
    dp_group: I32
    pp_stage: I32
    tp_group: I32
    phase: I8
    step_time: F64
    compute: F64
    comm_wait: F64
    data_wait: F64
    loss: F64
    grad_norm: F64
    has_loss: B
    has_grad_norm: B
    ts_start: float = field(default=0.0)
    tokens: F64 | None = None
    flops: F64 | None = None
    max_seq_len: F64 | None = None
    extra: dict[str, F64 | None] = field(default_factory=dict)

    def column(self, name: str) -> F64 | None:
        """An optional column (:data:`~schemas.telemetry.OPTIONAL_FIELDS`) by its name.

        >>> StepFrame.from_arrays("j", 0, 1.0, [1.0], tokens=[8.0]).column("tokens")
        array([8.])
        """
        if name in self.extra:
            return self.extra[name]
        if name not in OPTIONAL_FIELDS:
            raise KeyError(name)
        return getattr(self, name)  # type: ignore[no-any-return]

    @property
    def n_ranks(self) -> int:
        return int(self.rank.shape[0])

    def node_of_rank(self, rank: int) -> str:
        i = int(np.searchsorted(self.rank, rank))
        if i >= self.n_ranks or int(self.rank[i]) != rank:
            raise KeyError(rank)
        return self.nodes[int(self.node_idx[i])]

    @classmethod
    def from_messages(cls, messages: Sequence[NodeStep]) -> StepFrame:
        """Merge the per-node messages of one step (same job and step) into a frame.

        Every sample becomes a tuple (:data:`ROW_FIELDS`, in C where the message has
        ``rows()``), the tuples are transposed at once and each column converted by
        numpy: per-rank Python work is what bounds a frame at 1k-16k ranks a step. A
        message with ``frame_columns()`` (a columnar message, StepTelemetry version 3)
        gives its columns as arrays instead, and the frame concatenates them; spans of
        a fetch's column blocks (:mod:`detectors.framing`) are taken once per block.
        """
        if not messages:
            raise ValueError("messages must not be empty")
        job_id, step = messages[0].job_id, messages[0].step
        if getattr(messages[0], "block", None) is not None:  # spans of column blocks
            from detectors.framing import gathered  # built on this module

            spans = gathered(messages)
            if spans is not None:
                if any(m.job_id != job_id or m.step != step for m in messages):
                    raise ValueError("messages mix jobs or steps")
                ts, start = step_times([m.ts_end.timestamp() for m in messages],
                                       [m.ts_start.timestamp() for m in messages])  # fmt: skip
                said = optional_columns({w: spans.pop(w) for w in OPTIONAL_FIELDS})
                return cls(job_id=job_id, step=step, ts=ts, ts_start=start, **spans, **said)
        nodes: list[str] = []
        node_pos: dict[str, int] = {}
        rows: list[tuple[object, ...]] = []
        where: list[int] = []  # each row's position in ``nodes``
        ends: list[float] = []
        starts: list[float] = []

        def pos(node: str) -> int:
            p = node_pos.get(node)
            if p is None:
                p = node_pos[node] = len(nodes)
                nodes.append(node)
            return p

        parts: list[dict[str, Any]] = []  # in message order, with columnar messages
        for m in messages:
            if m.job_id != job_id or m.step != step:
                raise ValueError("messages mix jobs or steps")
            ends.append(m.ts_end.timestamp())
            starts.append(m.ts_start.timestamp())
            arrays = m.frame_columns() if hasattr(m, "frame_columns") else None
            if arrays is not None:  # None: the message has rows after all (a small one)
                if rows:
                    parts.append(_row_part(rows, where))
                    rows, where = [], []
                parts.append(_column_part(arrays, m, pos))
                continue
            packed = m.rows() if hasattr(m, "rows") else list(map(_ROW, m.samples))
            if not packed:
                continue
            rows += packed
            if packed[0][-1] is None:  # a node's own message: every rank is the node's
                where += [pos(m.node)] * len(packed)
            else:  # a rack's message (StepTelemetry version 2): every sample names its node
                where += [pos(r[-1] or m.node) for r in packed]
        if parts:
            if rows:
                parts.append(_row_part(rows, where))
            return cls._from_parts(job_id, step, step_times(ends, starts), nodes, parts)
        n = len(rows)
        cols = list(zip(*rows, strict=True)) if n else [()] * len(ROW_FIELDS)
        rank = np.array(cols[0], dtype=np.int64)
        keep: I64 | None = None  # the rows in rank order, when they are not already
        if n > 1 and not bool((rank[1:] > rank[:-1]).all()):
            keep = np.argsort(rank, kind="stable")
            ranked = rank[keep]
            first = np.concatenate([[True], ranked[1:] != ranked[:-1]])
            if not first.all():
                # a rank sent twice in one step (its node's own message and its rack's,
                # while a job moves between the two): the first message's sample counts
                keep = keep[first]
            rank = rank[keep]

        def take(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
            return a if keep is None else a[keep]

        def column(values: Sequence[object], dtype: type) -> npt.NDArray[Any]:
            return take(np.array(values, dtype=dtype))

        phases = cols[_AT["phase"]]
        if phases.count(Phase.TRAIN) == n:
            phase = np.full(rank.shape[0], PHASE_CODES[Phase.TRAIN], dtype=np.int8)
        else:
            phase = column([PHASE_CODES[p] for p in phases], np.int8)
        loss, has_loss = map(take, _signal(cols[_AT["loss"]]))
        grad_norm, has_grad_norm = map(take, _signal(cols[_AT["grad_norm"]]))
        said = optional_columns({w: _work(cols[_AT[w]], take) for w in OPTIONAL_FIELDS})
        ts, ts_start = step_times(ends, starts)
        return cls(
            job_id=job_id,
            step=step,
            ts=ts,
            ts_start=ts_start,
            nodes=tuple(nodes),
            rank=rank,
            node_idx=column(where, np.int32),
            local_rank=column(cols[_AT["local_rank"]], np.int32),
            dp_group=column(cols[_AT["dp_group"]], np.int32),
            pp_stage=column(cols[_AT["pp_stage"]], np.int32),
            tp_group=column(cols[_AT["tp_group"]], np.int32),
            phase=phase,
            step_time=column(cols[_AT["step_time_s"]], np.float64),
            compute=column(cols[_AT["compute_s"]], np.float64),
            comm_wait=column(cols[_AT["comm_wait_s"]], np.float64),
            data_wait=column(cols[_AT["data_wait_s"]], np.float64),
            loss=loss,
            grad_norm=grad_norm,
            has_loss=has_loss,
            has_grad_norm=has_grad_norm,
            **said,
        )

    @classmethod
    def _from_parts(
        cls, job_id: str, step: int, times: tuple[float, float], nodes: list[str],
        parts: list[dict[str, Any]],
    ) -> StepFrame:  # fmt: skip
        """A frame of column parts (:func:`_row_part`, :func:`_column_part`)."""
        cols: dict[str, Any] = {}
        for name in parts[0]:
            if name in OPTIONAL_FIELDS:
                said = [p[name] for p in parts if p.get(name) is not None]
                if not said:
                    cols[name] = None
                    continue
                values = [
                    p[name] if p.get(name) is not None else np.full(p["rank"].shape[0], np.nan)
                    for p in parts
                ]  # fmt: skip
            else:
                values = [p[name] for p in parts]
            cols[name] = np.concatenate(values) if len(values) > 1 else np.array(values[0])
        rank = cols["rank"]
        n = rank.shape[0]
        if n > 1 and not bool((rank[1:] > rank[:-1]).all()):
            keep = np.argsort(rank, kind="stable")
            ranked = rank[keep]
            keep = keep[np.concatenate([[True], ranked[1:] != ranked[:-1]])]  # first counts
            cols = {k: None if v is None else v[keep] for k, v in cols.items()}
        optional = optional_columns({w: cols.pop(w, None) for w in OPTIONAL_FIELDS})
        return cls(job_id=job_id, step=step, ts=times[0], ts_start=times[1],
                   nodes=tuple(nodes), **cols, **optional)  # fmt: skip

    @classmethod
    def from_arrays(
        cls,
        job_id: str,
        step: int,
        ts: float,
        compute: npt.ArrayLike,
        comm_wait: npt.ArrayLike | None = None,
        data_wait: npt.ArrayLike | None = None,
        *,
        ranks_per_node: int = 8,
        rank: npt.ArrayLike | None = None,
        pp_stage: npt.ArrayLike | None = None,
        dp_group: npt.ArrayLike | None = None,
        phase: Phase | npt.ArrayLike = Phase.TRAIN,
        loss: npt.ArrayLike | None = None,
        grad_norm: npt.ArrayLike | None = None,
        step_time: npt.ArrayLike | None = None,
        node_names: Sequence[str] | None = None,
        **optional: npt.ArrayLike | None,
    ) -> StepFrame:
        """Build a frame straight from arrays (tests, benchmarks, simulators).

        Ranks default to ``0..n-1``, node ``k`` hosting ranks
        ``k * ranks_per_node ...``, named ``node-k`` unless ``node_names`` is given;
        ``comm_wait``/``data_wait`` default to zero and ``step_time`` to the largest
        ``compute + comm_wait + data_wait``. NaN in ``loss``/``grad_norm`` means "not
        reported" here; use :meth:`from_messages` to carry reported NaNs. The optional
        columns (``tokens``, ``flops``, ``max_seq_len``, any of
        :data:`~schemas.telemetry.OPTIONAL_FIELDS`, by name) stay None unless given
        (NaN in them: that rank did not say).

        >>> f = StepFrame.from_arrays("j", 0, 1.0, [1.0, 1.1, 1.0], ranks_per_node=2)
        >>> f.nodes, f.node_of_rank(2), float(f.step_time[0])
        (('node-0', 'node-1'), 'node-1', 1.1)
        """
        c = np.asarray(compute, dtype=np.float64)
        n = int(c.shape[0])
        unknown = set(optional) - set(OPTIONAL_FIELDS)
        if unknown:
            raise TypeError(f"from_arrays: unknown columns {sorted(unknown)}")
        if ranks_per_node < 1:
            raise ValueError(f"ranks_per_node must be >= 1, got {ranks_per_node!r}")
        zeros = np.zeros(n)
        comm = zeros if comm_wait is None else np.asarray(comm_wait, dtype=np.float64)
        data = zeros if data_wait is None else np.asarray(data_wait, dtype=np.float64)
        r = np.arange(n, dtype=np.int64) if rank is None else np.asarray(rank, dtype=np.int64)
        order = np.argsort(r, kind="stable")
        r = r[order]
        pos = np.arange(n, dtype=np.int64)
        node_of_pos = (pos // ranks_per_node).astype(np.int32)
        local = (pos % ranks_per_node).astype(np.int32)
        n_nodes = int(node_of_pos.max()) + 1 if n else 0
        names = (
            tuple(node_names)
            if node_names is not None
            else tuple(f"node-{k}" for k in range(n_nodes))
        )
        if len(names) < n_nodes:
            raise ValueError(f"node_names must name {n_nodes} nodes, got {len(names)}")

        def col(
            a: npt.ArrayLike | None, dtype: type[np.generic], fill: float
        ) -> npt.NDArray[np.generic]:
            if a is None:
                return np.full(n, fill, dtype=dtype)
            return np.asarray(a, dtype=dtype)[order]

        if isinstance(phase, Phase):
            ph: I8 = np.full(n, PHASE_CODES[phase], dtype=np.int8)
        else:
            ph = np.asarray(phase, dtype=np.int8)[order]
        loss_a = col(loss, np.float64, np.nan).astype(np.float64)
        grad_a = col(grad_norm, np.float64, np.nan).astype(np.float64)
        c, comm, data = c[order], comm[order], data[order]
        if step_time is None:
            total = c + comm + data
            st = np.full(n, float(total.max()) if n else 0.0)
        else:
            st = np.asarray(step_time, dtype=np.float64)[order]
        return cls(
            job_id=job_id,
            step=step,
            ts=float(ts),
            ts_start=float(ts) - (float(st.max()) if n else 0.0),
            nodes=names[:n_nodes] if node_names is None else names,
            rank=r,
            node_idx=node_of_pos,
            local_rank=local,
            dp_group=col(dp_group, np.int32, 0).astype(np.int32),
            pp_stage=col(pp_stage, np.int32, 0).astype(np.int32),
            tp_group=np.zeros(n, dtype=np.int32),
            phase=ph,
            step_time=st,
            compute=c,
            comm_wait=comm,
            data_wait=data,
            loss=loss_a,
            grad_norm=grad_a,
            has_loss=~np.isnan(loss_a),
            has_grad_norm=~np.isnan(grad_a),
            **optional_columns({
                w: None if a is None else col(a, np.float64, np.nan).astype(np.float64)
                for w, a in optional.items()
            }),
        )  # fmt: skip

    def to_messages(self) -> list[StepTelemetry]:
        """Split the frame back into one StepTelemetry per node (publishing side)."""
        end = datetime.fromtimestamp(self.ts, UTC)
        start = datetime.fromtimestamp(min(self.ts_start or self.ts, self.ts), UTC)
        out: list[StepTelemetry] = []
        for ni, node in enumerate(self.nodes):
            idx = np.flatnonzero(self.node_idx == ni)
            if idx.size == 0:
                continue
            samples = tuple(
                RankSample(
                    rank=int(self.rank[i]),
                    local_rank=int(self.local_rank[i]),
                    dp_group=int(self.dp_group[i]),
                    pp_stage=int(self.pp_stage[i]),
                    tp_group=int(self.tp_group[i]),
                    phase=PHASES[int(self.phase[i])],
                    step_time_s=float(self.step_time[i]),
                    compute_s=float(self.compute[i]),
                    comm_wait_s=float(self.comm_wait[i]),
                    data_wait_s=float(self.data_wait[i]),
                    loss=float(self.loss[i]) if self.has_loss[i] else None,
                    grad_norm=float(self.grad_norm[i]) if self.has_grad_norm[i] else None,
                    **{
                        w: _said(self.column(w), int(i), int if FIELDS[w].integral else float)
                        for w in OPTIONAL_FIELDS
                    },
                )
                for i in idx
            )
            out.append(
                StepTelemetry(
                    job_id=self.job_id,
                    node=node,
                    step=self.step,
                    ts_start=start,
                    ts_end=end,
                    samples=samples,
                )
            )
        return out


def _row_part(rows: list[tuple[object, ...]], where: list[int]) -> dict[str, Any]:
    """The frame's columns of rows (:data:`ROW_FIELDS` tuples) whose nodes are ``where``."""
    cols = dict(zip(ROW_FIELDS, zip(*rows, strict=True), strict=True))
    loss, has_loss = _signal(cols["loss"])
    grad_norm, has_grad_norm = _signal(cols["grad_norm"])
    keep = lambda a: a  # noqa: E731 - the rows stay in their order here
    return {
        "rank": np.array(cols["rank"], dtype=np.int64),
        "node_idx": np.array(where, dtype=np.int32),
        "local_rank": np.array(cols["local_rank"], dtype=np.int32),
        "dp_group": np.array(cols["dp_group"], dtype=np.int32),
        "pp_stage": np.array(cols["pp_stage"], dtype=np.int32),
        "tp_group": np.array(cols["tp_group"], dtype=np.int32),
        "phase": np.array([PHASE_CODES[p] for p in cols["phase"]], dtype=np.int8),
        "step_time": np.array(cols["step_time_s"], dtype=np.float64),
        "compute": np.array(cols["compute_s"], dtype=np.float64),
        "comm_wait": np.array(cols["comm_wait_s"], dtype=np.float64),
        "data_wait": np.array(cols["data_wait_s"], dtype=np.float64),
        "loss": loss, "has_loss": has_loss, "grad_norm": grad_norm,
        "has_grad_norm": has_grad_norm,
        **{w: _work(cols[w], keep) for w in OPTIONAL_FIELDS},
    }  # fmt: skip


def _column_part(arrays: dict[str, Any], m: Any, pos: Any) -> dict[str, Any]:
    """The frame's columns of a columnar message: its arrays, its nodes placed."""
    part = dict(arrays)
    idx, order = part["node_idx"], part.pop("node_order")
    if idx is None:  # a node's own message
        part["node_idx"] = np.full(part["rank"].shape[0], pos(m.node), dtype=np.int32)
    else:  # a rack's: its nodes placed in the order its samples first name them
        lut = np.zeros(len(m.nodes), dtype=np.int32)
        for k in order:
            lut[k] = pos(m.nodes[k])
        part["node_idx"] = lut[idx]
    return part


def _signal(values: Sequence[object]) -> tuple[F64, B]:
    """A float-or-None column: its values (NaN where None) and where it was reported
    (a reported NaN stays NaN, and reported)."""
    missing = values.count(None)
    if missing == 0:
        reported = np.ones(len(values), dtype=np.bool_)
    elif missing == len(values):
        reported = np.zeros(len(values), dtype=np.bool_)
    else:
        reported = np.array([v is not None for v in values], dtype=np.bool_)
    return np.array(values, dtype=np.float64), reported  # None becomes NaN


def _work(values: Sequence[object], take: Any) -> F64 | None:
    """A work column: None when no rank said it, else float64 with NaN where one did not."""
    if values.count(None) == len(values):
        return None
    return take(np.array(values, dtype=np.float64))  # type: ignore[no-any-return]


def optional_columns(columns: dict[str, F64 | None]) -> dict[str, Any]:
    """Optional columns (:data:`~schemas.telemetry.OPTIONAL_FIELDS`) as StepFrame's
    keywords: those it declares by name, the rest in ``extra``.

    >>> sorted(optional_columns({"tokens": None, "queue_s": None}))
    ['extra', 'tokens']
    """
    out: dict[str, Any] = {k: v for k, v in columns.items() if k in _DECLARED}
    extra = {k: v for k, v in columns.items() if k not in _DECLARED}
    if extra:
        out["extra"] = extra
    return out


_DECLARED = frozenset(StepFrame.__dataclass_fields__)


def _said(column: F64 | None, i: int, kind: type[Any]) -> Any:
    """Rank ``i``'s value in a work column, None where it did not say."""
    if column is None or np.isnan(column[i]):
        return None
    return kind(column[i])
