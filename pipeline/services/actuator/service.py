"""``stepguard actuator``: the thin Kafka loop around :class:`~pipeline.policy.Policy`.

Start-up rebuilds the state from the actuator's own output before consuming anything:
the commands topic (issued ids, isolation ledger, cooldowns, spares used), the actions
topic (held approvals and past decisions), the decisions topic (the firing episodes of
worker-signed alerts it had consumed, within the policy's horizon: a WARNING firing
before the restart still confirms after it) and the control topic (mode and thresholds),
each read to the end it had at start however long that takes, with progress logged
(:func:`~pipeline.io.kafka.read_back`); what is past the policy's horizon is then
forgotten. Only commands and action records signed by an actuator key are restored
(others are counted, logged and ignored), and only control messages signed by an
operator key, newer than the last one applied, with an unseen ``change_id`` and no older
than ``STEPGUARD_CONTROL_MAX_AGE_S`` (live: against now; read back: against when it
reached the topic, so an old change published again is refused even when every newer one
has aged out of the topic) are applied, in the rebuild as afterwards (a replayed old
change is not applied again). The rebuild applies control state (mode, thresholds,
spares) in order but never replays a one-shot action: a ``reset_breaker`` closes no
breaker that tripped after it (breakers are reopened from the signed refusal that
tripped them). Alerts count only when a worker key signed them. A decision, approval or
control message dated more than ``STEPGUARD_MAX_CLOCK_SKEW_S`` beyond the actuator's
clock is a dead letter (stage ``clock``, its source coordinates; the message as decoded)
and never reaches the policy; in the rebuild a control message is judged against the
earlier of its broker time and now, so what was refused live is not applied after a
restart. Then it consumes decisions, approvals and control messages; for each poll it
lets time pass in the policy (holds expire, breakers close), publishes the signed
commands, action records and guardrail alerts, waits for the broker's acks and only then
commits the consumed offsets. A crash anywhere in between replays the poll, and the
rebuilt issued-set turns the replay into nothing.
"""

from __future__ import annotations

import logging
import os
import signal
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from kafka import KafkaProducer

from pipeline.io.clockskew import future_dated
from pipeline.io.kafka import (
    Decoded,
    assigned_consumer,
    consume_decoded,
    control_producer,
    create_topics,
    publish,
    read_back,
    registry_of,
)
from pipeline.io.metrics import ActuatorMetrics
from pipeline.io.settings import Settings
from pipeline.io.trust import public_keys, sign, signature_problem, signing_key
from pipeline.policy import Outcome, Policy, PolicyParams
from pipeline.services.actuator.acks import answer, started
from schemas import (
    ActionRecord,
    Alert,
    AlertKind,
    Approval,
    Command,
    ControlMessage,
    DeadLetter,
    encode,
)

__all__ = ["ACTUATOR_TOPICS", "Actuator", "ActuatorStats"]

log = logging.getLogger(__name__)

#: Topics the actuator reads or writes (created at start if missing).
ACTUATOR_TOPICS = (
    "decisions", "commands", "results", "approvals", "control", "actions", "acks", "deadletter",
)  # fmt: skip


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _hint(problem: str) -> str:
    """Why an operator's message was refused, with what to do about an unknown key."""
    if problem.startswith("unknown key id"):
        return (f"{problem}: the actuator trusts only the operator keys in its "
                "STEPGUARD_OPERATOR_PUBLIC_KEYS")  # fmt: skip
    return problem


@dataclass
class ActuatorStats:
    consumed: int = 0
    commands: int = 0
    records: int = 0
    alerts: int = 0
    ignored: int = 0
    #: alerts not signed by a worker key (recorded in the log, never acted on)
    unsigned_alerts: int = 0
    #: commands read back, approvals and control messages refused (signature, replay)
    refused: int = 0
    #: action records read back that no actuator key signed (ignored by the rebuild)
    unsigned_records: int = 0
    #: inputs dated beyond the clock + STEPGUARD_MAX_CLOCK_SKEW_S (dead letters; in the
    #: rebuild, control messages ignored)
    future_dated: int = 0


