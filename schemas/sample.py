"""One rank's sample of a step (:class:`RankSample`), and the record's columns derived
from it: the one place a per-rank field is spelled.

:data:`SAMPLE_FIELDS` lists RankSample's fields in the schema's order, and
:data:`FIELDS` says for each what its readers need (its kind, whether it is integral,
its bounds, its wire dtype as a column); the groups (:data:`INT_FIELDS`,
:data:`TIME_FIELDS`, :data:`SIGNAL_FIELDS`, :data:`OPTIONAL_FIELDS`) are derived from
those facts, never typed again. The batcher, the fast decoders, the columnar encoding,
the frame, the archive's rows and the replay and calibration tools build their column
lists from these, so a new optional per-rank field is this schema, one SQL migration,
the producer that fills it and the detector that reads it
(``tests/unit/test_record_defined_once.py`` holds every reader to that).

>>> SAMPLE_FIELDS[:3], OPTIONAL_FIELDS
(('rank', 'local_rank', 'dp_group'), ('tokens', 'flops', 'max_seq_len'))
>>> FIELDS["rank"].high, FIELDS["flops"].integral, FIELDS["loss"].kind
(1048575, False, 'signal')
"""

from __future__ import annotations

import math
import types
import typing
from enum import Enum, StrEnum
from typing import Any, Final, Literal, NamedTuple

import annotated_types
from pydantic import Field, NonNegativeFloat, NonNegativeInt
from pydantic.fields import FieldInfo
from pydantic.types import AllowInfNan

from schemas._base import Message

__all__ = [
    "FIELDS",
    "INT_FIELDS",
    "MAX_COUNTER",
    "MAX_FLOPS",
    "MAX_GPUS_PER_NODE",
    "MAX_GROUP_ID",
    "MAX_LOCAL_RANK",
    "MAX_RANKS_PER_JOB",
    "MAX_STEP",
    "MAX_STEP_SECONDS",
    "MAX_TOKENS",
    "OPTIONAL_FIELDS",
    "Phase",
    "RankSample",
    "SAMPLE_FIELDS",
    "SIGNAL_FIELDS",
    "SampleField",
    "TIME_FIELDS",
]


class Phase(StrEnum):
    """What a step was doing; only TRAIN steps feed temporal baselines."""

    WARMUP = "warmup"
    TRAIN = "train"
    EVAL = "eval"
    CHECKPOINT = "checkpoint"


#: Ranks one job may number: rank ids are ``0 .. MAX_RANKS_PER_JOB - 1``, so whatever
#: is kept per rank has a bound however hostile a message is (about a million GPUs:
#: ten times the largest jobs run today).
MAX_RANKS_PER_JOB = 1 << 20
#: Every numeric field is bounded by what the code that keeps it stores, so no value a
#: topic carries can overflow a column of a frame or the archive (one ``pp_stage`` of
#: 2**31 raised OverflowError in the frame's int32 column and dropped the whole step).
#: Parallel-group ids (data, pipeline, tensor): int32 in the frames.
MAX_GROUP_ID = (1 << 31) - 1
#: A rank's index on its node: UInt16 in the archive.
MAX_LOCAL_RANK = (1 << 16) - 1
#: Step numbers: exact in a float64 (and so in any JSON reader), int64 in the frames.
MAX_STEP = (1 << 53) - 1
#: Cumulative counters (ECC, NVLink, NIC): int64 in the detectors, UInt64 in the archive.
MAX_COUNTER = (1 << 63) - 1
#: One step's timings, in seconds: about eleven days (a step that long is a hang, not a
#: step), so that sums and squares of them stay far from overflow.
MAX_STEP_SECONDS = 1e6
#: Tokens one rank processes in one step (and a sequence length): exact in a float64
#: (the frames keep work as float64, NaN where a rank did not say) and in UInt64.
MAX_TOKENS = (1 << 53) - 1
#: Floating-point operations one rank does in one step: a thousand exaFLOP, far past a
#: step of any GPU made, and finite in a float64 sum over a million ranks.
MAX_FLOPS = 1e21
#: GPUs one node reports: a node with more is not a node (the archive keeps UInt16).
MAX_GPUS_PER_NODE = 64


