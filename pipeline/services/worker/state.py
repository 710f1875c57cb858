"""The worker's logic without Faust: decode, route, detect, snapshot, tick.

The Faust agents in :mod:`pipeline.services.worker.app` hand every record to
:class:`WorkerDetection` and act on the :class:`Handled` it returns (send alerts and dead
letters, write a snapshot to the table, ack the records the snapshot covers). Keeping
the logic here makes it testable in milliseconds, without a broker. Detection itself,
and the order in which a job's records reach the detectors, is the one detection
core, :class:`~detectors.job.JobDetection`; this module adds what a worker needs
around it: decoding, offsets, snapshots, routing and the wall clock.

The core by concern
-------------------
:class:`WorkerDetection` is a composition; each collaborator owns one concern and is
handed the frozen :class:`~pipeline.services.worker.options.WorkerConfig` and the
shared :class:`~pipeline.services.worker.book.JobBook` (the jobs held, pending and
their held tokens, the counters). Its methods are facades that turn the driver's
positional record into a :class:`~pipeline.services.worker.records.Record` and hand it
on:

========================  ==========================================================
:mod:`.intake`            steps topic: decode, prove, take, detect (one or a fetch)
:mod:`.routing`           health, commands, results, lifecycle -> the job's partition
:mod:`.job_topic`         the jobs topic's records by kind, into their job
:mod:`.ticks`             the timer's tick and expire records: written and handled
:mod:`.takeover`          a job's state: cached, pending, restored, new; clocks resumed
:mod:`.snapshots`         when a snapshot is due, written, sealed; read back
:mod:`.ending`            ended jobs: remembered, recognised, dropped (end marks)
:mod:`.admission`         the refusals every job record may meet (clock, limit, proof)
========================  ==========================================================

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
>>> core = WorkerDetection(CoreTopics("s", "h", "j"), n_partitions=8)
>>> out = core.handle_step(0, 5, b"job-1", b"{oops", token="t5")
>>> out.dead_letters[0].error[:14], out.release
('StepTelemetry:', ['t5'])
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Any, Unpack

from detectors.engine import DetectorConfig
from detectors.job_guard import LifecycleLimits
from pipeline.services.worker.admission import Admission
from pipeline.services.worker.book import JobBook
from pipeline.services.worker.ending import Ending
from pipeline.services.worker.intake import StepIntake
from pipeline.services.worker.job_topic import JobTopic
from pipeline.services.worker.options import (
    Capacity,
    FlatOptions,
    SnapshotPolicy,
    Timing,
    WorkerConfig,
    WorkerTrust,
    grouped,
)
from pipeline.services.worker.pending import PendingJobs
from pipeline.services.worker.records import (
    CoreTopics,
    Forward,
    Handled,
    JobState,
    Load,
    Record,
    no_table,
    partition_for,
)
from pipeline.services.worker.routing import RELAUNCHING_EXECUTORS, Routing
from pipeline.services.worker.snapshots import Snapshots
from pipeline.services.worker.takeover import Takeover
from pipeline.services.worker.ticks import Ticks
from schemas import Rejected

__all__ = [
    "KIND_HEADER",
    "RELAUNCHING_EXECUTORS",
    "CoreTopics",
    "Handled",
    "JobState",
    "Record",
    "WorkerDetection",
    "partition_for",
]

#: Header naming what a record on the worker's job topic carries:
#: ``health`` | ``tick`` | ``command`` | ``result`` | ``lifecycle`` | ``expire``.
KIND_HEADER = "stepguard-kind"


class _Count:
    """A counter of :class:`~pipeline.services.worker.book.Counts`, read on the core."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, core: WorkerDetection | None, owner: type | None = None) -> Any:
        return self if core is None else getattr(core.book.counts, self.name)


