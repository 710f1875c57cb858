"""The one detection core: a job's records in, graded alerts and state out.

Every driver of detection goes through :class:`JobDetection`: the worker's agents
(``stepguard worker``, via :mod:`pipeline.services.worker.state`), ``stepguard demo``,
``stepguard compare``, the detection benchmarks and the tests. It knows nothing of
brokers, partitions, offsets or wall clocks: drivers decode records, call it, and send
what it returns. The pure detectors stay in :mod:`detectors`; this module only decides
*in which order* they see a job's records.

Ordering policy
---------------
Records of one job reach a driver out of event-time order (steps and health travel on
different topics and partitions; a node's telemetry of one step arrives as several
messages). The core restores one order, on event time:

1. **Steps are assembled first.** Per-node step messages become one frame per step
   (:class:`~detectors.assembly.StepAssembler`: complete when every recent node has
   reported it, or forced out once the job has gone ``lag_steps`` steps and ``lag_s``
   seconds of event time past it; a step number seen again
   with a newer event time is a relaunch).
2. **Health waits for the steps to pass it.** A report is held until a frame ends at or
   after its event time (processed just before it) or a tick reaches it (the job is
   stalled: it moves the clock to its time, as far as :meth:`~JobDetection.clock_at`
   lets), so it cannot make a job look hung while its steps are in flight. It updates
   its node's presence and signals; the clock check runs once for the reports a call
   releases (an overflow of the hold: at the next call), not once per report. When
   it *arrived* (the core's event time then) is noted at once
   (:meth:`~detectors.hang.presence.HealthPresence.arrived`): a node is silent only while
   its own reports stop, and a backlog arriving late is not silence.
3. **A frame is scored, then the clock is checked at its end time.** A long step
   that just ended (a checkpoint save) is progress, not a hang.
4. **Ticks check the clock** at an event time the driver estimates (the worker:
   newest step time, bounded by :meth:`~JobDetection.clock_at`, plus the wall time
   since it arrived). A tick never goes back in time. A step's time is its nodes'
   robust time (:func:`~detectors.frame.step_times`): one node's clock cannot move it.
5. **Lifecycle events** are the exporter's word, unsigned, and never switch detection
   off alone (:mod:`detectors.job_guard`). An announced long phase (checkpoint,
   evaluation) gives the clock the phase's expected duration until the next step
   completes, cut to ``max_phase_s``. An end is pending (it holds the clock: the job
   said it stopped) until ``end_confirm_s`` of event time pass without a step after
   it, or :meth:`~JobDetection.flush`; then every open episode resolves ("job ended:
   <reason>") and the job is :attr:`~JobDetection.ended`: drivers drop its state. A
   step after it refuses it. Refusals and cuts are ``lifecycle`` WARNINGs. An event
   other than a start that comes before the job's first step is held (at most
   ``MAX_HELD_EVENTS``) until that step confirms the job, then judged.
6. **Relaunches come from commands.** A RESTART, ROLLBACK or ISOLATE for the job
   makes it *relaunching* at the current event time (the job goes quiet while it
   relaunches) until the new run's first step, for at most the suite's
   ``relaunch_max_s`` (then ``relaunch_stuck``: investigate, never a RESTART); the
   executor's SUCCEEDED result for a RESTART or ROLLBACK confirms it (the relaunch
   is still dated from the command). Step numbers going back with a newer event time
   are a relaunch too (rule 1).

7. **Health judges members only.** A report of a node that is not a member of the job
   (seen in its steps, or declared by its start event) never reaches the detectors,
   so it cannot lead to isolating that node: one INFO notice per node instead.

8. **A record speaks only for its own node's ranks.** A rank belongs to the first node
   that reported it; while that node still reports (it is in the job's latest step) the
   rank does not move, and a step record of another node carrying it is refused
   (:class:`~detectors.errors.RefusedRecord`), so no node joins the job on the strength
   of another's ranks. A rank far beyond those the job has shown (more than twice its
   highest, once a step was assembled) is refused too, and so is a step number further
   ahead of the job's last step than the assembler's ``max_lag_steps`` strides (it
   would force the job's steps out and shrink its nodes). Each refused node is named in a
   WARNING (``guardrail``, metric ``refused_records``): its problem, not the job's.
   Ownership starts afresh when the job relaunches (ranks move to new hardware); a
   node a relaunching command took out holds nothing from then (its result may be late).

Everything kept is bounded: held health and remembered commands (``max_held_health``,
``max_commands``: beyond them the oldest report is processed at once, the oldest
command forgotten), the ranks and nodes of the job (``max_ranks``, ``max_nodes``: a
message that would add more is refused with :class:`~detectors.errors.CapacityError`
before anything grows).

Examples
--------
>>> from pipeline.tools.simulator import Scenario, simulate
>>> sc = Scenario.model_validate({"name": "ex", "nodes": 8, "steps": 80, "seed": 1,
...     "faults": [{"kind": "straggler", "node": 3, "gpu": 2, "onset_step": 40,
...                 "magnitude": 0.3}]})
>>> det = JobDetection(sc.job)
>>> alerts = []
>>> for ev in simulate(sc):
...     for h in ev.health:
...         alerts += det.on_health(h)
...     if ev.frame is not None:
...         for msg in ev.frame.to_messages():
...             alerts += det.on_step(msg).alerts
...     alerts += det.tick(ev.ts)
>>> alerts += det.flush()
>>> sorted({(a.kind.value, a.node) for a in alerts if a.state.value == "firing"})
[('straggler', 'node-0003')]
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Protocol

import numpy as np

from detectors.assembly import StepAssembler
from detectors.engine import DetectorConfig, DetectorSuite
from detectors.errors import CapacityError, RefusedRecord
from detectors.frame import NodeStep, StepFrame
from detectors.framing import rank_array, rank_key, sample_nodes
from detectors.job_guard import JobGuard, LifecycleLimits, PendingEnd
from schemas import (
    Alert,
    AlertKind,
    AlertState,
    Command,
    CommandKind,
    CommandResult,
    CommandStatus,
    Evidence,
    Grade,
    JobEvent,
    JobEventKind,
    NodeHealth,
    RecommendedAction,
    episode_fingerprint,
)
from schemas.commands import RELAUNCHING
from schemas.lifecycle import MAX_NODES_PER_JOB
from schemas.telemetry import MAX_RANKS_PER_JOB

__all__ = ["JOB_STATES", "Detected", "Detectors", "JobDetection"]

#: What :attr:`JobDetection.state` may say (the worker's ``jobs_by_state`` gauge).
JOB_STATES = ("running", "relaunching", "relaunch_stuck", "ending")

#: Commands whose SUCCEEDED result means the job was relaunched just now.
_RELAUNCHED = frozenset({CommandKind.RESTART, CommandKind.ROLLBACK})
#: most nodes remembered as having sent steps of one job (oldest first out)
MAX_STEP_NODES = 4096
#: lifecycle events held before the job's first step (more are dropped)
MAX_HELD_EVENTS = 16


class Detectors(Protocol):
    """What the core drives: :class:`~detectors.engine.DetectorSuite`, or a stand-in with
    the same calls (the detection benchmark scores oracles and baselines this way)."""

    def process_step(self, frame: StepFrame) -> list[Alert]: ...
    def process_health(self, msg: NodeHealth) -> list[Alert]: ...
    def tick(self, now: float) -> list[Alert]: ...
    def restarted(self, now: float, removed_nodes: Iterable[str] = ()) -> None: ...
    def announce_phase(
        self,
        phase: str,
        ts: float,
        expected_s: float | None,
        after_step: int | None = None,
        *,
        max_s: float | None = None,
    ) -> None: ...
    def wait_for_input(self, ts: float, after_step: int, *, max_s: float | None = None) -> None: ...
    def close(self, why: str, ts: float, node: str | None = None) -> list[Alert]: ...


@dataclass(slots=True)
class Detected:
    """What one step message caused: alert updates and the frames it completed."""

    alerts: list[Alert] = field(default_factory=list)
    frames: list[StepFrame] = field(default_factory=list)


class JobDetection:
    """Detection of one job, broker-free and deterministic.

    Parameters
    ----------
    job_id
        The job; records of other jobs are refused with ``ValueError``.
    config
        Detector thresholds (:class:`~detectors.engine.DetectorConfig` defaults).
    suite
        Detectors to drive instead of a new :class:`~detectors.engine.DetectorSuite`
        (benchmarks and tests that vary them); ``config`` must then be omitted.
    lag_steps
        A step is assembled without its missing nodes once a message ``lag_steps``
        steps later arrived.
    max_held_health
        Health reports held while ahead of the steps; the oldest is processed at
        once beyond it.
    max_commands
        Relaunching commands remembered to match their results.
    max_ranks
        Distinct ranks the job may have (at most the schema's ``MAX_RANKS_PER_JOB``).
    max_nodes
        Distinct nodes the job may have (at most ``MAX_NODES_PER_JOB``).
    limits
        How far lifecycle events are trusted
        (:class:`~detectors.job_guard.LifecycleLimits`).

    The whole object is plain data: :mod:`pipeline.io.statecodec` writes and reads it
    (the worker stores it in its changelog).
    """

    #: class defaults: state written before the setting existed reads them from here
    max_result_age_s: float = 600.0
    _clock_due: float | None = None  #: a clock check owed at this time (rule 2)

    def __init__(
        self,
        job_id: str,
        config: DetectorConfig | None = None,
        *,
        suite: Detectors | None = None,
        lag_steps: int = 2,
        max_held_health: int = 4096,
        max_commands: int = 256,
        max_ranks: int = MAX_RANKS_PER_JOB,
        max_nodes: int = MAX_NODES_PER_JOB,
        limits: LifecycleLimits | None = None,
        max_result_age_s: float = 600.0,
    ) -> None:
        if suite is not None and config is not None:
            raise ValueError("give either config or suite, not both")
        if max_held_health < 0:
            raise ValueError(f"max_held_health must be >= 0, got {max_held_health!r}")
        if max_commands < 1:
            raise ValueError(f"max_commands must be >= 1, got {max_commands!r}")
        if not 1 <= max_ranks <= MAX_RANKS_PER_JOB:
            raise ValueError(f"max_ranks must be in [1, {MAX_RANKS_PER_JOB}], got {max_ranks!r}")
        self.job_id = job_id
        self.suite: Detectors = suite if suite is not None else DetectorSuite(job_id, config)
        self.assembler = StepAssembler(lag_steps)
        self.max_held_health = max_held_health
        self.max_commands = max_commands
        self.max_ranks = max_ranks
        if not max_result_age_s > 0:
            raise ValueError(f"max_result_age_s must be positive, got {max_result_age_s!r}")
        #: a result dated this long before the job's event time is not acted on
        self.max_result_age_s = max_result_age_s
        #: why the job ended (an END event, or "abandoned"); None while it runs
        self.ended: str | None = None
        self.ended_at: float | None = None  #: event time of a confirmed end
        #: the job's members and the trust its lifecycle events get (rules 5 and 7)
        self.guard = JobGuard(job_id, limits, max_nodes)
        self._ranks = np.zeros(0, dtype=bool)
        self._n_ranks = 0
        #: the newest event time the core has processed (frames, health, ticks)
        self.now: float | None = None
        #: frames processed, and relaunches carried out (results, :meth:`relaunched`)
        self.frames = 0
        self.relaunches = 0
        self._held: list[tuple[float, int, NodeHealth]] = []
        self._seq = 0  #: arrival order of held reports (ties on event time)
        self._commands: OrderedDict[str, Command] = OrderedDict()
        #: nodes that sent steps of the job, oldest first (at most MAX_STEP_NODES)
        self._step_nodes: OrderedDict[str, None] = OrderedDict()
        self._orphans: OrderedDict[str, CommandResult] = OrderedDict()
        #: commands whose SUCCEEDED result was acted on (once each; at most max_commands)
        self._acted: OrderedDict[str, None] = OrderedDict()
        self._owners = _RankOwners()

    # -- inputs ------------------------------------------------------------------------
    def on_step(self, msg: NodeStep) -> Detected:
        """One node's telemetry of one step: the alerts of the frames it completed."""
        self._check_job(msg.job_id)
        last = self.last_step
        reach = self.assembler.max_lag_steps * self._stride()
        if self.frames and msg.step > last + reach:
            refusals = self._refusals()
            if not refusals.jumped(
                msg.node, msg.step, last, reach, self.assembler.reporting(self.job_id)
            ):
                why = (
                    f"node {msg.node} reports step {msg.step} while the job completed step "
                    f"{last}: too far ahead of the job's progress, refused"
                )
                self._note(msg, why)
                raise RefusedRecord(why)
        owners = self._rank_owners()
        if not owners.same(msg):
            suite = self.suite if isinstance(self.suite, DetectorSuite) else None
            left = suite.nodes.removed if suite is not None else frozenset()
            try:
                owners.check(msg, self.assembler.reporting(self.job_id), assembled=self.frames > 0,
                             declared=msg.node in self.guard.members, left=left)  # fmt: skip
            except RefusedRecord as exc:
                self._note(msg, str(exc))
                raise
            self._count_ranks(msg)
            self.guard.join(msg.node)
            owners.take(msg)
        out = Detected(alerts=self._take_notes())
        return self._frames(self.assembler.add(msg), out)

    def on_frame(self, frame: StepFrame) -> list[Alert]:
        """One assembled step (rules 2 and 3): held health up to its end time, the
        step, then the clock at its end time."""
        self._check_job(frame.job_id)
        prev = self.__dict__.get("_prev_step")
        if prev is not None and frame.step > prev:
            self._step_stride = frame.step - prev
        self._prev_step = frame.step
        self.guard.learn(frame.nodes)
        self._saw_nodes(frame.nodes)  # the check owed, then a step after an end:
        alerts = self._check_clock() + self.guard.contradict(frame.step, frame.ts)
        alerts += self._release_health(frame.ts, tick=False)
        alerts += self.suite.process_step(frame)
        alerts += self._tick_suite(frame.ts)
        self._advance(frame.ts)
        self.frames += 1
        held = self.__dict__.get("_events_held")
        if held:  # the job's first step confirms it: what it said before counts now
            self._events_held: list[JobEvent] = []
            for event in held:
                alerts += self.on_lifecycle(event)
        return self._stamp(alerts)

    def on_health(self, msg: NodeHealth, path: int | None = None) -> list[Alert]:
        """A node's health report (by ``path``: :meth:`delivered`), held until the steps
        or a tick pass its event time (rule 2); returns what an overflow released."""
        if msg.job_id is not None:
            self._check_job(msg.job_id)
        if self.now is not None and isinstance(self.suite, DetectorSuite):
            # when it reached us, not when it is ordered in: a late backlog is not silence
            presence, ts = self.suite.presence, msg.ts.timestamp()
            presence.arrived(msg.node, ts, self.now, msg.interval_s, path)
        self._seq += 1
        heapq.heappush(self._held, (msg.ts.timestamp(), self._seq, msg))
        alerts: list[Alert] = []
        while len(self._held) > self.max_held_health:
            hts, _, h = heapq.heappop(self._held)
            alerts += self._health(hts, h, tick=True)
        return self._stamp(alerts)

    def on_command(self, cmd: Command, now: float | None = None) -> list[Alert]:
        """A command for the job: a relaunching one makes it relaunching from event
        time ``now`` (default: the core's current event time) (rule 5)."""
        self._check_job(cmd.job_id)
        if cmd.kind not in RELAUNCHING:
            return []
        self._remember(self._commands, cmd.command_id, cmd)
        self._grace(now, cmd.targets)
        orphan = self._orphans.pop(cmd.command_id, None)
        return self.on_result(orphan) if orphan is not None else []

    def on_result(self, result: CommandResult) -> list[Alert]:
        """The job controller's result (drivers pass only results its own job's
        controller signed): a RESTART or ROLLBACK carried out restarts the grace now,
        and the episodes of the nodes it left out resolve (they left the job). A result
        that arrives before its command waits for it. Acted on once per command (a
        replayed result changes nothing) and only while fresh: one dated more than
        ``max_result_age_s`` before the job's event time is ignored."""
        self._check_job(result.job_id)
        cmd = self._commands.get(result.command_id)
        if cmd is None:
            self._remember(self._orphans, result.command_id, result)
            return []
        if result.status is not CommandStatus.SUCCEEDED or cmd.kind not in _RELAUNCHED:
            return []
        acted = self._acted_results()
        if result.command_id in acted:
            return []  # once per command: a replay does not restart the grace
        if self.now is not None and result.ts.timestamp() < self.now - self.max_result_age_s:
            return []
        self._remember(acted, result.command_id, None)
        self.relaunched(removed_nodes=cmd.targets)
        # the nodes it left out are out of the job: their episodes end with them
        at = self.now if self.now is not None else result.ts.timestamp()
        why = f"{', '.join(cmd.targets)} left the job ({cmd.kind.value} {cmd.command_id})"
        return [a for node in cmd.targets for a in self.suite.close(why, at, node=node)]

    def relaunched(self, now: float | None = None, removed_nodes: Iterable[str] = ()) -> None:
        """The job relaunches at event time ``now`` (default: the current event time),
        perhaps without ``removed_nodes``: step numbers may repeat and its silence is
        not a hang while it relaunches (:attr:`state`)."""
        self._grace(now, removed_nodes)
        self.relaunches += 1
        self._rank_owners().clear()  # the new run may place its ranks anew

    def delivered(self, marks: Iterable[tuple[int, float | None]]) -> None:
        """Health paths' watermarks (:meth:`.HealthPresence.delivered`; None: job clock)."""
        if (now := self.now) is not None and isinstance(self.suite, DetectorSuite):
            for path, at in marks:
                self.suite.presence.delivered(path, now if at is None else min(now, at))

    def resume(self, at: float) -> None:
        """The pipeline, not the job, was away until about event time ``at`` (this state
        was restored from a snapshot after a takeover, or the broker was unreachable):
        the health reports it delayed are not silence, so silent nodes are judged from
        ``at`` on (:meth:`.HealthPresence.resume`). The hang clock is the driver's: it
        keeps running from the job's last step (:meth:`.Takeover.resume`)."""
        if isinstance(self.suite, DetectorSuite):
            self.suite.presence.resume(at)

    def on_lifecycle(self, event: JobEvent) -> list[Alert]:
        """A lifecycle event of the job (rules 5 and 7): a start's declared nodes
        join, a phase is announced, an end becomes pending; returns the lifecycle
        anomalies it raised (refused or cut short)."""
        self._check_job(event.job_id)
        if self.ended is not None:
            return []
        if self.frames == 0 and event.kind is not JobEventKind.START:
            # rule 5: no step of the job confirms it yet; held until its first step
            held = self._held_events()
            if len(held) < MAX_HELD_EVENTS:
                held.append(event)
            return []
        verdict = self.guard.on_event(event, self.now, self.last_step)
        max_s = self.guard.limits.max_phase_s  # it bounds an unsaid length too
        if verdict.phase is not None:
            self.suite.announce_phase(*verdict.phase, max_s=max_s)
        if verdict.wait is not None:
            self.suite.wait_for_input(*verdict.wait, max_s=max_s)
        return verdict.alerts

    @property
    def state(self) -> str:
        """The job's state at the core's event time: ``relaunching`` from a relaunching
        command until the new run's first step, ``relaunch_stuck`` once that took
        longer than the suite's ``relaunch_max_s``, ``ending`` while an end is pending,
        else ``running`` (:meth:`~detectors.engine.DetectorSuite.state`)."""
        if self.guard.ending is not None:
            return "ending"
        if self.now is None or not isinstance(self.suite, DetectorSuite):
            return "running"
        return self.suite.state(self.now)

    @property
    def ending(self) -> str | None:
        """Why the job says it ended, while that end is pending (rule 5)."""
        return None if self.guard.ending is None else self.guard.ending.reason

    def abandon(self, now: float, idle_s: float) -> list[Alert]:
        """The job went silent for ``idle_s`` seconds without an end: resolve its open
        episodes and say so in one INFO notice (a RESOLVED update of its own, so that
        nothing stays open downstream once the state is dropped)."""
        why = f"job abandoned: no record for {idle_s:.0f}s and no end or relaunch"
        alerts = [] if self.ended is not None else self.suite.close(why, now)
        alerts += self.guard.resolve(why, now, self.last_step)
        self.ended = "abandoned"
        at = datetime.fromtimestamp(now, UTC)
        step = max(self.last_step, 0)
        alerts.append(
            Alert(
                fingerprint=episode_fingerprint(
                    self.job_id, "abandoned", None, None, round(now * 1000)
                ),
                seq=0,
                kind=AlertKind.MISSING,
                grade=Grade.INFO,
                state=AlertState.RESOLVED,
                job_id=self.job_id,
                step=step,
                started_at=at,
                ts=at,
                evidence=Evidence(
                    metric="seconds_idle",
                    value=idle_s,
                    deviation=0.0,
                    detail=f"last step {self.last_step}; its detector state is dropped",
                ),
                recommended_action=RecommendedAction.NONE,
                summary=why,
            )
        )
        return alerts

    def tick(self, now: float) -> list[Alert]:
        """The clock at event time ``now`` (rule 4): held health up to ``now``, then
        hangs and silent nodes. A tick at or behind the current event time does
        nothing (that time was checked already)."""
        return self.tick_detected(now).alerts

    def tick_detected(self, now: float) -> Detected:
        """:meth:`tick`, with the frames the clock completed: buffered steps it is
        the assembler's ``lag_s`` past, and every buffered step when a pending end is
        confirmed (they were sent before it)."""
        out = self._frames(self.assembler.expire(now), Detected(alerts=self._take_notes()))
        if self.now is not None and now <= self.now:
            out.alerts += self._stamp(self._check_clock())  # one an overflow made due
            return out
        alerts = self._release_health(now, tick=True)
        if self.now is None or now > self.now:  # reports moved it no further than now
            self.now = self._clock_due = now
        out.alerts += self._stamp(alerts + self._check_clock())
        end = self.guard.due(now)
        if end is not None:
            self._frames(self.assembler.flush(), out)  # sent before the end
            out.alerts += self._stamp(self._end(end))
        return out

    def clock_at(self, ts: float) -> float:
        """The event time a step record dated ``ts`` lets the job's tick clock reach
        (rule 4): no further than the job's frames support, its newest processed time
        plus 1.5 median step times (the next step's records; the assembler's ``lag_s``
        before a step time is known). One record dated
        +290 s (inside the skew a worker accepts) otherwise moved the worker's tick
        clock ahead of the job, and the job was called hung while it kept stepping.

        >>> det = JobDetection("j")
        >>> det.clock_at(1000.0)          # no frame yet: nothing to bound it by
        1000.0
        >>> det.now = 100.0
        >>> det.clock_at(390.0), det.clock_at(101.0)     # lag_s before a step time
        (102.0, 101.0)
        """
        if self.now is None:
            return ts
        med = self.suite.hang.median_step_time if isinstance(self.suite, DetectorSuite) else None
        return min(ts, self.now + (1.5 * med if med else self.assembler.lag_s))

    def _frames(self, frames: list[StepFrame], out: Detected) -> Detected:
        """Process assembled ``frames`` in order, into ``out``."""
        for frame in frames:
            out.alerts += self.on_frame(frame)
            out.frames.append(frame)
        return out

    def flush(self) -> list[Alert]:
        """End of input: every buffered step, then every held report, then a pending
        end (nothing can contradict it any more)."""
        alerts = [a for frame in self.assembler.flush() for a in self.on_frame(frame)]
        alerts += self._release_health(float("inf"), tick=True) + self._check_clock()
        end, self.guard.ending = self.guard.ending, None
        return self._stamp(alerts + (self._end(end) if end is not None else []))

    def in_steps(self, node: str) -> bool:
        """Whether ``node`` sent steps of this job (the most recent
        :data:`MAX_STEP_NODES` nodes are remembered)."""
        return node in self._nodes_in_steps()

    # -- state -------------------------------------------------------------------------
    @property
    def held_health(self) -> int:
        """Health reports waiting for the steps to pass their event time."""
        return len(self._held)

    @property
    def last_step(self) -> int:
        """The last step the job completed (-1 before the first)."""
        return self.suite.last_step if isinstance(self.suite, DetectorSuite) else -1

    # -- internals ---------------------------------------------------------------------
    def _check_job(self, job_id: str) -> None:
        if job_id != self.job_id:
            raise ValueError(f"record of job {job_id!r} given to detection of {self.job_id!r}")

    def _count_ranks(self, msg: NodeStep) -> None:
        """Refuse a message that would take the job beyond ``max_ranks`` ranks."""
        ranks = rank_array(msg)
        if not ranks.size:
            return
        top = int(ranks.max())
        if top < self._ranks.shape[0] and bool(self._ranks[ranks].all()):
            return  # all counted before: a node's every step after its first
        if top >= MAX_RANKS_PER_JOB:
            raise CapacityError(f"rank {top} is beyond the schema's {MAX_RANKS_PER_JOB}")
        if top >= self._ranks.shape[0]:
            grown = np.zeros(min(MAX_RANKS_PER_JOB, max(top + 1, 2 * self._ranks.shape[0])), bool)
            grown[: self._ranks.shape[0]] = self._ranks
            self._ranks = grown
        new = int(np.count_nonzero(~self._ranks[ranks]))
        if self._n_ranks + new > self.max_ranks:
            raise CapacityError(
                f"job {self.job_id} would have {self._n_ranks + new} ranks, over "
                f"STEPGUARD_MAX_RANKS_PER_JOB={self.max_ranks}"
            )
        self._ranks[ranks] = True
        self._n_ranks += new

    def _held_events(self) -> list[JobEvent]:
        held: list[JobEvent] | None = self.__dict__.get("_events_held")
        if held is None:
            held = self._events_held = []
        return held

    def _tick_suite(self, at: float) -> list[Alert]:
        """The suite's clock at ``at``, told how far the job has stepped: a step most
        of its nodes reported is progress though one node's record of it is missing
        (refused, or that node died: the missing detector names it)."""
        if isinstance(self.suite, DetectorSuite):
            self.suite.stepping_at = self.assembler.progress(self.job_id)
        return self.suite.tick(at)

    def _stride(self) -> int:
        """Steps between the job's last two frames (at least 1): how step numbers move."""
        return max(1, int(self.__dict__.get("_step_stride", 1)))

    def _rank_owners(self) -> _RankOwners:
        owners: _RankOwners | None = self.__dict__.get("_owners")
        if owners is None:  # a snapshot from before rule 8
            owners = self._owners = _RankOwners()
        return owners

    def _refusals(self) -> _Refusals:
        refusals: _Refusals | None = self.__dict__.get("_refused")
        if refusals is None:
            refusals = self._refused = _Refusals(self.job_id)
        return refusals

    def _note(self, msg: NodeStep, why: str) -> None:
        """A refused record of ``msg.node``: its WARNING goes out with the next call."""
        noted: list[Alert] = self.__dict__.get("_noted") or []
        self._noted = noted + self._refusals().note(msg, why, max(self.last_step, 0))

    def _take_notes(self) -> list[Alert]:
        noted: list[Alert] = self.__dict__.get("_noted") or []
        self._noted = []
        return self._stamp(noted)

    def _acted_results(self) -> OrderedDict[str, None]:
        acted: OrderedDict[str, None] | None = self.__dict__.get("_acted")
        if acted is None:  # a snapshot from before this set existed
            acted = self._acted = OrderedDict()
        return acted

    def _nodes_in_steps(self) -> OrderedDict[str, None]:
        # a snapshot written before this set existed has none: start one
        nodes: OrderedDict[str, None] | None = self.__dict__.get("_step_nodes")
        if nodes is None:
            nodes = self._step_nodes = OrderedDict()
        return nodes

    def _saw_nodes(self, names: Iterable[str]) -> None:
        nodes = self._nodes_in_steps()
        new = [n for n in names if n not in nodes]
        for node in new:
            nodes[node] = None
        while len(nodes) > MAX_STEP_NODES:
            nodes.popitem(last=False)

    def _stamp(self, alerts: list[Alert]) -> list[Alert]:
        """Say on each alert naming a node whether that node sent steps of the job (the
        actuator isolates only such members; a health report can name any node)."""
        nodes = self._nodes_in_steps()
        return [
            a if a.node is None else a.model_copy(update={"node_in_steps": a.node in nodes})
            for a in alerts
        ]

    def _grace(self, now: float | None, removed_nodes: Iterable[str]) -> None:
        at = now if now is not None else self.now
        if at is not None:  # before the first record there is no clock to give grace on
            self.suite.restarted(at, removed_nodes=removed_nodes)

    def _advance(self, ts: float) -> None:
        if self.now is None or ts > self.now:
            self.now = ts

    def _release_health(self, until: float, *, tick: bool) -> list[Alert]:
        alerts: list[Alert] = []
        while self._held and self._held[0][0] <= until:
            hts, _, h = heapq.heappop(self._held)
            alerts += self._health(hts, h, tick=tick)
        return alerts

    def _health(self, hts: float, msg: NodeHealth, *, tick: bool) -> list[Alert]:
        if msg.node in self.guard.members:
            alerts = self.suite.process_health(msg)
        else:  # rule 7: not judged for the job, so never a reason to isolate the node
            alerts = self.guard.outsider(msg, max(self.last_step, 0))
        # its node's presence and signals only (O(1) in the job's size); it moves the clock
        # no further than the frames support (rule 4: one dated +290 s otherwise checked
        # the job for a hang 290 s after its last step) and owes one check for its batch
        at = self.clock_at(hts)
        if tick and (self.now is None or at >= self.now):
            self.now = self._clock_due = at  # one clock check owed for the batch
        return alerts

    def _check_clock(self) -> list[Alert]:  # owed at the newest time reports moved it to
        at, self._clock_due = self._clock_due, None  # a pending end holds the clock:
        return [] if at is None or self.guard.ending is not None else self._tick_suite(at)

    def _end(self, end: PendingEnd) -> list[Alert]:
        """A pending end confirmed: every open episode resolves."""
        self.ended, self.ended_at = end.reason, end.ts
        why, at = f"job ended: {end.reason}", max(end.ts, self.now or end.ts)
        return self.suite.close(why, at) + self.guard.resolve(why, at, self.last_step)

    def _remember(self, into: OrderedDict, key: str, value: object) -> None:  # type: ignore[type-arg]
        into[key] = value
        into.move_to_end(key)
        while len(into) > self.max_commands:
            into.popitem(last=False)


class _RankOwners:
    """Which node holds each rank of the job (rule 8); plain data for the state codec:
    an array of node indices by rank, so a job of 131k ranks keeps one int32 each."""

    def __init__(self) -> None:
        self.node_ranks: dict[str, tuple[int, ...]] = {}  #: each node's last rank set
        self.names: list[str] = []  #: node names by index
        self.index: dict[str, int] = {}
        self.owner = np.full(0, -1, dtype=np.int32)  #: node index by rank (-1: none)
        self.top = -1  #: highest rank of an admitted record

    def same(self, msg: NodeStep) -> bool:
        """The node reports the ranks it reported last time (the hot path)."""
        ranks = self.node_ranks.get(msg.node)
        return ranks is not None and ranks == rank_key(msg)

    def check(self, msg: NodeStep, reporting: frozenset[str], *, assembled: bool,
              declared: bool, left: frozenset[str] = frozenset()) -> None:  # fmt: skip
        """Refuse ``msg`` if it carries a rank another node holds and still reports (in
        the job's latest step, or before any step was assembled), or, from a node the
        job has not declared, a rank far beyond the job's once a step was assembled.
        A rank's node is its sample's (a rack's message names each), else the sender;
        a holder in ``left`` (a signed relaunch took it out of the job) holds nothing."""
        ranks = rank_array(msg)
        if not ranks.size:
            return
        top = int(ranks.max())
        if assembled and not declared and self.top >= 0 and top > 2 * self.top + 1:
            raise RefusedRecord(
                f"node {msg.node} reports rank {top}, far beyond the job's highest "
                f"rank {self.top}: refused"
            )
        names, where = sample_nodes(msg)
        if len(self.names) >= 2 * MAX_NODES_PER_JOB and any(n not in self.index for n in names):
            raise RefusedRecord(f"job has named {len(self.names)} nodes: {msg.node} refused")
        inside = np.flatnonzero(ranks < self.owner.shape[0])  # vectorised, samples in order:
        held = self.owner[ranks[inside]]
        own = np.array([self.index.get(n, -2) for n in names], dtype=np.int64)[where[inside]]
        for k in np.flatnonzero((held >= 0) & (held != own)).tolist():
            holder, node = self.names[int(held[k])], names[int(where[inside[k]])]
            if (holder in reporting or not reporting) and holder not in left:
                raise RefusedRecord(
                    f"node {node} reports rank {int(ranks[inside[k]])}, which node {holder} "
                    "holds and still reports: refused (a record speaks only for its own node)"
                )

    def take(self, msg: NodeStep) -> None:
        ranks = rank_array(msg)
        if ranks.size:
            need = int(ranks.max()) + 1
            if need > self.owner.shape[0]:
                grown = np.full(max(need, 2 * self.owner.shape[0]), -1, dtype=np.int32)
                grown[: self.owner.shape[0]] = self.owner
                self.owner = grown
            names, where = sample_nodes(msg)
            self.owner[ranks] = np.array([self._index(n) for n in names], dtype=np.int32)[where]
            self.top = max(self.top, need - 1)
        self.node_ranks[msg.node] = rank_key(msg)

    def _index(self, node: str) -> int:
        at = self.index.get(node)
        if at is None:
            at = self.index[node] = len(self.names)
            self.names.append(node)
        return at

    def clear(self) -> None:
        self.node_ranks.clear()
        self.owner[:] = -1


class _Refusals:
    """One WARNING episode per node whose records were refused (bounded)."""

    MAX_NODES = 64

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.count: dict[str, int] = {}
        #: nodes whose step was refused as far ahead of the job
        self.jumping: set[str] = set()
        #: the step a jump of the whole job was accepted at (its records go in)
        self.accepted: int | None = None

    def jumped(
        self, node: str, step: int, last: int, reach: int, reporting: frozenset[str]
    ) -> bool:
        """``node`` reports ``step``, far ahead of the job's ``last``: True once at least
        half of the job's nodes did (the job itself moved on, e.g. relaunched from a
        later checkpoint: its records around that step go in until the job gets
        there), False while it is one node's word."""
        if self.accepted is not None and self.accepted > last and step >= self.accepted - reach:
            return True
        if len(self.jumping) < 4096:
            self.jumping.add(node)
        if reporting and 2 * len(self.jumping & reporting) >= len(reporting):
            self.jumping.clear()
            self.accepted = step
            return True
        return False

    def note(self, msg: NodeStep, why: str, step: int) -> list[Alert]:
        n = self.count.get(msg.node, 0)
        if n == 0 and len(self.count) >= self.MAX_NODES:
            return []
        self.count[msg.node] = n + 1
        if n & (n + 1):  # updates at 1, 2, 4, 8 ... refusals: bounded, still counted
            return []
        at = msg.ts_end
        return [
            Alert(
                fingerprint=episode_fingerprint(self.job_id, "refused", msg.node, None, 0),
                seq=n.bit_length(),
                kind=AlertKind.GUARDRAIL,
                grade=Grade.WARNING,
                state=AlertState.FIRING,
                job_id=self.job_id,
                node=msg.node,
                step=step,
                started_at=at,
                ts=at,
                evidence=Evidence(
                    metric="refused_records", value=float(n + 1), deviation=0.0, detail=why[:500]
                ),
                recommended_action=RecommendedAction.INVESTIGATE,
                summary=f"records of {msg.node} refused for job {self.job_id}: {why}"[:1000],
            )
        ]