class RankSample(Message):
    """One rank's timings for one step, in seconds."""

    rank: NonNegativeInt = Field(lt=MAX_RANKS_PER_JOB)
    local_rank: NonNegativeInt = Field(le=MAX_LOCAL_RANK)
    dp_group: NonNegativeInt = Field(default=0, le=MAX_GROUP_ID)
    pp_stage: NonNegativeInt = Field(default=0, le=MAX_GROUP_ID)
    tp_group: NonNegativeInt = Field(default=0, le=MAX_GROUP_ID)
    phase: Phase = Phase.TRAIN
    step_time_s: NonNegativeFloat = Field(
        le=MAX_STEP_SECONDS, description="Wall time of the whole step."
    )
    compute_s: NonNegativeFloat = Field(
        le=MAX_STEP_SECONDS, description="Time spent in kernels/compute."
    )
    comm_wait_s: NonNegativeFloat = Field(
        le=MAX_STEP_SECONDS, description="Time blocked in collectives."
    )
    data_wait_s: NonNegativeFloat = Field(
        le=MAX_STEP_SECONDS, description="Time waiting for the data loader."
    )
    loss: float | None = Field(
        default=None,
        allow_inf_nan=True,
        description='Training loss; NaN/Inf are signals and travel as "NaN"/"Infinity".',
    )
    grad_norm: float | None = Field(
        default=None,
        allow_inf_nan=True,
        description='Global gradient norm; NaN/Inf travel as "NaN"/"Infinity".',
    )
    tokens: NonNegativeInt | None = Field(
        default=None,
        le=MAX_TOKENS,
        exclude_if=lambda v: v is None,  # a sample without work reads as it always did
        description="Work: the tokens this rank processed in this step (None: not said). "
        "Step time is read against it: a rank slow because it got more tokens is not "
        "a straggler.",
    )
    flops: NonNegativeFloat | None = Field(
        default=None,
        le=MAX_FLOPS,
        exclude_if=lambda v: v is None,
        description="Work: floating-point operations this rank did in this step (None: not said).",
    )
    max_seq_len: NonNegativeInt | None = Field(
        default=None,
        le=MAX_TOKENS,
        exclude_if=lambda v: v is None,
        description="Work: the longest sequence in this rank's batch (None: not said).",
    )
    node: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        exclude_if=lambda v: v is None,  # a version-1 sample's JSON stays as it was
        description="The node this rank ran on, in a rack-level message "
        "(StepTelemetry version 2); None: the message's node.",
    )

    @property
    def loss_is_finite(self) -> bool:
        return self.loss is None or math.isfinite(self.loss)


Kind = Literal["int", "phase", "time", "signal", "optional", "node"]
#: A column's dtype on the wire (StepTelemetry version 3), by kind; ``node``: its index.
_DTYPE: Final[dict[str, str]] = {
    "int": "<i4", "phase": "u1", "time": "<f8", "signal": "<f8", "optional": "<f8",
    "node": "<i4",
}  # fmt: skip


class SampleField(NamedTuple):
    """What the readers of one RankSample field need to know about it.

    ==========  ===============================================================
    kind        ``int`` (an integer, always there), ``phase`` (:class:`Phase`),
                ``time`` (a finite float, always there), ``signal`` (a float or
                null, NaN/Inf kept: loss, grad_norm), ``optional`` (a number or
                null: NaN where a rank did not say, in columns), ``node``
    integral    whether its values are integers (an ``optional`` one travels as
                float64 and is integral: ``tokens``)
    low, high   the schema's inclusive bounds (None: unbounded)
    dtype       its column's dtype on the wire (:mod:`schemas.columnar`)
    default     the schema's default (``...``: required)
    ==========  ===============================================================
    """

    name: str
    kind: Kind
    integral: bool
    low: float | None
    high: float | None
    dtype: str
    default: Any


def _bare(annotation: Any) -> tuple[Any, bool, list[Any]]:
    """A field's type without None and Annotated: (type, nullable, its metadata)."""
    nullable, meta = False, []
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(annotation))
        (annotation,) = args
    if typing.get_origin(annotation) is typing.Annotated:
        annotation, *meta = typing.get_args(annotation)
    return annotation, nullable, meta


def _fact(name: str, info: FieldInfo) -> SampleField:
    bare, nullable, meta = _bare(info.annotation)
    low: Any = None  # the bound's own type: an int's stays an int
    high: Any = None
    for m in [*meta, *info.metadata]:
        if isinstance(m, annotated_types.Ge):
            low = m.ge
        elif isinstance(m, annotated_types.Le):
            high = m.le
        elif isinstance(m, annotated_types.Lt):
            high = m.lt - 1 if bare is int else m.lt  # type: ignore[operator]
    inf_nan = any(isinstance(m, AllowInfNan) for m in info.metadata)
    kind: Kind
    if isinstance(bare, type) and issubclass(bare, Enum):
        kind = "phase"
    elif bare is str:
        kind = "node"
    elif nullable and inf_nan:
        kind = "signal"
    elif nullable:
        kind = "optional"
    else:
        kind = "int" if bare is int else "time"
    default = ... if info.is_required() else info.default
    return SampleField(name, kind, bare is int, low, high, _DTYPE[kind], default)


#: RankSample's fields, in the schema's order: the record, spelled once.
SAMPLE_FIELDS: Final[tuple[str, ...]] = tuple(RankSample.model_fields)
#: Each field's facts (:class:`SampleField`), by name.
FIELDS: Final[dict[str, SampleField]] = {
    n: _fact(n, f) for n, f in RankSample.model_fields.items()
}  # fmt: skip
#: The integer fields a sample always has (given or by default): ranks and group ids.
INT_FIELDS: Final = tuple(n for n, f in FIELDS.items() if f.kind == "int")
#: The timings a sample always has (finite floats, seconds).
TIME_FIELDS: Final = tuple(n for n, f in FIELDS.items() if f.kind == "time")
#: The float-or-null signals whose NaN/Inf is itself the signal (loss, grad_norm).
SIGNAL_FIELDS: Final = tuple(n for n, f in FIELDS.items() if f.kind == "signal")
#: The optional numbers a rank may say or not (the work it did, and whatever is added
#: next): None in a sample, NaN where a rank did not say in a column.
OPTIONAL_FIELDS: Final = tuple(n for n, f in FIELDS.items() if f.kind == "optional")
assert [f.kind for f in FIELDS.values()].count("node") == 1, "one node field: the sample's own"