class WorkerDetection:
    """Per-job detection state of one worker process.

    The keywords from ``snapshot_steps`` to ``on_refused`` may also come grouped
    (:mod:`~pipeline.services.worker.options`): ``snapshots`` (the ``snapshot_*`` and
    ``max_snapshot_bytes``), ``capacity`` (the other ``max_*`` but the skew, and the
    TTLs), ``timing`` (``event_rate``, ``blind_after_s``, ``max_clock_skew_s``) and
    ``trust`` (the keys, ``seal``, ``telemetry``, ``on_refused``); a keyword sets its
    field in the group given, or in the default group.

    Parameters
    ----------
    topics
        Names of the topics read.
    n_partitions
        Partitions of the steps topic (the job topic and the table have as many).
    snapshot_steps, snapshot_interval_s
        Snapshot a job after this many completed steps, or once this much wall time
        passed since the previous snapshot of a changed job.
    snapshot_budget
        ... but never sooner than the last snapshot's cost divided by this share: a big
        job's snapshots take at most this share of the worker's time (its records stay
        unacked meanwhile and replay after a crash).
    event_rate
        Event seconds a job's clock moves per wall second since its newest step came
        (1 in production; a job replayed at SPEED x real time: SPEED).
    max_message_bytes
        Larger records are dead-lettered before parsing.
    max_snapshot_bytes
        Largest snapshot the changelog takes; a larger one is not written and the
        records it would cover stay unacked (logged, ``oversized_snapshots``).
    detector_config
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
        from its snapshot (:meth:`Takeover.resume`). Set it above the tick interval.
    command_keys
        The actuator's public keys (:func:`pipeline.io.trust.public_keys`): a
        relaunch command is obeyed only when one of them signed it and it has not
        expired. None or empty: no command is obeyed.
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
    executor_keys
        The executors' public keys (``STEPGUARD_EXECUTOR_PUBLIC_KEYS``): a result they
        signed counts as a relaunch only from an executor that relaunches jobs itself
        (:data:`RELAUNCHING_EXECUTORS`: the Slurm executor's requeue), never a dry run's.
    max_nodes_per_job
        Distinct nodes per job; a message that would add more is dead-lettered.
    limits
        How far jobs' lifecycle events are trusted
        (:class:`~detectors.job_guard.LifecycleLimits`).
    max_pending_jobs, pending_ttl_s
        Jobs named only by health reports or start events (no step yet) held at once,
        and for how many wall seconds (:mod:`pipeline.services.worker.pending`).
    seal
        Authenticates what the worker writes for itself (:mod:`pipeline.services.worker.seal`):
        records it forwards to its jobs topic, its ticks and its snapshots are sealed,
        and a record of the jobs topic or a snapshot that does not open is refused
        (``unsealed``: a dead letter; a snapshot is rebuilt from the records). None:
        nothing is sealed or checked (unit tests and benchmarks; ``stepguard worker``
        always seals, with a key derived from the worker's private key).
    telemetry
        The check of telemetry proofs (:mod:`pipeline.io.telemetry_auth`): a steps
        record is taken only when its headers prove every node it speaks for (a node's
        message: its node; a rack's: its sender and every sample's node), a health
        record only with its node's proof, a lifecycle event only with its job
        controller's signature (an end, a phase, a start naming the job's nodes) or,
        for the others, its controller's or its source node's proof; a proven health
        or lifecycle record written again elsewhere (a replay) is refused too. The rest is
        dead-lettered (stage ``auth``) before it reaches any job, and counted per
        claimed node (``refused_proof``, ``on_refused``). None: telemetry is not
        authenticated (``STEPGUARD_TELEMETRY_AUTH=off``; unit tests and benchmarks).
    on_refused
        Called with (topic, claimed node) for every record refused for its proof (the
        worker's per-writer counter).
    clock
        Wall clock (epoch seconds); injectable for tests. A snapshot's cost is measured
        on it too.
    """

    def __init__(
        self,
        topics: CoreTopics,
        n_partitions: int,
        *,
        snapshots: SnapshotPolicy | None = None,
        capacity: Capacity | None = None,
        timing: Timing | None = None,
        trust: WorkerTrust | None = None,
        limits: LifecycleLimits | None = None,
        detector_config: DetectorConfig | None = None,
        clock: Callable[[], float] = time.time,
        **options: Unpack[FlatOptions],
    ) -> None:
        groups = grouped(dict(options), snapshots=snapshots, capacity=capacity,
                         timing=timing, trust=trust)  # fmt: skip
        config = WorkerConfig(topics, n_partitions, limits=limits, clock=clock, **groups)
        self.config = config
        self.topics = topics
        self.n_partitions = n_partitions
        self.book = book = JobBook(config)
        self.snapshots = snaps = Snapshots(config, book)
        self.ending = ending = Ending(config, book)
        self.takeover = takeover = Takeover(config, book, snaps, ending, detector_config)
        admission = Admission(config, book, takeover, ending)
        self.steps = StepIntake(config, book, admission, takeover, snaps)
        self.routing = routing = Routing(config, book, admission)
        self.ticks = ticks = Ticks(config, book, ending, snaps)
        self.job_topic = JobTopic(config, book, admission, takeover, ending, ticks, routing)

    # -- what the collaborators hold ------------------------------------------------------
    @property
    def jobs(self) -> dict[str, JobState]:
        """The jobs held (confirmed by a step), by id."""
        return self.book.jobs

    @property
    def pending(self) -> PendingJobs[JobState]:
        """The jobs named but not yet confirmed (:mod:`pipeline.services.worker.pending`)."""
        return self.book.pending

    @property
    def ended(self) -> OrderedDict[str, float]:
        """Ended jobs remembered: job -> event time of its end."""
        return self.ending.ended

    @property
    def detector_config(self) -> DetectorConfig | None:
        """Thresholds of new jobs (the control topic replaces them at run time)."""
        return self.takeover.detector_config

    @detector_config.setter
    def detector_config(self, config: DetectorConfig | None) -> None:
        self.takeover.detector_config = config

    unreadable_snapshots = _Count()
    oversized_snapshots = _Count()
    refused = _Count()
    after_end = _Count()
    future_dated = _Count()
    refused_commands = _Count()
    refused_results = _Count()
    unsealed = _Count()
    refused_proof = _Count()
    blind_periods = _Count()
    unrouted_health = _Count()

    def counts(self) -> dict[str, int]:
        """What the worker refused or could not read, since it started (metrics)."""
        return self.book.metrics()

    def job_states(self) -> dict[str, int]:
        """How many jobs held are in each state (metrics)."""
        return self.book.job_states()

    def held(self, job_id: str) -> int:
        """How many of the job's records wait for a snapshot to cover them."""
        return self.book.held_count(job_id)

    def state(self, job_id: str, load: Load, *, confirm: bool = True) -> JobState:
        """The job's live state (:meth:`Takeover.state`)."""
        return self.takeover.state(job_id, load, confirm=confirm)

    def drop_partitions(self, partitions: Iterable[int]) -> int:
        """Forget jobs of revoked partitions and their unacked records."""
        return self.book.drop_partitions(partitions)

    # -- records: the positional form of before, each a Record to its collaborator --------
    def handle_step(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None,
        token: Any, load: Load = no_table, headers: Any = None,
    ) -> Handled:  # fmt: skip
        """One StepTelemetry record from the steps topic (``headers``: its proofs)."""
        rec = Record(topic=self.topics.steps, partition=partition, offset=offset, key=key,
                     value=value, token=token, headers=headers)  # fmt: skip
        return self.steps.handle(rec, load)

    def handle_steps(
        self, partition: int, records: Iterable[tuple[Any, ...]], token: Any,
        load: Load = no_table,
    ) -> list[Handled]:  # fmt: skip
        """A fetch's records of one steps partition, ``(offset, key, value[, headers])``
        in offset order (:meth:`StepIntake.handle_batch`); ``token`` stands for every
        record: it is released once per record."""
        topic = self.topics.steps

        def record(r: tuple[Any, ...]) -> Record:
            headers = r[3] if len(r) > 3 else None
            return Record(topic=topic, partition=partition, offset=r[0], key=r[1],
                          value=r[2], token=token, headers=headers)  # fmt: skip

        return self.steps.handle_batch([record(r) for r in records], load)

    def handle_job_record(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None,
        kind: str, token: Any, load: Load = no_table,
    ) -> Handled:  # fmt: skip
        """One record of the internal job topic: forwarded health, command, result or
        lifecycle event, or a timer's tick or expire (:class:`JobTopic`)."""
        rec = Record(topic=self.topics.jobs, partition=partition, offset=offset, key=key,
                     value=value, token=token)  # fmt: skip
        return self.job_topic.handle(rec, kind, load)

    def _routed(self, topic: str, partition: int, offset: int, key: bytes | None,
                value: bytes | None, headers: Any) -> Record:  # fmt: skip
        return Record(topic=topic, partition=partition, offset=offset, key=key, value=value,
                      headers=headers)  # fmt: skip

    def route_health(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None,
        headers: Any = None,
    ) -> Forward | Rejected | None:  # fmt: skip
        """A health record (:meth:`Routing.health`)."""
        rec = self._routed(self.topics.health, partition, offset, key, value, headers)
        return self.routing.health(rec)

    def route_command(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None,
        headers: Any = None,
    ) -> Forward | None:  # fmt: skip
        """A command (:meth:`Routing.command`)."""
        rec = self._routed(self.topics.commands, partition, offset, key, value, headers)
        return self.routing.command(rec)

    def route_result(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None,
        headers: Any = None,
    ) -> Forward | None:  # fmt: skip
        """An executor's result (:meth:`Routing.result`)."""
        rec = self._routed(self.topics.results, partition, offset, key, value, headers)
        return self.routing.result(rec)

    def route_lifecycle(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None,
        headers: Any = None,
    ) -> Forward | Rejected:  # fmt: skip
        """A lifecycle event (:meth:`Routing.lifecycle`)."""
        rec = self._routed(self.topics.lifecycle, partition, offset, key, value, headers)
        return self.routing.lifecycle(rec)

    # -- the timer ----------------------------------------------------------------------
    def adopt(self, job_id: str, blob: bytes, owned: set[int]) -> bool:
        """Load a job found in the table when its partition is ours (:meth:`Takeover.adopt`)."""
        return self.takeover.adopt(job_id, blob, owned)

    def tick_record(self, job_id: str) -> tuple[int, bytes] | None:
        """(partition, value) of a tick for ``job_id`` (:meth:`Ticks.tick_record`)."""
        return self.ticks.tick_record(job_id)

    def expiry_ticks(
        self, stored: Iterable[tuple[str, bytes]], owned: set[int]
    ) -> list[tuple[str, int, bytes]]:
        """The ``expire`` records of end marks due (:meth:`Ticks.expiry_ticks`)."""
        return self.ticks.expiry_ticks(stored, owned)

    def watermarks_record(self, paths: list[tuple[int, float | None]]) -> bytes:
        """The sealed ``paths`` record of the health partitions' watermarks
        (:meth:`Ticks.watermarks_value`)."""
        return self.ticks.watermarks_value(paths, self.ticks.clock())
