"""The records that reach a job by another key, re-keyed to the job's partition of the
worker's jobs topic. :class:`Routing` owns what may be forwarded there and what not:
a health report with its node's proof (one naming no job is counted and dropped), a
relaunching command the actuator signed and that has not expired, a SUCCEEDED result its
job's controller signed (or a relaunching executor's: :data:`RELAUNCHING_EXECUTORS`),
not dated beyond the wall clock, and a lifecycle event with the proof its kind needs.
What it forwards is sealed as the kind of record the worker wrote
(:mod:`pipeline.services.worker.seal`), so that the job agent reads back only what a
worker of its group routed. Bad health and lifecycle records are dead letters; bad
commands and results are their owners' to judge (the executors', the actuator's), so
they are only skipped.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from datetime import UTC, datetime

from pipeline.io.clockskew import future_dated
from pipeline.io.trust import check_command, result_problem
from pipeline.services.worker.admission import Admission
from pipeline.services.worker.book import JobBook
from pipeline.services.worker.options import WorkerConfig
from pipeline.services.worker.records import Forward, Record, partition_for
from pipeline.services.worker.seal import health_kind
from schemas import Command, CommandResult, CommandStatus, JobEvent, NodeHealth, Rejected
from schemas.commands import RELAUNCHING

__all__ = ["RELAUNCHING_EXECUTORS", "Routing"]

log = logging.getLogger(__name__)

#: executors whose SUCCEEDED RESTART is a relaunch they carried out themselves (the
#: Slurm executor requeues the job); a dry run's "would restart" never is
RELAUNCHING_EXECUTORS = frozenset({"slurm"})


class Routing:
    """Health, commands, results and lifecycle events to their job (module docstring)."""

    def __init__(self, config: WorkerConfig, book: JobBook, admission: Admission) -> None:
        self.n_partitions = config.n_partitions
        self.max_message_bytes = config.capacity.max_message_bytes
        self.max_clock_skew_s = config.timing.max_clock_skew_s
        self.trust = config.trust
        self.clock = config.clock
        self.counts = book.counts
        self.admission = admission

    def to_job(self, job_id: str, value: bytes | None, kind: str) -> Forward:
        """A record re-keyed to the partition that holds ``job_id``'s state, sealed
        as the ``kind`` of record the worker wrote (:mod:`pipeline.services.worker.seal`)."""
        payload = value or b""
        if self.trust.seal is not None:
            payload = self.trust.seal.seal(kind, payload)
        return Forward(job_id, partition_for(job_id, self.n_partitions), payload, kind)

    def health(self, rec: Record) -> Forward | Rejected | None:
        """A health record: where to forward it (its job's partition), a dead letter
        (undecodable, or without its node's proof), or None when it names no job
        (counted in ``unrouted_health``)."""
        msg = rec.decode(NodeHealth, self.max_message_bytes)
        if isinstance(msg, Rejected):
            return msg
        telemetry = self.trust.telemetry
        if telemetry is not None:
            problem = telemetry.nodes_problem(rec.headers, rec.value, [msg.node])
            if problem is None:  # a node's own old report, written again: not its word now
                problem = telemetry.replay_problem(rec.topic, rec.partition, rec.offset,
                                                   rec.value or b"")  # fmt: skip
            if problem is not None:
                return Rejected(self.admission.unproven(msg.node, problem, rec))
        if msg.job_id is None:
            self.counts.unrouted_health += 1
            return None
        # its kind names the partition it came by: the job judges a node's silence only
        # as far as that partition's reader has delivered (:func:`health_kind`)
        routed = self.to_job(msg.job_id, rec.value, health_kind(rec.partition))
        return replace(routed, ts=msg.ts.timestamp())

    def command(self, rec: Record) -> Forward | None:
        """A command: forward restarts, rollbacks and isolations to their job's partition
        (the job goes quiet while it relaunches) when the actuator signed them and they
        have not expired; None for anything else. Executors own bad commands (they
        dead-letter them), so an undecodable one is only skipped."""
        msg = rec.decode(Command, self.max_message_bytes)
        if isinstance(msg, Rejected) or msg.kind not in RELAUNCHING:
            return None
        now = datetime.fromtimestamp(self.clock(), UTC)
        problem = check_command(msg, self.trust.command_keys, now)
        if problem is not None:  # a forged relaunch must not put the hang clock in grace
            self.counts.refused_commands += 1
            log.warning("%s: not obeying %s %s: %s", rec.where, msg.kind.value,
                        msg.command_id, problem)  # fmt: skip
            return None
        return self.to_job(msg.job_id, rec.value, "command")

    def result(self, rec: Record) -> Forward | None:
        """An executor's result: forward a SUCCEEDED one to its job's partition (a
        relaunch carried out restarts the grace and its left-out nodes' episodes
        resolve) when an executor key signed it; None for anything else (a result no
        executor key signed is counted in ``refused_results``). Undecodable results
        are the actuator's to judge."""
        msg = rec.decode(CommandResult, self.max_message_bytes)
        if isinstance(msg, Rejected) or msg.status is not CommandStatus.SUCCEEDED:
            return None
        problem = self.result_problem(msg)
        if problem is not None:  # a forged success must not end a relaunch's episodes
            self.counts.refused_results += 1
            log.warning("%s: ignoring result of %s: %s", rec.where, msg.command_id,
                        problem)  # fmt: skip
            return None
        return self.to_job(msg.job_id, rec.value, "result")

    def result_problem(self, msg: CommandResult) -> str | None:
        """Why a result is not its job's controller's fresh word, or None."""
        problem = result_problem(msg, self.trust.result_keys, "job_controller")
        if (
            problem is not None
            and msg.executor in RELAUNCHING_EXECUTORS
            and result_problem(msg, self.trust.executor_keys, "executor") is None
        ):
            problem = None  # an executor that relaunches jobs itself (a Slurm requeue)
        if problem is None and self.max_clock_skew_s is not None:
            problem = future_dated(msg.ts, self.max_clock_skew_s, now=time.time())
        return problem

    def lifecycle(self, rec: Record) -> Forward | Rejected:
        """A lifecycle event: forward it to its job's partition, or a dead letter
        (undecodable, or without the proof its kind needs: see ``telemetry``)."""
        msg = rec.decode(JobEvent, self.max_message_bytes)
        if isinstance(msg, Rejected):
            return msg
        telemetry = self.trust.telemetry
        if telemetry is not None:
            problem = telemetry.lifecycle_problem(rec.headers, rec.value, msg)
            if problem is None:
                problem = telemetry.replay_problem(rec.topic, rec.partition, rec.offset,
                                                   rec.value or b"")  # fmt: skip
            if problem is not None:
                claimed = msg.source or f"job:{msg.job_id}"
                return Rejected(self.admission.unproven(claimed, problem, rec))
        return self.to_job(msg.job_id, rec.value, "lifecycle")
