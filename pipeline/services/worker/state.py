"""The worker's logic without Faust: decode, route, detect, snapshot, tick.

The Faust agents in :mod:`pipeline.services.worker.app` hand every record to
:class:`WorkerDetection` and act on the :class:`Handled` it returns (send alerts and dead
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
>>> core = WorkerDetection(CoreTopics("s", "h", "j"), n_partitions=8)
>>> out = core.handle_step(0, 5, b"job-1", b"{oops", token="t5")
>>> out.dead_letters[0].error[:14], out.release
('StepTelemetry:', ['t5'])
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from detectors.engine import DetectorConfig
from detectors.frame import NodeStep
from detectors.job import JOB_STATES, JobDetection
from detectors.job_guard import LifecycleLimits
from pipeline.io.clockskew import future_dated
from pipeline.io.errors import CapacityError
from pipeline.io.fastdecode import decode_step
from pipeline.io.statecodec import StateFormatError
from pipeline.io.telemetry_auth import Headers, TelemetryVerifier, message_nodes
from pipeline.io.trust import PublicKeys, check_command, result_problem
from pipeline.services.worker.ended import read_mark
from pipeline.services.worker.job_records import _JobRecords
from pipeline.services.worker.pending import PendingJobs
from pipeline.services.worker.records import (
    CoreTopics,
    Forward,
    Handled,
    JobState,
    _dead_letter,
    partition_for,
)
from pipeline.services.worker.seal import Seal
from schemas import (
    Command,
    CommandResult,
    CommandStatus,
    DeadLetter,
    JobEvent,
    NodeHealth,
    Rejected,
    StepTelemetry,
    decode,
)
from schemas.codec import MAX_MESSAGE_BYTES
from schemas.commands import RELAUNCHING
from schemas.lifecycle import MAX_NODES_PER_JOB
from schemas.telemetry import MAX_RANKS_PER_JOB

__all__ = [
    "KIND_HEADER",
    "CoreTopics",
    "Handled",
    "JobState",
    "WorkerDetection",
    "partition_for",
]

log = logging.getLogger(__name__)

#: Header naming what a record on the worker's job topic carries:
#: ``health`` | ``tick`` | ``command`` | ``result`` | ``lifecycle``.
KIND_HEADER = "stepguard-kind"


#: executors whose SUCCEEDED RESTART is a relaunch they carried out themselves (the
#: Slurm executor requeues the job); a dry run's "would restart" never is
RELAUNCHING_EXECUTORS = frozenset({"slurm"})


class WorkerDetection(_JobRecords):
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
        from its snapshot (:meth:`_resume`). Set it above the tick interval.
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
        snapshot_steps: int = 10,
        snapshot_interval_s: float = 2.0,
        snapshot_budget: float = 0.05,
        event_rate: float = 1.0,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        max_snapshot_bytes: int = 64 * 1024 * 1024,
        detector_config: DetectorConfig | None = None,
        max_jobs: int = 10_000,
        job_idle_ttl_s: float = 3600.0,
        max_ranks_per_job: int = MAX_RANKS_PER_JOB,
        max_ended: int = 65_536,
        max_clock_skew_s: float | None = None,
        blind_after_s: float = 5.0,
        command_keys: PublicKeys | None = None,
        result_keys: PublicKeys | None = None,
        executor_keys: PublicKeys | None = None,
        seal: Seal | None = None,
        max_nodes_per_job: int = MAX_NODES_PER_JOB,
        limits: LifecycleLimits | None = None,
        max_pending_jobs: int = 1024,
        pending_ttl_s: float = 300.0,
        telemetry: TelemetryVerifier | None = None,
        on_refused: Callable[[str, str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if n_partitions < 1:
            raise ValueError("n_partitions must be >= 1")
        if snapshot_steps < 1:
            raise ValueError("snapshot_steps must be >= 1")
        if snapshot_interval_s <= 0:
            raise ValueError("snapshot_interval_s must be positive")
        if not 0 < snapshot_budget <= 1:
            raise ValueError("snapshot_budget must be in (0, 1]")
        if not 0 < event_rate <= 1000:
            raise ValueError("event_rate must be in (0, 1000]")
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
        self.snapshot_budget = snapshot_budget
        self.event_rate = event_rate
        self.max_message_bytes = max_message_bytes
        self.detector_config = detector_config
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
        self.max_nodes_per_job = max_nodes_per_job
        self.limits = limits
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
        self.seal = seal
        self.unsealed = 0  #: internal records and snapshots the worker did not write
        self.telemetry = telemetry
        self.on_refused = on_refused
        self.refused_proof = 0  #: telemetry records without their writer's proof
        #: jobs named by health or a start event only, until their first step
        self.pending: PendingJobs[JobState] = PendingJobs(max_pending_jobs, pending_ttl_s,
                                                          clock)  # fmt: skip

    # -- state --------------------------------------------------------------------------
    def state(
        self, job_id: str, load: Callable[[str], bytes | None], *, confirm: bool = True
    ) -> JobState:
        """The job's live state: cached, else the table's snapshot, else a new one.

        Only a step confirms a job (``confirm``): a job that health reports or a start
        event name, and that has no snapshot, is *pending* (:mod:`pipeline.services.worker.pending`:
        bounded, expiring, not counted against ``max_jobs``, its records acked at once)
        until its first step arrives."""
        st = self.jobs.get(job_id)
        if st is not None:
            return st
        if not confirm:
            held = self.pending.get(job_id)
            if held is not None:
                return held
        blob = None if job_id in self.pending else self._snapshot(job_id, load)
        if blob is None and not confirm:  # named, not proven: pending, never counted
            return self.pending.get_or_add(job_id, self._new_state_pending)
        if len(self.jobs) >= self.max_jobs:
            raise CapacityError(
                f"worker holds {len(self.jobs)} jobs, STEPGUARD_WORKER_MAX_JOBS="
                f"{self.max_jobs}: job {job_id} is not taken on"
            )
        st = self.pending.pop(job_id)
        if st is not None:  # its first step: a job from now on
            st.confirmed = True
            st.active_wall = st.last_snapshot_wall = self.clock()
            self.jobs[job_id] = st
            return st
        st = self._read(job_id, blob) if blob is not None else None
        if st is not None:
            self._resume(st)
        else:
            st = self._new_state(job_id)
        self.jobs[job_id] = st
        return st

    def _snapshot(self, job_id: str, load: Callable[[str], bytes | None]) -> bytes | None:
        """The job's snapshot in the table, or None: no entry, or the mark of its end
        (:mod:`pipeline.services.worker.ended`), which a newer run does not resume."""
        blob = load(job_id)
        if blob is not None and read_mark(job_id, blob, self.seal) is not None:
            return None
        return blob

    def _new_state(self, job_id: str) -> JobState:
        return JobState(
            job_id,
            JobDetection(
                job_id,
                self.detector_config,
                max_ranks=self.max_ranks_per_job,
                max_nodes=self.max_nodes_per_job,
                limits=self.limits,
            ),
            last_snapshot_wall=self.clock(),
            active_wall=self.clock(),
        )

    def _new_state_pending(self, job_id: str) -> JobState:
        st = self._new_state(job_id)
        st.confirmed = False
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
        st.resumed_wall = wall
        st.last_snapshot_wall = wall
        now = st.now_estimate(wall, self.event_rate)
        if now is not None:
            st.detection.resume(now + self.blind_after_s)

    def _read(self, job_id: str, blob: bytes) -> JobState | None:
        """A snapshot from the table, or None when it is unreadable: logged, counted,
        and the job's state is rebuilt from the records replayed after it."""
        if self.seal is not None:
            opened = self.seal.open("snapshot", blob, job=job_id)
            if opened is None:
                self.unsealed += 1
                self.unreadable_snapshots += 1
                log.error("snapshot of job %s was not written by a worker of this group "
                          "(unsealed): starting it afresh", job_id)  # fmt: skip
                return None
            blob = opened
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
        self.pending.drop(lambda st: st.partition not in gone and st.partition >= 0)
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
            "unsealed": self.unsealed,
            "refused_proof": self.refused_proof,
            "pending_expired": self.pending.expired + self.pending.evicted,
        }

    def job_states(self) -> dict[str, int]:
        """How many jobs held are in each state (:attr:`JobDetection.state`): a job
        relaunching is shown as such, not as silent (metrics)."""
        counts = dict.fromkeys(JOB_STATES, 0)
        for st in self.jobs.values():
            state = st.detection.state
            counts[state] = counts.get(state, 0) + 1
        return counts

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
        headers: Headers | None = None,
    ) -> Handled:
        """One StepTelemetry record from the steps topic (``headers``: its proofs)."""
        self._saw_record()
        taken = self._step(partition, offset, key, value, token, load, None, headers)
        if isinstance(taken, Handled):
            return taken
        st, out = taken
        return self._finish(st, out, token)

    def handle_steps(
        self,
        partition: int,
        records: Iterable[tuple[Any, ...]],
        token: Any,
        load: Callable[[str], bytes | None] = lambda _: None,
    ) -> list[Handled]:
        """A fetch's records of one steps partition, ``(offset, key, value[, headers])``
        in offset order, each as :meth:`handle_step` handles it; but a job's records share one
        :class:`Handled`, and whether its snapshot is due is asked once, after the last
        of them (the snapshot then covers them all). ``token`` stands for every record:
        it is released once per record."""
        self._saw_record()
        done: list[Handled] = []
        outs: dict[str, Handled] = {}
        taken: dict[str, tuple[JobState, int]] = {}
        for rec in records:
            offset, key, value = rec[0], rec[1], rec[2]
            try:
                headers = rec[3] if len(rec) > 3 else None
                got = self._step(partition, offset, key, value, token, load, outs, headers)
            except Exception:  # never let one record stop the batch
                log.exception("worker failed on %s[%d]@%d", self.topics.steps, partition,
                              offset)  # fmt: skip
                done.append(Handled(release=[token]))
                continue
            if isinstance(got, Handled):
                done.append(got)
                continue
            st = got[0]
            n = taken[st.job_id][1] if st.job_id in taken else 0
            taken[st.job_id] = (st, n + 1)
        for job_id, (st, n) in taken.items():
            done.append(self._finish(st, outs[job_id], token, n))
        return done

    def _step(
        self,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        token: Any,
        load: Callable[[str], bytes | None],
        outs: dict[str, Handled] | None,
        headers: Headers | None = None,
    ) -> tuple[JobState, Handled] | Handled:
        """Decode, take and detect one step record: its job's state and the Handled it
        added to (the job's in ``outs``, when a batch shares one), or the Handled of a
        record that goes no further (released, or dead-lettered)."""
        topic = self.topics.steps
        # the msgspec fast path takes common telemetry; pydantic decides the rest and
        # writes the dead letter's error
        msg: NodeStep | Handled | None = None
        if value is None or len(value) <= self.max_message_bytes:
            msg = decode_step(value)
        if msg is None:
            msg = self._decoded(StepTelemetry, value, topic, partition, offset, key, token)
        if isinstance(msg, Handled):
            return msg
        if self.telemetry is not None:  # a record speaks only for the nodes it proves
            problem = self.telemetry.nodes_problem(headers, value, message_nodes(msg))
            if problem is not None:
                letter = self._unproven(msg.node, problem, value, topic, partition, offset, key)
                return Handled(dead_letters=[letter], release=[token])
        ts = msg.ts_end.timestamp()
        st = self._take(msg.job_id, ts, topic, partition, offset, key, value, token, load)
        if isinstance(st, Handled):
            return st
        out = outs.get(msg.job_id) if outs is not None else None
        if out is None:
            out = Handled(job_id=msg.job_id)
            if outs is not None:
                outs[msg.job_id] = out
        wall = self.clock()
        st.active_wall = wall
        if st.last_event_ts is None or ts >= st.last_event_ts:
            if st.last_event_ts is not None and wall < st.resume_wall:
                # catching up after a takeover (:meth:`_resume`): a replayed step
                # arrived as long after the one before it as its event time says
                wall = min(wall, st.arrived_wall + (ts - st.last_event_ts))
            # bounded by what the job's frames support (issue 39): one record dated
            # ahead must not move the tick clock
            st.last_event_ts = max(st.last_event_ts or ts, st.detection.clock_at(ts))
            st.arrived_wall = wall
        st.dirty = True
        steps = out.steps
        try:
            out.add(st.detection.on_step(msg))
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
        st.steps_since_snapshot += out.steps - steps
        return st, out

    def _to_job(self, job_id: str, value: bytes | None, kind: str) -> Forward:
        """A record re-keyed to the partition that holds ``job_id``'s state, sealed
        as the ``kind`` of record the worker wrote (:mod:`pipeline.services.worker.seal`)."""
        payload = value or b""
        if self.seal is not None:
            payload = self.seal.seal(kind, payload)
        return Forward(job_id, partition_for(job_id, self.n_partitions), payload)

    def _unproven(
        self, node: str, problem: str, value: bytes | None, topic: str, partition: int,
        offset: int, key: bytes | None,
    ) -> DeadLetter:  # fmt: skip
        """The dead letter of a telemetry record without its writer's proof, counted
        per claimed node."""
        self.refused_proof += 1
        if self.on_refused is not None:
            self.on_refused(topic, node)
        return _dead_letter(value, f"unauthenticated: {problem}", topic, partition, offset,
                            key, "auth")  # fmt: skip

    def route_health(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None,
        headers: Headers | None = None,
    ) -> Forward | Rejected | None:  # fmt: skip
        """A health record: where to forward it (its job's partition), a dead letter
        (undecodable, or without its node's proof), or None when it names no job
        (counted in ``unrouted_health``)."""
        topic = self.topics.health
        msg = decode(
            NodeHealth, value, topic=topic, partition=partition, offset=offset,
            key=key, max_bytes=self.max_message_bytes,
        )  # fmt: skip
        if isinstance(msg, Rejected):
            return msg
        if self.telemetry is not None:
            problem = self.telemetry.nodes_problem(headers, value, [msg.node])
            if problem is None:  # a node's own old report, written again: not its word now
                problem = self.telemetry.replay_problem(topic, partition, offset, value or b"")
            if problem is not None:
                return Rejected(
                    self._unproven(msg.node, problem, value, topic, partition, offset, key)
                )
        if msg.job_id is None:
            self.unrouted_health += 1
            return None
        return self._to_job(msg.job_id, value, "health")

    def route_command(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None,
        headers: Headers | None = None,
    ) -> Forward | None:  # fmt: skip
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
        return self._to_job(msg.job_id, value, "command")

    def route_result(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None,
        headers: Headers | None = None,
    ) -> Forward | None:  # fmt: skip
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
        return self._to_job(msg.job_id, value, "result")

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

    def route_lifecycle(
        self, partition: int, offset: int, key: bytes | None, value: bytes | None,
        headers: Headers | None = None,
    ) -> Forward | Rejected:  # fmt: skip
        """A lifecycle event: forward it to its job's partition, or a dead letter
        (undecodable, or without the proof its kind needs: see ``telemetry``)."""
        topic = self.topics.lifecycle
        msg = decode(
            JobEvent, value, topic=topic, partition=partition, offset=offset,
            key=key, max_bytes=self.max_message_bytes,
        )  # fmt: skip
        if isinstance(msg, Rejected):
            return msg
        if self.telemetry is not None:
            problem = self.telemetry.lifecycle_problem(headers, value, msg)
            if problem is None:
                problem = self.telemetry.replay_problem(topic, partition, offset, value or b"")
            if problem is not None:
                claimed = msg.source or f"job:{msg.job_id}"
                return Rejected(
                    self._unproven(claimed, problem, value, topic, partition, offset, key)
                )
        return self._to_job(msg.job_id, value, "lifecycle")

    def adopt(self, job_id: str, blob: bytes, owned: set[int]) -> bool:
        """Load a job found in the table (after a restart) when its partition is ours."""
        if job_id in self.jobs or job_id in self.ended or len(self.jobs) >= self.max_jobs:
            return False
        mark = read_mark(job_id, blob, self.seal)
        if mark is not None:  # an ended job: its replayed records are the ended run's
            self._mark_ended(job_id, mark.end_ts)
            return False
        st = self._read(job_id, blob)
        if st is None or st.partition not in owned:
            return False
        self._resume(st)
        self.jobs[job_id] = st
        return True
