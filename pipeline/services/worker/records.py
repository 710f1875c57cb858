"""What the worker's core takes, keeps and returns: the record it is handed
(:class:`Record`), a job's state as stored in the changelog (:class:`JobState`,
versioned by :data:`STATE_LAYOUT`), the outcome of one record (:class:`Handled`,
:class:`Forward`), the topics it reads and the partition of a key."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, NamedTuple, TypeVar

from kafka.partitioner.default import murmur2

from detectors.job import Detected, JobDetection
from pipeline.io import statecodec
from pipeline.io.statecodec import StateFormatError
from pipeline.io.telemetry_auth import Headers
from schemas import (
    Alert,
    DeadLetter,
    Message,
    Rejected,
    decode,
)
from schemas.codec import MAX_MESSAGE_BYTES

_M = TypeVar("_M", bound=Message)

#: The worker's table read by job id: its snapshot or end mark, or None.
Load = Callable[[str], bytes | None]


def no_table(_job_id: str) -> bytes | None:
    """A :data:`Load` of an empty table (tests, benchmarks)."""
    return None


#: Version of the detectors' state layout inside a snapshot. Bump it when a detector's
#: fields change: older snapshots are then refused (and the job rebuilt from its
#: replayed records) instead of failing on the first step.
STATE_LAYOUT = 7  # 3: JobDetection keeps the job's members and lifecycle guard; 4: the
# suite keeps the group, replica, imbalance and drift detectors (issue 23); 5: the suite's
# classes are renamed (JobMonitor -> DetectorSuite, MonitorConfig -> DetectorConfig, in the
# snapshot by qualified name), its train-step detectors are one list (step_detectors) and
# the table is "job-states" (issue 21); 6: the step assembler keeps each pending step's
# earliest event time (it forces a step out on event time as well as on steps); 7: the
# waits detector keeps its recent steps and each rank's recent scores (issue 44)


def partition_for(key: str, n_partitions: int) -> int:
    """The partition Kafka's default (murmur2) partitioner picks for ``key``.

    Exporters key the steps topic by job with the default partitioner; records the
    worker re-keys to a job are sent to this partition explicitly, so both land in the
    partition whose owner holds the job's state.

    >>> partition_for("job-1", 8) == partition_for("job-1", 8)
    True
    """
    return (murmur2(key.encode()) & 0x7FFFFFFF) % n_partitions


@dataclass(frozen=True, slots=True)
class CoreTopics:
    """Full names of the topics the core reads."""

    steps: str
    health: str
    jobs: str  #: internal: health, relaunch commands, lifecycle re-keyed by job; ticks
    commands: str = ""
    lifecycle: str = ""
    results: str = ""


@dataclass
class JobState:
    """Everything the worker keeps for one job; written to the table as plain data."""

    job_id: str
    detection: JobDetection
    partition: int = -1
    #: (topic, partition) -> last offset reflected in this state
    offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    #: newest step event time seen (epoch s) and the wall time it arrived
    last_event_ts: float | None = None
    arrived_wall: float = 0.0
    #: wall time of the last step, command or lifecycle record (not health: node
    #: agents outlive jobs); the idle TTL counts from here
    active_wall: float = 0.0
    #: wall time until which a state restored from a snapshot is catching up (its
    #: steps are replayed late: they count as arrived when their event time says)
    resume_wall: float = 0.0
    #: wall time this worker took the job over from a snapshot: a tick sent before it
    #: (by this worker, before a rebalance dropped and restored the job) judges nothing
    resumed_wall: float = 0.0
    steps_since_snapshot: int = 0
    dirty: bool = False
    last_snapshot_wall: float = 0.0
    #: seconds the last snapshot took to encode and seal (spaces the next one out)
    snapshot_cost_s: float = 0.0
    #: layout of the detectors' state this snapshot holds (:data:`STATE_LAYOUT`)
    layout: int = 0
    #: a step of the job arrived (False: named only by health or a start event, see
    #: :mod:`pipeline.services.worker.pending`); only confirmed jobs are snapshotted
    confirmed: bool = True

    def __post_init__(self) -> None:
        self.layout = STATE_LAYOUT

    def to_bytes(self) -> bytes:
        """The state as a :mod:`pipeline.io.statecodec` blob (zlib level 1)."""
        return statecodec.dumps(self)

    @staticmethod
    def from_bytes(blob: bytes, max_bytes: int = 512 * 1024 * 1024) -> JobState:
        """Read a snapshot back; :class:`~pipeline.io.statecodec.StateFormatError` when
        it is not a readable JobState (nothing in it is ever executed)."""
        state = statecodec.loads(blob, max_bytes=max_bytes)
        if not isinstance(state, JobState):
            raise StateFormatError(f"table value is {type(state).__name__}, not JobState")
        layout = vars(state).get("layout")  # as stored: not the class default
        if layout != STATE_LAYOUT:
            raise StateFormatError(
                f"detector state layout {layout}, this worker reads {STATE_LAYOUT}"
            )
        return state

    def seen(self, topic: str, partition: int, offset: int) -> bool:
        """True when the record at this offset is already reflected (a replay)."""
        return offset <= self.offsets.get((topic, partition), -1)

    def now_estimate(self, wall: float, rate: float = 1.0) -> float | None:
        """Event time now: newest step event time plus the wall time since it came
        (times ``rate``: a job replayed at SPEED x real time, see
        ``STEPGUARD_WORKER_EVENT_RATE``)."""
        if self.last_event_ts is None:
            return None
        return self.last_event_ts + rate * max(0.0, wall - self.arrived_wall)


@dataclass
class Handled:
    """What the agent must do for one record it handed over (in this order)."""

    job_id: str | None = None
    alerts: list[Alert] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    #: the JobState blob to write to the table under ``job_id`` before releasing (with
    #: ``tombstone``: the mark of the job's end, :mod:`pipeline.services.worker.ended`)
    snapshot: bytes | None = None
    #: tokens (Faust events) that may be acked now
    release: list[Any] = field(default_factory=list)
    rank_steps: int = 0
    steps: int = 0
    #: event-time ends of the steps completed (for the latency metric)
    step_ts: list[float] = field(default_factory=list)
    #: the job ended or was abandoned: its state is dropped, and its table entry
    #: becomes ``snapshot`` (its end mark) or, without one, is deleted (a tombstone)
    tombstone: bool = False

    def acts(self) -> bool:
        """Whether the agent has anything to do for it: most step records only join
        their step, held until a snapshot covers them."""
        return bool(
            self.release or self.rank_steps or self.snapshot is not None or self.alerts
            or self.dead_letters or self.tombstone
        )  # fmt: skip

    def add(self, detected: Detected) -> None:
        """Take what the job's detection returned: its alerts, and its completed
        frames as step counts (the metrics)."""
        self.alerts += detected.alerts
        for frame in detected.frames:
            self.steps += 1
            self.rank_steps += frame.n_ranks
            self.step_ts.append(frame.ts)


@dataclass(frozen=True, slots=True)
class Forward:
    """A record re-keyed to its job: send ``value`` to the job topic as ``kind`` (the
    kind it was sealed as; empty: the router's own). ``ts``: a health report's event
    time (the router's watermark of its partition, :mod:`pipeline.services.worker.seal`)."""

    job_id: str
    partition: int
    value: bytes
    kind: str = ""
    ts: float | None = None


def _dead_letter(
    value: bytes | None,
    error: str,
    topic: str,
    partition: int,
    offset: int,
    key: bytes | None,
    stage: str,
) -> DeadLetter:
    return DeadLetter(
        source_topic=topic, partition=partition, offset=offset, key=key, raw=value or b"",
        error=error[:2000], stage=stage, ts=datetime.now(UTC),
    )  # fmt: skip


class Record(NamedTuple):
    """One record handed to the core: where it was read (``topic``, ``partition``,
    ``offset``), its ``key`` and ``value``, the ``token`` the driver acks it by once
    the core releases it (a Faust event; a batch's ticket; None in tests), and its
    ``headers`` (the telemetry proofs, :mod:`pipeline.io.telemetry_auth`). Immutable;
    built by keyword. A named tuple rather than a frozen dataclass: one is built per
    record on the hot path, where a frozen dataclass's ``__init__`` added 0.8 µs of CPU
    to the 6.4 µs a replayed step record took (a named tuple: 0.2-0.3 µs).

    >>> r = Record(topic="s", partition=0, offset=5, key=b"j", value=b"{oops", token="t5")
    >>> r.where, r.refused("no", "decode").release, r.refused("no", "decode").dead_letters[0].offset
    ('s[0]@5', ['t5'], 5)
    """

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    token: Any = None
    headers: Headers | None = None

    @property
    def where(self) -> str:
        """``topic[partition]@offset``, as the logs name a record."""
        return f"{self.topic}[{self.partition}]@{self.offset}"

    def letter(self, error: str, stage: str) -> DeadLetter:
        """The dead letter of this record (``stage``: where it was refused)."""
        return _dead_letter(self.value, error, self.topic, self.partition, self.offset,
                            self.key, stage)  # fmt: skip

    def refused(self, error: str, stage: str) -> Handled:
        """This record dead-lettered and its token released."""
        return Handled(dead_letters=[self.letter(error, stage)], release=[self.token])

    def released(self, job_id: str | None = None) -> Handled:
        """Nothing to do for this record but ack it."""
        return Handled(job_id=job_id, release=[self.token])

    def decode(self, model: type[_M], max_bytes: int = MAX_MESSAGE_BYTES) -> _M | Rejected:
        """The value read as ``model`` (:func:`schemas.decode`), or its dead letter."""
        return decode(model, self.value, topic=self.topic, partition=self.partition,
                      offset=self.offset, key=self.key, max_bytes=max_bytes)  # fmt: skip
