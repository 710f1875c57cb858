"""The columns of a StepTelemetry version 3: one typed array per sample field.

A version-3 message carries its samples as :class:`SampleColumns`: each field one
little-endian array, base64 text (standard alphabet, padded) in the JSON envelope, so a
consumer turns a field into a numpy array in one call (``np.frombuffer``) and pydantic
still reads the message as JSON (``schemas.decode``, JSONL replay, dead letters as
text). The dtype of every column is fixed here (:data:`COLUMNS`), not sent.

=================  ========  =====================================================
column             dtype     meaning
=================  ========  =====================================================
rank, local_rank   ``<i4``   as RankSample's
dp_group ...       ``<i4``   ``dp_group``, ``pp_stage``, ``tp_group``
phase              ``u1``    :data:`PHASES` index: 0 warmup, 1 train, 2 eval, 3 ckpt
step_time_s ...    ``<f8``   ``step_time_s``, ``compute_s``, ``comm_wait_s``,
                             ``data_wait_s``: finite, in the schema's range
loss, grad_norm    ``<f8``   optional (absent: every sample's is null); NaN/Inf kept
loss_null ...      ``u1``    optional, 1 where the value is null (absent: none is);
                             ``loss_null``, ``grad_norm_null``: the value there is
                             ignored
tokens, flops,     ``<f8``   optional (absent: no sample said); NaN where a sample
max_seq_len                  did not say (said work is never NaN: the schema bounds
                             it); ``tokens``/``max_seq_len`` integral
node_idx           ``<i4``   with ``nodes`` (a rack's message): each sample's node,
                             an index into ``nodes``; absent: the message's node
=================  ========  =====================================================

Every array holds ``n`` values; the values obey :class:`~schemas.RankSample`'s
bounds, checked when the message is validated (the samples are materialised then).

>>> c = SampleColumns.of([dict(rank=3, local_rank=1, step_time_s=1.0, compute_s=0.5,
...                            comm_wait_s=0.5, data_wait_s=0.0, loss=2.0)])
>>> c.n, c.rank, c.loss_null is None
(1, 'AwAAAA==', True)
>>> samples_of(c)[0]["rank"], samples_of(c)[0]["loss"], samples_of(c)[0]["grad_norm"]
(3, 2.0, None)
"""

from __future__ import annotations

import base64
import binascii
import math
import sys
from array import array
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from pydantic import Field, create_model, model_validator

from schemas._base import Message
from schemas.sample import FIELDS, OPTIONAL_FIELDS, SAMPLE_FIELDS, SIGNAL_FIELDS, Phase

__all__ = ["COLUMNS", "MAX_COLUMN_SAMPLES", "PHASES", "SampleColumns", "samples_of"]

_TYPECODE: Final = {"<i4": "i", "u1": "B", "<f8": "d"}
#: column -> (numpy dtype, ``array`` typecode); little-endian on the wire. One column per
#: RankSample field (:data:`~schemas.sample.FIELDS`), a signal's null mask after it, and
#: ``node_idx`` for ``node``.
COLUMNS: Final[dict[str, tuple[str, str]]] = {}
for _f in FIELDS.values():
    _name = "node_idx" if _f.kind == "node" else _f.name
    COLUMNS[_name] = (_f.dtype, _TYPECODE[_f.dtype])
    if _f.kind == "signal":
        COLUMNS[f"{_f.name}_null"] = ("u1", "B")
assert array("i").itemsize == 4 and array("d").itemsize == 8  # the platform's
#: The phase of code ``i`` is ``PHASES[i]`` (the steps table's Enum8 order).
PHASES: Final[tuple[str, ...]] = tuple(p.value for p in Phase)
#: Samples one message's columns may hold (a rack of 64 nodes of 64 GPUs, and then some).
MAX_COLUMN_SAMPLES: Final = 1 << 16
_B64 = r"^[A-Za-z0-9+/]*={0,2}$"
#: The columns every message has (the rest are absent where no sample says them).
_ALWAYS: Final = tuple(n for n, f in FIELDS.items() if f.kind in ("int", "phase", "time"))


def _col(required: bool, what: str) -> Any:
    top = 12 * MAX_COLUMN_SAMPLES  # base64 of the widest column's bytes, and some
    if required:
        return Field(description=what, pattern=_B64, max_length=top)
    return Field(
        default=None, exclude_if=lambda v: v is None, description=what, pattern=_B64,
        max_length=top,
    )  # fmt: skip


def _column_fields() -> dict[str, Any]:
    """SampleColumns' fields, in the order they travel: ``n``, a column per sample
    field (the schema's order), ``nodes``."""
    codes = ", ".join(f"{i} {p}" for i, p in enumerate(PHASES))
    null = (str | None, _col(False, "u1, 1: null (absent: none is)"))
    out: dict[str, Any] = {
        "n": (int, Field(ge=1, le=MAX_COLUMN_SAMPLES, description="Samples: each array's length.")),
    }
    for name, f in FIELDS.items():
        if f.kind in ("int", "time"):
            out[name] = (str, _col(True, f.dtype))
        elif f.kind == "phase":
            out[name] = (str, _col(True, f"u1: {codes}"))
        elif f.kind == "signal":
            out[name] = (str | None, _col(False, f"<f8; absent: every sample's {name} is null"))
            out[f"{name}_null"] = null
        elif f.kind == "optional":
            out[name] = (str | None, _col(False, "<f8, NaN: not said (absent: no sample said)"))
        else:
            out["node_idx"] = (str | None, _col(False, "<i4: index into nodes (a rack's message)"))
    out["nodes"] = (
        tuple[str, ...] | None,
        Field(
            default=None,
            min_length=1,
            max_length=MAX_COLUMN_SAMPLES,
            exclude_if=lambda v: v is None,
            description="A rack's message: the nodes its samples ran on (node_idx indexes it).",
        ),
    )
    return out