class Actuator:
    """Consume decisions/approvals/control, decide with the policy, publish, commit.

    Parameters
    ----------
    settings
        Needs ``actuator_private_key`` (commands are always signed) and
        ``worker_public_keys`` (alerts count only when a worker signed them);
        ``operator_public_keys`` verify approvals and control messages.
    clock
        Wall clock (tests may pin it).
    crash_after_publish
        Fault injection for the crash test: SIGKILL this process after the broker has
        acknowledged a poll's commands and before the offsets are committed.
    rebuild_batch
        Records per poll while reading the output topics back at start.
    metrics
        Where the counters go (:class:`~pipeline.io.metrics.ActuatorMetrics`; the CLI
        serves them on ``actuator_metrics_port``); default: a private registry.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        group_id: str | None = None,
        clock: Callable[[], datetime] = _utcnow,
        producer: KafkaProducer | None = None,
        crash_after_publish: bool = False,
        rebuild_batch: int = 500,
        metrics: ActuatorMetrics | None = None,
    ) -> None:
        self.metrics = metrics or ActuatorMetrics()
        self._key = signing_key(settings, "actuator", "the actuator")
        self._actuator_keys = public_keys(settings, "actuator")
        self._worker_keys = public_keys(settings, "worker", "the actuator (alerts)")
        self._operator_keys = public_keys(settings, "operator")
        self.settings = settings
        self.registry = registry_of(settings)
        self.policy = Policy(PolicyParams.from_settings(settings))
        self.stats = ActuatorStats()
        self._clock = clock
        self._group = group_id or f"{settings.consumer_group}.actuator"
        self._crash = crash_after_publish
        create_topics(settings, ACTUATOR_TOPICS)
        self._producer = producer or control_producer(settings)
        self._control_seen = -1
        #: event time and ids of the control messages applied (replay protection)
        self._control_ts: datetime | None = None
        self._control_ids: OrderedDict[str, None] = OrderedDict()
        self._evicted = 0
        #: records read back per topic at start
        self.rebuilt: dict[str, int] = {}
        self._consumer = assigned_consumer(
            settings,
            [self.registry.name(t) for t in ("decisions", "approvals", "control")],
            self._group,
        )
        #: per decisions partition, the next offset the actuator has yet to consume:
        #: only alerts before it are rebuilt (the rest are consumed, and decided, live)
        decisions = self.registry.name("decisions")
        self._decided_until = {
            tp.partition: self._consumer.committed(tp) or 0
            for tp in self._consumer.assignment()
            if tp.topic == decisions
        }
        self._rebuild(rebuild_batch)

    def _rebuild(self, batch: int) -> None:
        def replay(logical: str, apply: Callable[[Decoded], object]) -> None:
            n = 0
            for rec in read_back(self.settings, logical, max_poll_records=batch):
                apply(rec)
                n += 1
            self.rebuilt[logical] = n

        replay("commands", self._restore_command)
        replay("actions", self._restore_record)
        now = self._clock()
        # firing episodes (a WARNING still confirms after a restart), never acted on here
        replay("decisions", lambda rec: self._restore_alert(rec, now))
        # state (mode, thresholds, spares) in order; one-shot actions not replayed
        replay("control", lambda rec: self._control(rec, now, replay=True))
        self.policy.prune(now, full=True)
        self._evicted = self.policy.evicted
        if self.stats.refused or self.stats.unsigned_records:
            log.warning("rebuild: %d commands or control messages and %d action records not "
                        "signed by their writer's key were ignored", self.stats.refused,
                        self.stats.unsigned_records)  # fmt: skip
        log.info(
            "actuator rebuilt from %s: %d issued, %d held, mode %s; remembering %s",
            self.rebuilt, len(self.policy.issued), len(self.policy.held),
            self.policy.params.mode.value, self.policy.memory(),
        )  # fmt: skip

    def _restore_command(self, rec: Decoded) -> None:
        msg = rec.message
        assert isinstance(msg, Command)
        problem = signature_problem(msg, self._actuator_keys)
        if problem is not None:
            self.stats.refused += 1
            log.debug("not restoring command at %s[%d]@%d: %s",
                      rec.topic, rec.partition, rec.offset, problem)  # fmt: skip
            return
        self.policy.restore_command(msg)

    def _restore_record(self, rec: Decoded) -> None:
        msg = rec.message
        assert isinstance(msg, ActionRecord)
        problem = signature_problem(msg, self._actuator_keys)
        if problem is not None:
            self.stats.unsigned_records += 1
            log.warning("not restoring action record %s (%s) at %s[%d]@%d: %s",
                        msg.action_id, msg.state.value, rec.topic, rec.partition, rec.offset,
                        problem)  # fmt: skip
            return
        self.policy.restore_record(msg)

    def _restore_alert(self, rec: Decoded, now: datetime) -> None:
        """An alert read back from the decisions topic: its episode is rebuilt (first
        step, last update) when a worker key signed it, the actuator had consumed it
        (before its group's committed offset) and it reached the topic within the
        policy's horizon; nothing is decided."""
        msg = rec.message
        if not isinstance(msg, Alert) or msg.kind is AlertKind.GUARDRAIL:
            return
        if rec.offset >= self._decided_until.get(rec.partition, 0):
            return  # not consumed yet (or not committed before a crash): decided live
        written = rec.timestamp_ms / 1000 if rec.timestamp_ms > 0 else now.timestamp()
        if now.timestamp() - written > self.policy.horizon_s:
            return
        if signature_problem(msg, self._worker_keys) is None:
            self.policy.restore_alert(msg, now)

    def _too_old(self, ts: datetime, judged: datetime) -> str | None:
        """Why an operator's message dated ``ts`` is too old at ``judged``, or None."""
        age = (judged - ts).total_seconds()
        limit = self.settings.control_max_age_s
        if age <= limit:
            return None
        return f"dated {ts.isoformat()}, {age:.0f}s old (STEPGUARD_CONTROL_MAX_AGE_S={limit:.0f})"

    def _control(self, rec: Decoded, now: datetime, *, replay: bool = False) -> Outcome:
        msg = rec.message
        assert isinstance(msg, ControlMessage)
        if rec.offset <= self._control_seen:
            return Outcome(note="control already applied")
        self._control_seen = rec.offset
        if replay and (late := self._replayed_from_the_future(rec, now)) is not None:
            return late
        problem = signature_problem(msg, self._operator_keys)
        if problem is None:
            # live: against now; read back: against when it reached the topic (a change
            # old when it was applied stays applied; an old one published again is not)
            judged = now
            if replay and rec.timestamp_ms > 0:
                judged = min(now, datetime.fromtimestamp(rec.timestamp_ms / 1000, UTC))
            problem = self._too_old(msg.ts, judged)
        if problem is None and msg.change_id in self._control_ids:
            problem = f"change {msg.change_id} already applied (replay)"
        if problem is None and self._control_ts is not None and msg.ts <= self._control_ts:
            problem = f"not newer than the last change applied ({self._control_ts.isoformat()})"
        if problem is not None:
            self.stats.refused += 1
            log.warning("ignoring control %s from %s: %s", msg.change_id, msg.by, problem)
            return Outcome(note=f"control refused: {problem}", refusal=_hint(problem))
        self._control_ts = msg.ts
        self._control_ids[msg.change_id] = None
        while len(self._control_ids) > self.policy.params.max_tracked:
            self._control_ids.popitem(last=False)
        log.info("control %s by %s: %s", msg.change_id, msg.by, msg.reason or "(no reason)")
        return self.policy.on_control(msg, now, replay=replay)

    def _replayed_from_the_future(self, rec: Decoded, now: datetime) -> Outcome | None:
        """A control message read back that was dated too far ahead when it was
        written (judged against the earlier of its broker time and now: the live check
        refused it then, so the rebuild must not apply it now that its time has come)."""
        msg = rec.message
        assert isinstance(msg, ControlMessage)
        written = now.timestamp()
        if rec.timestamp_ms > 0:
            written = min(written, rec.timestamp_ms / 1000)
        problem = future_dated(msg.ts, self.settings.max_clock_skew_s, now=written)
        if problem is None:
            return None
        self.stats.future_dated += 1
        log.warning("rebuild: not applying control %s from %s at %s[%d]@%d: %s", msg.change_id,
                    msg.by, rec.topic, rec.partition, rec.offset, problem)  # fmt: skip
        return Outcome(note=f"control refused: {problem}")

    def future_letter(self, rec: Decoded, now: datetime) -> DeadLetter | None:
        """The dead letter of an input dated beyond ``now`` + the allowed skew, or None.

        Its ``raw`` is the message as decoded (unknown fields dropped), its source the
        record's topic, partition and offset."""
        ts = getattr(rec.message, "ts", None)
        if not isinstance(ts, datetime):
            return None
        problem = future_dated(ts, self.settings.max_clock_skew_s, now=now,
                               whose="the actuator's")  # fmt: skip
        if problem is None:
            return None
        self.stats.future_dated += 1
        log.warning("dead letter from %s[%d]@%d: %s %s", rec.topic, rec.partition, rec.offset,
                    type(rec.message).__name__, problem)  # fmt: skip
        return DeadLetter(
            source_topic=rec.topic, partition=rec.partition, offset=rec.offset,
            raw=encode(rec.message), error=problem[:2000], stage="clock", ts=now,
        )  # fmt: skip

    def handle(self, rec: Decoded) -> Outcome:
        """One decoded input to an outcome (no I/O)."""
        now = self._clock()
        msg = rec.message
        if isinstance(msg, Alert):
            problem = signature_problem(msg, self._worker_keys)
            if problem is not None:
                if msg.kind is AlertKind.GUARDRAIL and (
                    signature_problem(msg, self._actuator_keys) is None
                ):
                    return Outcome(note="own guardrail alert")
                self.stats.unsigned_alerts += 1
                log.warning("not acting on alert %s#%d of %s at %s[%d]@%d: %s",
                            msg.fingerprint, msg.seq, msg.job_id, rec.topic, rec.partition,
                            rec.offset, problem)  # fmt: skip
                return Outcome(note=f"alert refused: {problem}")
            out = self.policy.on_alert(msg, now)
            if msg.step is not None:  # every update shows the job's progress
                out.extend(self.policy.on_progress(msg.job_id, msg.step, msg.ts, now))
            return out
        if isinstance(msg, Approval):
            problem = signature_problem(msg, self._operator_keys) or self._too_old(msg.ts, now)
            if problem is not None:
                self.stats.refused += 1
                log.warning("ignoring approval of %s by %s: %s", msg.action_id, msg.by, problem)
                return Outcome(note=f"approval refused: {problem}", refusal=_hint(problem))
            return self.policy.on_approval(msg, now)
        if isinstance(msg, ControlMessage):
            return self._control(rec, now)
        return Outcome(note=f"unexpected {type(msg).__name__}")

    def _publish(self, out: Outcome) -> list[Any]:
        futures = []
        for alert in out.alerts:
            signed = sign(alert, self._key)  # the actuator's, not a worker's: not acted on
            futures.append(publish(self._producer, self.registry, "decisions", signed))
            log.warning("guardrail: %s", alert.summary)
            self.metrics.guardrail_alerts.inc()
        for record in out.records:
            signed_record = sign(record, self._key)  # the rebuild restores only these
            futures.append(publish(self._producer, self.registry, "actions", signed_record))
            log.info("action %s %s: %s", record.action_id, record.state.value, record.detail)
            self.metrics.actions.labels(record.mode.value, record.state.value).inc()
        for issued in out.issued:  # carried out at once: commands, no record of its own
            self.metrics.actions.labels(issued.mode.value, "issued").inc()
        for cmd in out.commands:
            futures.append(publish(self._producer, self.registry, "commands", sign(cmd, self._key)))
            log.info("command %s %s %s", cmd.command_id, cmd.kind.value, cmd.targets)
            self.metrics.commands.labels(cmd.kind.value).inc()
        self.stats.commands += len(out.commands)
        self.stats.records += len(out.records)
        self.stats.alerts += len(out.alerts)
        return futures

    def _answer(self, rec: Decoded, out: Outcome) -> list[Any]:
        """Publish the answer to an operator's message (:mod:`.acks`), if it is one."""
        ack = answer(rec.message, (rec.topic, rec.partition, rec.offset), out,
                     self.policy.params, self._clock())  # fmt: skip
        if ack is None:
            return []
        log.info("answered %s %s by %s: %s %s", ack.request, ack.subject, ack.by,
                 ack.outcome.value, ack.detail)  # fmt: skip
        return [publish(self._producer, self.registry, "acks", sign(ack, self._key))]

    def announce(self) -> None:
        """Say which mode this actuator runs in (``stepguard pending`` reads it)."""
        ack = sign(started(self.policy.params, self._clock()), self._key)
        publish(self._producer, self.registry, "acks", ack).get(timeout=30)

    def poll_once(self, timeout_ms: int = 500) -> int:
        """One poll: decide, publish, wait for acks, commit. Returns records consumed."""
        futures: list[Any] = []
        n = 0
        for rec in consume_decoded(self._consumer, self.registry, self._producer, timeout_ms):
            n += 1
            refused = self._refused()
            letter = self.future_letter(rec, self._clock())
            if letter is not None:  # never reaches the policy; committed with the rest
                futures.append(publish(self._producer, self.registry, "deadletter", letter))
                late = Outcome(note="dated in the future", refusal=letter.error)
                self._count_input(rec, late, refused)
                futures += self._answer(rec, late)
                continue
            out = self.handle(rec)
            futures += self._answer(rec, out)
            self._count_input(rec, out, refused)
            if not (out.commands or out.records or out.alerts):
                self.stats.ignored += 1
                log.debug("%s[%d]@%d: %s", rec.topic, rec.partition, rec.offset, out.note)
            futures += self._publish(out)
        futures += self._publish(self.policy.on_tick(self._clock()))  # holds expire
        if self.policy.evicted > self._evicted:
            log.warning(
                "actuator memory at its cap (%d entries per map): %d entries dropped "
                "before their time; remembering %s", self.policy.params.max_tracked,
                self.policy.evicted - self._evicted, self.policy.memory(),
            )  # fmt: skip
            self._evicted = self.policy.evicted
        for fut in futures:
            fut.get(timeout=30)  # acknowledged by the broker before the commit
        if self._crash and futures:
            os.kill(os.getpid(), signal.SIGKILL)
        self._consumer.commit()
        self.stats.consumed += n
        memory = self.policy.memory()
        self.metrics.held.set(memory["held"])
        self.metrics.breakers_open.set(memory["breakers"])
        now = self._clock()
        ages = [(now - r.ts).total_seconds() for r in self.policy.held]
        self.metrics.oldest_held.set(max(ages, default=0.0))
        self.metrics.readiness.polled()
        return n

    def _count_input(self, rec: Decoded, out: Outcome, refused_before: int) -> None:
        """Metrics of one input: its topic; an alert's grade and what came of it."""
        m = self.metrics
        m.inputs.labels(self.registry.logical_of(rec.topic) or rec.topic).inc()
        refused = self._refused() > refused_before
        msg = rec.message
        if isinstance(msg, Alert):
            acted = bool(out.commands or out.records or out.alerts)
            result = "refused" if refused else "acted" if acted else "ignored"
            m.alerts.labels(msg.grade.value, result).inc()
        elif refused:
            m.refused.inc()

    def _refused(self) -> int:
        return self.stats.refused + self.stats.unsigned_alerts + self.stats.future_dated

    def run(self, stop: Callable[[], bool]) -> ActuatorStats:
        self.announce()
        while not stop():
            self.poll_once()
        return self.stats

    def close(self) -> None:
        self._consumer.close()
        self._producer.flush()
        self._producer.close()
