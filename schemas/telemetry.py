"""Telemetry published by training ranks (StepTelemetry) and node agents (NodeHealth).

One StepTelemetry message carries every rank of one node for one step: a Faust worker
handles ~13k messages/s, so batching ranks per node is what makes cluster scale work.
Version 2 lets one message carry several nodes (a rack aggregator's): each sample then
names its own ``node``, and the message's ``node`` names the sender (the rack), whose
silence is what a lost aggregator looks like (its nodes' ranks go missing). Node-level
(version 1) and rack-level (version 2) senders mix freely in one job. Version 3 carries
the samples as columns (:class:`~schemas.columnar.SampleColumns`: one typed array per
field), for a node's or a rack's message alike; it mixes with the others too.

Examples
--------
>>> from datetime import datetime, timezone
>>> t = datetime(2026, 1, 1, tzinfo=timezone.utc)
>>> sample = RankSample(rank=0, local_rank=0, step_time_s=0.5, compute_s=0.4,
...                     comm_wait_s=0.08, data_wait_s=0.02)
>>> msg = StepTelemetry(job_id="j1", node="n0", step=10, ts_start=t, ts_end=t,
...                     samples=(sample,))
>>> msg.samples[0].phase
<Phase.TRAIN: 'train'>
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import AwareDatetime, Field, NonNegativeFloat, NonNegativeInt, model_validator

from schemas._base import Message
from schemas.columnar import SampleColumns, samples_of
from schemas.sample import (
    FIELDS,
    INT_FIELDS,
    MAX_COUNTER,
    MAX_FLOPS,
    MAX_GPUS_PER_NODE,
    MAX_GROUP_ID,
    MAX_LOCAL_RANK,
    MAX_RANKS_PER_JOB,
    MAX_STEP,
    MAX_STEP_SECONDS,
    MAX_TOKENS,
    OPTIONAL_FIELDS,
    SAMPLE_FIELDS,
    SIGNAL_FIELDS,
    TIME_FIELDS,
    Phase,
    RankSample,
    SampleField,
)

__all__ = [
    "FIELDS",
    "INT_FIELDS",
    "MAX_COUNTER",
    "MAX_GPUS_PER_NODE",
    "MAX_GROUP_ID",
    "MAX_LOCAL_RANK",
    "MAX_RANKS_PER_JOB",
    "MAX_STEP",
    "MAX_STEP_SECONDS",
    "MAX_TOKENS",
    "MAX_FLOPS",
    "OPTIONAL_FIELDS",
    "SAMPLE_FIELDS",
    "SIGNAL_FIELDS",
    "TIME_FIELDS",
    "GpuHealth",
    "NodeHealth",
    "Phase",
    "RankSample",
    "SampleField",
    "StepTelemetry",
]


class _Unsent(tuple):  # type: ignore[type-arg]
    """A version-3 message's samples: held for its readers, never serialised (its
    ``columns`` travel instead)."""

    __slots__ = ()


class StepTelemetry(Message):
    """Every rank of one node, or of one rack's nodes, for one step of one job (topic
    key: job id).

    Version 1: ``node`` is the node of every sample. Version 2 (a rack aggregator):
    ``node`` is the sender and every sample names its node; a sample's ``node`` in a
    version-1 message is an error (an older worker would file its rank under the
    sender). Version 3: the samples travel as ``columns`` (node or rack alike: the
    columns' ``nodes`` name each sample's node in a rack's message); validating one
    materialises ``samples`` (so every reader of ``samples`` works), building one from
    ``samples`` packs its ``columns``, and its JSON carries the columns only.

    >>> from datetime import UTC, datetime
    >>> t = datetime(2026, 1, 1, tzinfo=UTC)
    >>> s = [RankSample(rank=r, local_rank=0, node=f"n{r}", step_time_s=1, compute_s=1,
    ...                 comm_wait_s=0, data_wait_s=0) for r in range(2)]
    >>> m = StepTelemetry(schema_version=2, job_id="j", node="rack-0", step=1,
    ...                   ts_start=t, ts_end=t, samples=tuple(s))
    >>> [x.node for x in m.samples]
    ['n0', 'n1']
    """

    kind_name = "step_telemetry"
    schema_version: Literal[1, 2, 3] = 1
    job_id: str = Field(min_length=1, max_length=256)
    node: str = Field(
        min_length=1, max_length=256,
        description="The node of every sample (version 1), or the sender: the rack "
        "aggregator (version 2).",
    )  # fmt: skip
    step: NonNegativeInt = Field(le=MAX_STEP)
    ts_start: AwareDatetime = Field(description="Event time the step started (rank clock).")
    ts_end: AwareDatetime = Field(description="Event time the step ended (rank clock).")
    samples: tuple[RankSample, ...] = Field(
        default=(),
        exclude_if=lambda v: type(v) is _Unsent,  # version 3 sends its columns instead
        description="Versions 1 and 2: the samples (at least one). Version 3 sends "
        "``columns`` instead (its model holds both).",
    )
    columns: SampleColumns | None = Field(
        default=None,
        exclude_if=lambda v: v is None,
        description="Version 3: the samples as one typed array per field.",
    )
    run: str = Field(
        default="",
        max_length=256,
        description="Run or attempt id (e.g. the scheduler's job id and restart count): "
        "a relaunched job's steps are kept apart from the abandoned run's.",
    )

    @model_validator(mode="after")
    def _check_order(self) -> StepTelemetry:
        if self.schema_version == 3:
            self._columnar()
        elif self.columns is not None:
            raise ValueError("columns are StepTelemetry version 3")
        if not self.samples:
            raise ValueError("samples: at least one")
        if self.ts_end < self.ts_start:
            raise ValueError("ts_end is before ts_start")
        ranks = [s.rank for s in self.samples]
        if len(set(ranks)) != len(ranks):
            raise ValueError("duplicate rank in samples")
        named = sum(s.node is not None for s in self.samples)
        if self.schema_version == 1 and named:
            raise ValueError("a sample names its node: that is StepTelemetry version 2")
        if self.schema_version == 2 and named != len(self.samples):
            raise ValueError("StepTelemetry version 2: every sample names its node")
        return self

    def _columnar(self) -> None:
        """Version 3: pack the samples given, or materialise the columns given."""
        if self.columns is None:
            if not self.samples:
                raise ValueError("StepTelemetry version 3: columns or samples")
            object.__setattr__(self, "columns", SampleColumns.of(self.samples))
            object.__setattr__(self, "samples", _Unsent(self.samples))
        elif self.samples:
            raise ValueError("StepTelemetry version 3 carries columns, not samples too")
        else:
            samples = _Unsent(RankSample(**row) for row in samples_of(self.columns))
            object.__setattr__(self, "samples", samples)


class GpuHealth(Message):
    """One GPU's readings; ECC and link counters are cumulative since boot.

    The link and memory-repair fields came with NodeHealth version 2; a version-1
    report reads with their defaults (PCIe unknown, no NVLink link down, no row
    remapping pending or failed).
    """

    index: NonNegativeInt = Field(lt=MAX_GPUS_PER_NODE)
    temperature_c: float = Field(ge=-50, le=200)
    power_w: NonNegativeFloat = Field(le=100_000)
    sm_clock_mhz: NonNegativeFloat = Field(le=100_000)
    utilization_pct: float = Field(ge=0, le=100)
    ecc_corrected: NonNegativeInt = Field(default=0, le=MAX_COUNTER)
    ecc_uncorrected: NonNegativeInt = Field(default=0, le=MAX_COUNTER)
    xid_codes: tuple[Annotated[NonNegativeInt, Field(le=(1 << 32) - 1)], ...] = Field(
        default=(), max_length=64, description="XID events seen since the previous report."
    )
    throttle_reasons: tuple[str, ...] = Field(
        default=(),
        max_length=32,
        description="Active clock-event (throttle) reasons, e.g. 'sw_power_cap', "
        "'hw_slowdown', 'sw_thermal_slowdown', 'hw_thermal_slowdown'.",
    )
    nvlink_errors: NonNegativeInt = Field(
        default=0, le=MAX_COUNTER, description="NVLink replay + recovery + CRC errors, cumulative."
    )
    nvlink_crc_errors: NonNegativeInt = Field(
        default=0, le=MAX_COUNTER, description="NVLink CRC (flit and data) errors, cumulative."
    )
    nvlink_replay_errors: NonNegativeInt = Field(
        default=0, le=MAX_COUNTER, description="NVLink replay errors, cumulative."
    )
    nvlink_links_down: NonNegativeInt = Field(
        default=0, le=64, description="NVLink links the GPU has that are not active."
    )
    pcie_gen: NonNegativeInt | None = Field(
        default=None, le=16, description="Current PCIe link generation (None: unknown)."
    )
    pcie_gen_max: NonNegativeInt | None = Field(
        default=None, le=16, description="Highest PCIe generation this GPU and slot support."
    )
    pcie_width: NonNegativeInt | None = Field(
        default=None, le=64, description="Current PCIe link width in lanes (None: unknown)."
    )
    pcie_width_max: NonNegativeInt | None = Field(
        default=None, le=64, description="Widest PCIe link this GPU and slot support."
    )
    remap_pending: bool = Field(
        default=False, description="A memory row remap waits for a GPU reset."
    )
    remap_failed: bool = Field(
        default=False, description="A memory row remap failed (no spare rows left)."
    )


class NodeHealth(Message):
    """One node's hardware readings for one interval (topic key: node).

    Version 2 added the PCIe, NVLink link and row-remapping fields of
    :class:`GpuHealth` (all optional); a version-1 report still decodes, with its
    ``schema_version`` 1 kept.
    """

    kind_name = "node_health"
    schema_version: Literal[1, 2] = 2
    job_id: str | None = Field(default=None, max_length=256)
    node: str = Field(min_length=1, max_length=256)
    ts: AwareDatetime
    interval_s: float = Field(gt=0, le=86400.0, default=10.0)
    gpus: tuple[GpuHealth, ...] = Field(default=(), max_length=MAX_GPUS_PER_NODE)
    nic_errors: NonNegativeInt = Field(default=0, le=MAX_COUNTER)
    nic_retransmits: NonNegativeInt = Field(default=0, le=MAX_COUNTER)