class _Columns(Message):
    """A version-3 message's samples, one base64 array per field (module docstring)."""

    if TYPE_CHECKING:  # the columns (fields of the model create_model makes below)

        def __getattr__(self, name: str) -> Any: ...

    @model_validator(mode="after")
    def _check_shape(self) -> _Columns:
        for name in COLUMNS:
            if getattr(self, name) is not None:
                _decoded(self, name)  # the length and the base64: ValueError naming it
        for signal in SIGNAL_FIELDS:
            if getattr(self, f"{signal}_null") is not None and getattr(self, signal) is None:
                raise ValueError(f"{signal}_null without {signal}")
        if (self.nodes is None) != (getattr(self, "node_idx") is None):  # noqa: B009
            raise ValueError("nodes and node_idx come together")
        if self.nodes is not None and not all(0 < len(x) <= 256 for x in self.nodes):
            raise ValueError("a node name is 1 to 256 characters")
        return self

    @classmethod
    def of(cls, samples: Sequence[Mapping[str, Any] | Any]) -> SampleColumns:
        """Columns of samples (RankSamples, or mappings of their fields): every sample
        names its node, or none does."""
        rows = [s if isinstance(s, Mapping) else _fields(s) for s in samples]
        if not rows:
            raise ValueError("no samples")
        out: dict[str, Any] = {"n": len(rows)}
        for name, f in FIELDS.items():
            if f.kind in ("int", "time"):
                req = f.default is ...
                out[name] = _pack(name, [r[name] if req else r.get(name, f.default) for r in rows])
        out["phase"] = _pack("phase", [PHASES.index(str(r.get("phase", "train"))) for r in rows])
        for name in SIGNAL_FIELDS:
            values = [r.get(name) for r in rows]
            nulls = [v is None for v in values]
            if not all(nulls):
                out[name] = _pack(name, [math.nan if v is None else v for v in values])
                if any(nulls):
                    out[f"{name}_null"] = _pack(f"{name}_null", [int(x) for x in nulls])
        for name in OPTIONAL_FIELDS:
            values = [r.get(name) for r in rows]
            if any(v is not None for v in values):
                out[name] = _pack(name, [math.nan if v is None else v for v in values])
        named = [r.get("node") for r in rows]
        if any(x is not None for x in named):
            if any(x is None for x in named):
                raise ValueError("some samples name their node and some do not")
            nodes = list(dict.fromkeys(named))
            where = {x: i for i, x in enumerate(nodes)}
            out["nodes"] = tuple(nodes)
            out["node_idx"] = _pack("node_idx", [where[x] for x in named])
        return cls(**out)


if TYPE_CHECKING:
    SampleColumns = _Columns
else:
    SampleColumns = create_model(
        "SampleColumns", __base__=_Columns, __module__=__name__, __doc__=_Columns.__doc__,
        **_column_fields(),
    )  # fmt: skip


def samples_of(columns: SampleColumns) -> list[dict[str, Any]]:
    """The samples as dicts of RankSample fields (validated by RankSample, not here):
    NaN work is not said, a masked signal is null."""
    n = columns.n
    cols = {name: _decoded(columns, name) for name in COLUMNS if getattr(columns, name) is not None}
    nulls = {s: cols.get(f"{s}_null", [0] * n) for s in SIGNAL_FIELDS}
    phases = [PHASES[p] if p < len(PHASES) else f"<phase code {p}>" for p in cols["phase"]]
    plain = tuple(n for n in _ALWAYS if n != "phase")
    out: list[dict[str, Any]] = []
    for i in range(n):
        row: dict[str, Any] = {name: cols[name][i] for name in plain}
        row["phase"] = phases[i]
        for s in SIGNAL_FIELDS:
            if s in cols and nulls[s][i] not in (0, 1):
                raise ValueError(f"{s}_null[{i}] is {nulls[s][i]}, not 0 or 1")
            row[s] = cols[s][i] if s in cols and not nulls[s][i] else None
        for w in OPTIONAL_FIELDS:
            v = cols[w][i] if w in cols else math.nan
            if not math.isnan(v):
                row[w] = int(v) if FIELDS[w].integral and v.is_integer() else v
        if columns.nodes is not None:
            k = cols["node_idx"][i]
            if not 0 <= k < len(columns.nodes):
                raise ValueError(f"node_idx[{i}] is {k}, not an index of nodes")
            row["node"] = columns.nodes[k]
        out.append(row)
    return out


def _fields(sample: Any) -> dict[str, Any]:
    return {k: getattr(sample, k) for k in SAMPLE_FIELDS}


def _pack(name: str, values: list[Any]) -> str:
    a = array(COLUMNS[name][1], values)
    if sys.byteorder == "big":  # pragma: no cover - every platform built for is little
        a.byteswap()
    return base64.b64encode(a.tobytes()).decode("ascii")


def _decoded(columns: _Columns, name: str) -> array[Any]:
    text = getattr(columns, name)
    try:
        raw = base64.b64decode(text, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"{name}: not base64 ({exc})") from None
    a: array[Any] = array(COLUMNS[name][1])
    if len(raw) != columns.n * a.itemsize:
        raise ValueError(
            f"{name}: {len(raw)} bytes, not {columns.n} values of {a.itemsize} bytes "
            f"({COLUMNS[name][0]})"
        )
    a.frombytes(raw)
    if sys.byteorder == "big":  # pragma: no cover
        a.byteswap()
    return a
