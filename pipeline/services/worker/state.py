"""The worker's logic without Faust: decode, route, detect, snapshot, tick.

The Faust agents in :mod:`pipeline.services.worker.app` hand every record to
:class:`WorkerCore` and act on the :class:`Handled` it returns (send alerts and dead
letters, write a snapshot to the table, ack the records the snapshot covers). Keeping
the logic here makes it testable in milliseconds, without a broker. Detection itself,
and the order in which a job's records reach the detectors, is the one detection
core, :class:`~detectors.job.JobDetection`; this module adds what a worker needs
around it: decoding, offsets, snapshots, routing and the wall clock.

State and offsets
-----------------
One :class:`JobState` per job: its :class:`~detectors.job.JobDetection` and, per
source topic partition, the last offset the state reflects. A snapshot
(:mod:`pipeline.io.statecodec`: plain data, never pickle) goes
to the table every ``snapshot_steps`` completed steps or ``snapshot_interval_s`` wall
seconds; the records it covers are acked only then, so a committed offset is never
ahead of the state in the changelog. After a crash the records since the last commit
come back; those the snapshot already reflects are skipped by offset, the others are
processed again and re-emit the same alerts (same fingerprint and seq: idempotent
downstream).

Examples
--------
>>> core = WorkerCore(CoreTopics("s", "h", "j"), n_partitions=8)
>>> out = core.handle_step(0, 5, b"job-1", b"{oops", token="t5")
>>> out.dead_letters[0].error[:14], out.release
('StepTelemetry:', ['t5'])
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kafka.partitioner.default import murmur2

from detectors.engine import MonitorConfig
from detectors.frame import NodeStep
from detectors.job import JobDetection
from pipeline.io import statecodec
from pipeline.io.clockskew import future_dated
from pipeline.io.errors import CapacityError
from pipeline.io.fastdecode import decode_step
from pipeline.io.statecodec import StateFormatError
from pipeline.io.trust import PublicKeys, check_command, result_problem
from schemas import (
    Alert,
    Command,
    CommandResult,
    CommandStatus,
    DeadLetter,
    JobEvent,
    JobEventKind,
    NodeHealth,
    Rejected,
    StepTelemetry,
    decode,
)
from schemas.codec import MAX_MESSAGE_BYTES
from schemas.commands import RELAUNCHING
from schemas.telemetry import MAX_RANKS_PER_JOB

__all__ = [
    "KIND_HEADER",
    "CoreTopics",
    "Handled",
    "JobState",
    "WorkerCore",
    "partition_for",
]

log = logging.getLogger(__name__)

#: Header naming what a record on the worker's job topic carries:
#: ``health`` | ``tick`` | ``command`` | ``result`` | ``lifecycle``.
KIND_HEADER = "stepguard-kind"


def partition_for(key: str, n_partitions: int) -> int:
    """The partition Kafka's default (murmur2) partitioner picks for ``key``.

    Exporters key the steps topic by job with the default partitioner; records the
    worker re-keys to a job are sent to this partition explicitly, so both land in the
    partition whose owner holds the job's state.

    >>> partition_for("job-1", 8) == partition_for("job-1", 8)
    True
    """
    return (murmur2(key.encode()) & 0x7FFFFFFF) % n_partitions


#: executors whose SUCCEEDED RESTART is a relaunch they carried out themselves (the
#: Slurm executor requeues the job); a dry run's "would restart" never is
RELAUNCHING_EXECUTORS = frozenset({"slurm"})


@dataclass(frozen=True, slots=True)
class CoreTopics:
    """Full names of the topics the core reads."""

    steps: str
    health: str
    jobs: str  #: internal: health, relaunch commands, lifecycle re-keyed by job; ticks
    commands: str = ""
    lifecycle: str = ""
    results: str = ""


#: Version of the detectors' state layout inside a snapshot. Bump it when a detector's
#: fields change: older snapshots are then refused (and the job rebuilt from its
#: replayed records) instead of failing on the first step.
STATE_LAYOUT = 2


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
    steps_since_snapshot: int = 0
    dirty: bool = False
    last_snapshot_wall: float = 0.0
    #: layout of the detectors' state this snapshot holds (:data:`STATE_LAYOUT`)
    layout: int = 0

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

    def now_estimate(self, wall: float) -> float | None:
        """Event time now: newest step event time plus the wall time since it came."""
        if self.last_event_ts is None:
            return None
        return self.last_event_ts + max(0.0, wall - self.arrived_wall)


@dataclass
class Handled:
    """What the agent must do for one record it handed over (in this order)."""

    job_id: str | None = None
    alerts: list[Alert] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    #: the JobState blob to write to the table under ``job_id`` before releasing
    snapshot: bytes | None = None
    #: tokens (Faust events) that may be acked now
    release: list[Any] = field(default_factory=list)
    rank_steps: int = 0
    steps: int = 0
    #: event-time ends of the steps completed (for the latency metric)
    step_ts: list[float] = field(default_factory=list)
    #: the job ended or was abandoned: delete its table entry (a changelog tombstone)
    tombstone: bool = False


@dataclass(frozen=True, slots=True)
class Forward:
    """A health record re-keyed to its job: send ``value`` to the job topic."""

    job_id: str
    partition: int
    value: bytes


class WorkerCore:
    """Per-job detection state of one worker process.

    Parameters
    ----------
    topics
        Names of the topics read.
    n_partitions
        Partitions of the steps topic (the job topic and the table have as many).
    snapshot_steps, snapshot_interval_s
        Snapshot a job after this many completed steps, or once this much wall time
        passed since the previous snapshot of a changed job.
    max_message_bytes
        Larger records are dead-lettered before parsing.
    max_snapshot_bytes
        Largest snapshot the changelog takes; a larger one is not written and the
        records it would cover stay unacked (logged, ``oversized_snapshots``).
    monitor_config
        Detector thresholds for new jobs.
    max_jobs
        Jobs held at once; a record that would add one more is dead-lettered.
    job_idle_ttl_s
        A job with no step, command or lifecycle record for this many wall seconds,
        and no end, is abandoned: one INFO alert, its state dropped, a tombstone.
    max_ranks_per_job
        Distinct ranks per job; a message that would add more is dead-lettered.
    max_ended
        Ended jobs remembered (so that their late records raise nothing).
    max_clock_skew_s
        A step, health or lifecycle record dated more than this beyond the wall
        clock (``time.time``, not ``clock``) is dead-lettered (stage ``clock``): one
        record from the future would otherwise move a job's event time, and with it
        every hang clock and staleness check. None: no check.
    blind_after_s
        A worker that receives no record at all for this long (its own timer ticks
        travel through the broker too, so a live pipeline never goes this quiet) was
        cut off from the broker. When records flow again every job's hang clock
        restarts, and runs only after this long again: exporters reconnect on their own
        schedule, and an outage of the pipeline is not a hang of the job; silent nodes
        are judged from then on too. It is also the catch-up time of a job taken over
        from its snapshot (:meth:`_resume`). Set it above the tick interval.
    command_keys
        The actuator's public keys (:func:`pipeline.io.trust.public_keys`): a
        relaunch command is obeyed only when one of them signed it and it has not
        expired. None or empty: no command is obeyed.
    executor_keys
        The executors' public keys (``STEPGUARD_EXECUTOR_PUBLIC_KEYS``): a result they
        signed counts as a relaunch only from an executor that relaunches jobs itself
        (:data:`RELAUNCHING_EXECUTORS`: the Slurm executor's requeue), never a dry run's.
    result_keys
        The job controllers' public keys (``STEPGUARD_JOB_CONTROLLER_PUBLIC_KEYS``): a
        SUCCEEDED result restarts a relaunch grace and closes the episodes of the nodes
        it left out only when the controller key of the result's own job signed it
        (:func:`~pipeline.io.trust.result_problem`), never an executor's (a
        dry run's "would restart" is not a relaunch), and only when it is not dated
        beyond the wall clock + ``max_clock_skew_s``; the detection core acts on it once
        per command, and not when it is older than ``max_result_age_s`` of the job's
        event time. None or empty: no result is acted on (the relaunch grace runs its
        course).
    clock
        Wall clock (epoch seconds); injectable for tests.
    """

    def __init__(
        self,
        topics: CoreTopics,
        n_partitions: int,
        *,
        snapshot_steps: int = 10,
        snapshot_interval_s: float = 2.0,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        max_snapshot_bytes: int = 64 * 1024 * 1024,
        monitor_config: MonitorConfig | None = None,
        max_jobs: int = 10_000,
        job_idle_ttl_s: float = 3600.0,
        max_ranks_per_job: int = MAX_RANKS_PER_JOB,
        max_ended: int = 65_536,
        max_clock_skew_s: float | None = None,
        blind_after_s: float = 5.0,
        command_keys: PublicKeys | None = None,
        result_keys: PublicKeys | None = None,
        executor_keys: PublicKeys | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if n_partitions < 1:
            raise ValueError("n_partitions must be >= 1")
        if snapshot_steps < 1:
            raise ValueError("snapshot_steps must be >= 1")
        if snapshot_interval_s <= 0:
            raise ValueError("snapshot_interval_s must be positive")
        if blind_after_s <= 0:
            raise ValueError("blind_after_s must be positive")
        if max_jobs < 1 or max_ended < 1:
            raise ValueError("max_jobs and max_ended must be >= 1")
        if job_idle_ttl_s <= 0:
            raise ValueError("job_idle_ttl_s must be positive")
        self.topics = topics
        self.n_partitions = n_partitions
        self.snapshot_steps = snapshot_steps
        self.snapshot_interval_s = snapshot_interval_s
        self.max_message_bytes = max_message_bytes
        self.monitor_config = monitor_config
        self.blind_after_s = blind_after_s
        self.max_snapshot_bytes = max_snapshot_bytes
        self.oversized_snapshots = 0
        self.unreadable_snapshots = 0
        #: largest inflated snapshot read back (the compressed limit x a generous ratio)
        self.max_state_bytes = 16 * max_snapshot_bytes
        self.clock = clock
        self._last_record_wall: float | None = None
        self.blind_periods = 0
        self.jobs: dict[str, JobState] = {}
        self._held: dict[str, list[Any]] = {}
        self.unrouted_health = 0
        self.max_jobs = max_jobs
        self.job_idle_ttl_s = job_idle_ttl_s
        self.max_ranks_per_job = max_ranks_per_job
        self.max_ended = max_ended
        self.max_clock_skew_s = max_clock_skew_s
        #: job -> event time of its end: records up to then are the ended run's
        self.ended: OrderedDict[str, float] = OrderedDict()
        self.after_end = 0  #: records of ended jobs ignored
        self.refused = 0  #: records dead-lettered for a capacity limit
        self.future_dated = 0  #: records dead-lettered for an event time ahead of now
        self.command_keys: PublicKeys = command_keys or {}
        self.refused_commands = 0  #: relaunch commands not obeyed (signature, expiry)
        self.result_keys: PublicKeys = result_keys or {}
        self.executor_keys: PublicKeys = executor_keys or {}
        self.refused_results = 0  #: SUCCEEDED results no executor key signed (ignored)

    # -- state --------------------------------------------------------------------------
    def state(self, job_id: str, load: Callable[[str], bytes | None]) -> JobState:
        """The job's live state: cached, else the table's snapshot, else a new one."""
        st = self.jobs.get(job_id)
        if st is None:
            if len(self.jobs) >= self.max_jobs:
                raise CapacityError(
                    f"worker holds {len(self.jobs)} jobs, STEPGUARD_WORKER_MAX_JOBS="
                    f"{self.max_jobs}: job {job_id} is not taken on"
                )
            blob = load(job_id)
            st = self._read(job_id, blob) if blob is not None else None
            if st is not None:
                self._resume(st)
            else:
                st = JobState(
                    job_id,
                    JobDetection(job_id, self.monitor_config, max_ranks=self.max_ranks_per_job),
                    last_snapshot_wall=self.clock(),
                    active_wall=self.clock(),
                )
            self.jobs[job_id] = st
        return st

    def _resume(self, st: JobState) -> None:
        """Take over a job from its snapshot (another worker's, or ours before a
        restart or rebalance).

        The clocks that measure absence must not count the gap the pipeline caused (the
        old owner's death, the rebalance, reading the backlog), yet a hang that began
        before it must still be raised promptly. So the hang clock is *resumed*, not
        restarted: the snapshot's step arrival time is kept (the old owner's wall clock;
        never later than ours), and while the job catches up (``blind_after_s``) a
        replayed step counts as arrived when its event time says, after the one before
        it. A job whose steps kept coming is judged on them once they are read (the
        worker ticks no partition whose steps it has not read); a job that stopped
        before the takeover is hung from its last step's event time on. Health reports
        travel another way (re-keyed by whichever worker owns the node's partition, and
        that may be the one that died): a node's silence counts only from the end of the
        catch-up (:meth:`~detectors.job.JobDetection.resume`).
        """
        wall = self.clock()
        st.arrived_wall = min(st.arrived_wall, wall)
        st.resume_wall = wall + self.blind_after_s
        st.last_snapshot_wall = wall
        now = st.now_estimate(wall)
        if now is not None:
            st.detection.resume(now + self.blind_after_s)

    def _read(self, job_id: str, blob: bytes) -> JobState | None:
        """A snapshot from the table, or None when it is unreadable: logged, counted,
        and the job's state is rebuilt from the records replayed after it."""
        try:
            st = JobState.from_bytes(blob, max_bytes=self.max_state_bytes)
        except StateFormatError as exc:
            self.unreadable_snapshots += 1
            log.error("snapshot of job %s is unreadable (%s): starting it afresh", job_id, exc)
            return None
        if st.job_id != job_id:
            self.unreadable_snapshots += 1
            log.error("snapshot under %s holds job %s: starting it afresh", job_id, st.job_id)
            return None
        return st

    def drop_partitions(self, partitions: Iterable[int]) -> int:
        """Forget jobs of revoked partitions and their unacked records (they come back
        from the committed offset to whoever owns the partition next)."""
        gone = set(partitions)
        drop = [j for j, st in self.jobs.items() if st.partition in gone or st.partition < 0]
        for job in drop:
            del self.jobs[job]
            self._held.pop(job, None)
        return len(drop)

    def counts(self) -> dict[str, int]:
        """What the worker refused or could not read, since it started (metrics)."""
        return {
            "unreadable_snapshot": self.unreadable_snapshots,
            "oversized_snapshot": self.oversized_snapshots,
            "refused_for_limit": self.refused,
            "after_end": self.after_end,
            "future_dated": self.future_dated,
            "refused_command": self.refused_commands,
            "refused_result": self.refused_results,
        }

    def held(self, job_id: str) -> int:
        return len(self._held.get(job_id, ()))

    # -- records ------------------------------------------------------------------------
    def handle_step(
        self,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        token: Any,
        load: Callable[[str], bytes | None] = lambda _: None,
    ) -> Handled:
        """One StepTelemetry record from the steps topic."""
        self._saw_record()
        topic = self.topics.steps
        # the msgspec fast path takes common telemetry; pydantic decides the rest and
        # writes the dead letter's error
        msg: NodeStep | Rejected | None = None
        if value is None or len(value) <= self.max_message_bytes:
            msg = decode_step(value)
        if msg is None:
            msg = decode(
                StepTelemetry, value, topic=topic, partition=partition, offset=offset,
                key=key, max_bytes=self.max_message_bytes,
            )  # fmt: skip
        if isinstance(msg, Rejected):
            return Handled(dead_letters=[msg.letter], release=[token])
        ts = msg.ts_end.timestamp()
        st = self._take(msg.job_id, ts, topic, partition, offset, key, value, token, load)
        if isinstance(st, Handled):
            return st
        out = Handled(job_id=msg.job_id)
        st.active_wall = self.clock()
        if st.last_event_ts is None or ts >= st.last_event_ts:
            wall = self.clock()
            if st.last_event_ts is not None and wall < st.resume_wall:
                # catching up after a takeover (:meth:`_resume`): a replayed step
                # arrived as long after the one before it as its event time says
                wall = min(wall, st.arrived_wall + (ts - st.last_event_ts))
            st.last_event_ts = ts
            st.arrived_wall = wall
        st.dirty = True
        try:
            detected = st.detection.on_step(msg)
            out.alerts += detected.alerts
            for frame in detected.frames:
                out.steps += 1
                out.rank_steps += frame.n_ranks
                out.step_ts.append(frame.ts)
        except CapacityError as exc:
            self.refused += 1
            log.warning("%s[%d]@%d refused: %s", topic, partition, offset, exc)
            out.dead_letters.append(
                _dead_letter(value, str(exc), topic, partition, offset, key, "limit")
            )
        except Exception as exc:  # a detector bug must not stop the job's other steps
            log.exception("detector failed on %s[%d]@%d", topic, partition, offset)
            out.dead_letters.append(
                _dead_letter(value, f"detect: {exc!r}", topic, partition, offset, key, "detect")
            )
        st.steps_since_snapshot += out.steps
        return self._finish(st, out, token)

    def _to_job(self, job_id: str, value: bytes | None) -> Forward:
        """A record re-keyed to the partition that holds ``job_id``'s state."""
        return Forward(job_id, partition_for(job_id, self.n_partitions), value or b"")

    def route_health(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None
    ) -> Forward | Rejected | None:
        """A health record: where to forward it (its job's partition), a dead letter,
        or None when it names no job (counted in ``unrouted_health``)."""
        msg = decode(
            NodeHealth, value, topic=self.topics.health, partition=partition, offset=offset,
            key=key, max_bytes=self.max_message_bytes,
        )  # fmt: skip
        if isinstance(msg, Rejected):
            return msg
        if msg.job_id is None:
            self.unrouted_health += 1
            return None
        return self._to_job(msg.job_id, value)

    def route_command(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None
    ) -> Forward | None:
        """A command: forward restarts, rollbacks and isolations to their job's partition
        (the job goes quiet while it relaunches) when the actuator signed them and they
        have not expired; None for anything else. Executors own bad commands (they
        dead-letter them), so an undecodable one is only skipped."""
        msg = decode(
            Command, value, topic=self.topics.commands, partition=partition, offset=offset,
            key=key, max_bytes=self.max_message_bytes,
        )  # fmt: skip
        if isinstance(msg, Rejected) or msg.kind not in RELAUNCHING:
            return None
        problem = check_command(msg, self.command_keys, datetime.fromtimestamp(self.clock(), UTC))
        if problem is not None:  # a forged relaunch must not put the hang clock in grace
            self.refused_commands += 1
            log.warning("%s[%d]@%d: not obeying %s %s: %s", self.topics.commands, partition,
                        offset, msg.kind.value, msg.command_id, problem)  # fmt: skip
            return None
        return self._to_job(msg.job_id, value)

    def route_result(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None
    ) -> Forward | None:
        """An executor's result: forward a SUCCEEDED one to its job's partition (a
        relaunch carried out restarts the grace and its left-out nodes' episodes
        resolve) when an executor key signed it; None for anything else (a result no
        executor key signed is counted in ``refused_results``). Undecodable results
        are the actuator's to judge."""
        msg = decode(
            CommandResult, value, topic=self.topics.results, partition=partition,
            offset=offset, key=key, max_bytes=self.max_message_bytes,
        )  # fmt: skip
        if isinstance(msg, Rejected) or msg.status is not CommandStatus.SUCCEEDED:
            return None
        problem = self._result_problem(msg)
        if problem is not None:  # a forged success must not end a relaunch's episodes
            self.refused_results += 1
            log.warning("%s[%d]@%d: ignoring result of %s: %s", self.topics.results,
                        partition, offset, msg.command_id, problem)  # fmt: skip
            return None
        return self._to_job(msg.job_id, value)

    def route_lifecycle(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None
    ) -> Forward | Rejected:
        """A lifecycle event: forward it to its job's partition, or a dead letter."""
        msg = decode(
            JobEvent, value, topic=self.topics.lifecycle, partition=partition, offset=offset,
            key=key, max_bytes=self.max_message_bytes,
        )  # fmt: skip
        if isinstance(msg, Rejected):
            return msg
        return self._to_job(msg.job_id, value)

    def handle_job_record(
        self,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        kind: str,
        token: Any,
        load: Callable[[str], bytes | None] = lambda _: None,
    ) -> Handled:
        """One record of the internal job topic: forwarded health, command or
        lifecycle event, or a timer tick."""
        self._saw_record()
        topic = self.topics.jobs
        if kind == "tick":
            return self._tick(partition, offset, key, value, token)
        if kind == "command":
            return self._command(partition, offset, key, value, token)
        if kind == "lifecycle":
            return self._lifecycle(partition, offset, key, value, token, load)
        if kind == "result":
            return self._result(partition, offset, key, value, token)
        msg = decode(
            NodeHealth, value, topic=topic, partition=partition, offset=offset, key=key,
            max_bytes=self.max_message_bytes,
        )  # fmt: skip
        if isinstance(msg, Rejected):
            return Handled(dead_letters=[msg.letter], release=[token])
        if msg.job_id is None:
            return Handled(release=[token])
        ts = msg.ts.timestamp()
        st = self._take(msg.job_id, ts, topic, partition, offset, key, value, token, load)
        if isinstance(st, Handled):
            return st
        out = Handled(job_id=msg.job_id)
        st.dirty = True
        try:
            out.alerts += st.detection.on_health(msg)
        except Exception as exc:
            log.exception("detector failed on %s[%d]@%d", topic, partition, offset)
            out.dead_letters.append(
                _dead_letter(value, f"detect: {exc!r}", topic, partition, offset, key, "detect")
            )
        return self._finish(st, out, token)

    def _saw_record(self) -> None:
        """Note that the broker delivered something; after a blind gap, restart every
        job's hang clock with a grace of ``blind_after_s``."""
        wall = self.clock()
        last, self._last_record_wall = self._last_record_wall, wall
        if last is None or wall - last < self.blind_after_s or not self.jobs:
            return
        gap = wall - last
        self.blind_periods += 1
        for st in self.jobs.values():
            # the same grace for silent nodes: their reports were cut off too
            now = st.now_estimate(wall)
            if now is not None:
                st.detection.resume(now + self.blind_after_s)
        log.warning(
            "no record for %.1fs (broker or network outage): the hang clocks of %d jobs "
            "restart in %.1fs",
            gap, len(self.jobs), self.blind_after_s,
        )  # fmt: skip
        for st in self.jobs.values():
            st.arrived_wall = max(st.arrived_wall, wall + self.blind_after_s)

    def _command(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None, token: Any
    ) -> Handled:
        """A relaunching command for a job we hold: its silence from now on is the
        relaunch, not a hang (:meth:`JobDetection.on_command`: a grace of
        restart_grace_steps median step times), and the nodes it names stop reporting."""
        topic = self.topics.jobs
        msg = decode(Command, value, topic=topic, partition=partition, offset=offset, key=key)
        if isinstance(msg, Rejected):
            return Handled(release=[token])
        st = self.jobs.get(msg.job_id)
        out = Handled(job_id=msg.job_id)
        now = st.now_estimate(self.clock()) if st is not None else None
        if st is None or now is None or st.seen(topic, partition, offset):
            out.release.append(token)
            return out
        st.offsets[(topic, partition)] = offset
        st.dirty = True
        st.active_wall = self.clock()
        out.alerts += st.detection.on_command(msg, now=now)
        log.info(
            "%s %s issued: its hang clock allows for the relaunch (nodes %s)",
            msg.job_id, msg.kind.value, ", ".join(msg.targets) or "none",
        )  # fmt: skip
        return self._finish(st, out, token)

    def _result(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None, token: Any
    ) -> Handled:
        """A SUCCEEDED result for a job we hold (:meth:`JobDetection.on_result`)."""
        topic = self.topics.jobs
        msg = decode(CommandResult, value, topic=topic, partition=partition, offset=offset,
                     key=key)  # fmt: skip
        if isinstance(msg, Rejected):
            return Handled(release=[token])
        if self._result_problem(msg) is not None:  # written to jobs directly
            self.refused_results += 1
            return Handled(release=[token])
        st = self.jobs.get(msg.job_id)
        if st is None or st.seen(topic, partition, offset):
            return Handled(job_id=msg.job_id, release=[token])
        st.offsets[(topic, partition)] = offset
        st.dirty = True
        out = Handled(job_id=msg.job_id, alerts=st.detection.on_result(msg))
        return self._finish(st, out, token)

    def _result_problem(self, msg: CommandResult) -> str | None:
        """Why a result is not its job's controller's fresh word, or None."""
        problem = result_problem(msg, self.result_keys, "job_controller")
        if (
            problem is not None
            and msg.executor in RELAUNCHING_EXECUTORS
            and result_problem(msg, self.executor_keys, "executor") is None
        ):
            problem = None  # an executor that relaunches jobs itself (a Slurm requeue)
        if problem is None and self.max_clock_skew_s is not None:
            problem = future_dated(msg.ts, self.max_clock_skew_s, now=time.time())
        return problem

    def _tick(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None, token: Any
    ) -> Handled:
        try:
            body = json.loads(value or b"")
            job_id, wall = str(body["job_id"]), float(body["wall_s"])
        except (ValueError, KeyError, TypeError) as exc:
            letter = _dead_letter(
                value, f"tick: {exc!r}", self.topics.jobs, partition, offset, key, "decode"
            )
            return Handled(dead_letters=[letter], release=[token])
        st = self.jobs.get(job_id)  # only jobs this worker holds are ticked
        out = Handled(job_id=job_id, release=[token])
        if st is None or st.seen(self.topics.jobs, partition, offset):
            return out
        now = st.now_estimate(wall)
        if now is None or now <= (st.last_event_ts or now):
            return out
        idle = wall - st.active_wall
        if idle >= self.job_idle_ttl_s:
            out.alerts += st.detection.abandon(now, idle)
            log.warning(
                "job %s abandoned: no step, command or lifecycle record for %.0fs "
                "(STEPGUARD_JOB_IDLE_TTL_S=%.0f): its state is dropped",
                job_id, idle, self.job_idle_ttl_s,
            )  # fmt: skip
            return self._drop(st, out, st.last_event_ts or now)
        held = st.detection.held_health
        out.alerts += st.detection.tick(now)
        if out.alerts:
            log.info(
                "tick for %s (sent %.3f, read %.3f): %.2fs since its newest step arrived "
                "-> %s", job_id, wall, self.clock(), wall - st.arrived_wall,
                ", ".join(f"{a.kind.value} {a.state.value}" for a in out.alerts),
            )  # fmt: skip
        if out.alerts or st.detection.held_health != held:
            # the tick changed what an episode says, or processed held health: that
            # must survive a restart
            out.release.clear()
            st.offsets[(self.topics.jobs, partition)] = offset
            st.dirty = True
        return self._finish(st, out, token if not out.release else None)

    def _lifecycle(
        self,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        token: Any,
        load: Callable[[str], bytes | None],
    ) -> Handled:
        """A job's start, long phase or end. An end resolves the job's episodes and
        drops its state (tombstone); its late records are ignored from then on, until
        a record newer than the end (a new run under the same id) starts afresh."""
        topic = self.topics.jobs
        msg = decode(
            JobEvent, value, topic=topic, partition=partition, offset=offset, key=key,
            max_bytes=self.max_message_bytes,
        )  # fmt: skip
        if isinstance(msg, Rejected):
            return Handled(dead_letters=[msg.letter], release=[token])
        ts = msg.ts.timestamp()
        future = self._from_the_future(ts, value, topic, partition, offset, key, token)
        if future is not None:
            return future
        if self._ended_before(msg.job_id, ts):
            return Handled(release=[token])
        if msg.kind is JobEventKind.START:
            return Handled(job_id=msg.job_id, release=[token])
        st = self.jobs.get(msg.job_id)
        if st is None and msg.kind is JobEventKind.END:
            try:  # a snapshot stored before this worker took the partition
                st = self.state(msg.job_id, load) if load(msg.job_id) is not None else None
            except CapacityError:
                st = None
            if st is None:
                self._mark_ended(msg.job_id, ts)
                return Handled(job_id=msg.job_id, release=[token], tombstone=True)
        if st is None or st.seen(topic, partition, offset):
            return Handled(job_id=msg.job_id, release=[token])
        st.offsets[(topic, partition)] = offset
        st.dirty = True
        st.active_wall = self.clock()
        out = Handled(job_id=msg.job_id)
        out.alerts += st.detection.on_lifecycle(msg)
        if st.detection.ended is not None:
            log.info("job %s ended (%s): its state is dropped", msg.job_id, msg.reason)
            return self._drop(st, out, ts, token)
        return self._finish(st, out, token)

    def _take(
        self,
        job_id: str,
        ts: float,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        token: Any,
        load: Callable[[str], bytes | None],
    ) -> JobState | Handled:
        """The state a job's record goes to, its offset recorded; or what to do with
        the record instead: ack it (a record of an ended run, or a replay the state
        already reflects) or dead-letter it (dated in the future, or a capacity
        limit)."""
        future = self._from_the_future(ts, value, topic, partition, offset, key, token)
        if future is not None:
            return future
        if self._ended_before(job_id, ts):
            return Handled(release=[token])
        try:
            st = self.state(job_id, load)
        except CapacityError as exc:
            return self._refuse(exc, value, topic, partition, offset, key, token)
        if st.seen(topic, partition, offset):
            return Handled(job_id=job_id, release=[token])
        st.offsets[(topic, partition)] = offset
        st.partition = partition
        return st

    def _from_the_future(
        self,
        ts: float,
        value: bytes | None,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        token: Any,
    ) -> Handled | None:
        """A dead letter for a record dated beyond wall clock + ``max_clock_skew_s``."""
        error = future_dated(
            ts, self.max_clock_skew_s, now=time.time(), field="event time", whose="this worker's"
        )
        if error is None:
            return None
        self.future_dated += 1
        log.warning("%s[%d]@%d refused: %s", topic, partition, offset, error)
        letter = _dead_letter(value, error, topic, partition, offset, key, "clock")
        return Handled(dead_letters=[letter], release=[token])

    def _ended_before(self, job_id: str, ts: float) -> bool:
        """True for a record of an ended run; a newer record un-ends the job."""
        end = self.ended.get(job_id)
        if end is None:
            return False
        if ts <= end:
            self.after_end += 1
            return True
        del self.ended[job_id]
        return False

    def _mark_ended(self, job_id: str, ts: float) -> None:
        self.ended[job_id] = max(ts, self.ended.get(job_id, ts))
        self.ended.move_to_end(job_id)
        while len(self.ended) > self.max_ended:
            self.ended.popitem(last=False)

    def _drop(self, st: JobState, out: Handled, end_ts: float, token: Any = None) -> Handled:
        """Forget an ended job: its held records are acked, its table entry deleted."""
        self.jobs.pop(st.job_id, None)
        self._mark_ended(st.job_id, max(end_ts, st.last_event_ts or end_ts))
        out.release += self._held.pop(st.job_id, [])
        if token is not None:
            out.release.append(token)
        out.tombstone = True
        return out

    def _refuse(
        self,
        exc: CapacityError,
        value: bytes | None,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        token: Any,
    ) -> Handled:
        self.refused += 1
        log.warning("%s[%d]@%d refused: %s", topic, partition, offset, exc)
        letter = _dead_letter(value, str(exc), topic, partition, offset, key, "limit")
        return Handled(dead_letters=[letter], release=[token])

    def _finish(self, st: JobState, out: Handled, token: Any) -> Handled:
        if token is not None:
            self._held.setdefault(st.job_id, []).append(token)
        wall = self.clock()
        due = st.steps_since_snapshot >= self.snapshot_steps or (
            st.dirty and wall - st.last_snapshot_wall >= self.snapshot_interval_s
        )
        if due:
            st.steps_since_snapshot = 0
            st.dirty = False
            st.last_snapshot_wall = wall
            blob = st.to_bytes()
            if len(blob) > self.max_snapshot_bytes:
                # the changelog would refuse it: keep the records unacked (they replay
                # after a crash) and say which limit to raise
                self.oversized_snapshots += 1
                log.error(
                    "snapshot of job %s is %d bytes, over STEPGUARD_WORKER_MAX_SNAPSHOT_BYTES"
                    "=%d: not written, its records stay unacked",
                    st.job_id, len(blob), self.max_snapshot_bytes,
                )  # fmt: skip
                return out
            out.snapshot = blob
            out.release += self._held.pop(st.job_id, [])
        return out

    # -- timer --------------------------------------------------------------------------
    def tick_record(self, job_id: str) -> tuple[int, bytes] | None:
        """(partition, value) of a tick for ``job_id``, or None while it has no step."""
        st = self.jobs.get(job_id)
        if st is None or st.last_event_ts is None or st.partition < 0:
            return None
        wall = self.clock()
        resumed = st.resume_wall - self.blind_after_s
        if wall < st.resume_wall and (self._last_record_wall or 0.0) < resumed:
            # just taken over and no record read since: its clock runs from its last
            # step (:meth:`_resume`), and until a fetch came back the driver cannot
            # know whether the steps of the gap are still unread (a partition's end
            # offset is known only from a fetch)
            return None
        body = {"job_id": job_id, "wall_s": wall}
        return st.partition, json.dumps(body).encode()

    def adopt(self, job_id: str, blob: bytes, owned: set[int]) -> bool:
        """Load a job found in the table (after a restart) when its partition is ours."""
        if job_id in self.jobs or job_id in self.ended or len(self.jobs) >= self.max_jobs:
            return False
        st = self._read(job_id, blob)
        if st is None or st.partition not in owned:
            return False
        self._resume(st)
        self.jobs[job_id] = st
        return True


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
