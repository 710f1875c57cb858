"""Grading: findings -> info / warning / critical :class:`schemas.Alert` updates.

:class:`Grader` keeps one episode state per subject (signal, node, rank), advances it
with the pure state machine of :mod:`detectors.episodes` (enter and exit thresholds,
minimum durations, flap suppression) on every observation, and turns its transitions
into alert updates: one on a new episode, an escalation, a re-open or a resolve, never
on every step. :meth:`Grader.close` resolves open episodes at once (the job ended, or
a node left it). The state machine's names are importable from here too.

Examples
--------
>>> from schemas import AlertKind, Grade, RecommendedAction
>>> from detectors.base import Finding
>>> policy = GradePolicy(AlertKind.STRAGGLER, enter=(None, 0.05, 0.2),
...                      exit=0.025, min_obs=(1, 2, 2), hold_obs=2)
>>> g = Grader("job-1", {"straggler": policy})
>>> def step(i, score):
...     fs = [Finding("straggler", "n1", 9, score, "compute_s", 1 + score, 8.0)]
...     return g.observe(fs if score else [], signals={"straggler"}, step=i, ts=i)
>>> [len(step(i, s)) for i, s in enumerate([0.1, 0.0, 0.1, 0.1, 0.1])]
[0, 0, 0, 1, 0]
>>> a = step(5, 0.3); a
[]
>>> a = step(6, 0.3)[0]; (a.grade.value, a.state.value, a.seq, a.node, a.rank)
('critical', 'firing', 1, 'n1', 9)
>>> step(7, 0.0), step(8, 0.0)[0].state.value
([], 'resolved')
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime

from detectors.base import Finding, SubjectKey
from detectors.episodes import GRADES, EpisodeState, GradePolicy, Transition, advance
from schemas.alerts import (
    Alert,
    AlertKind,
    AlertState,
    Grade,
    RecommendedAction,
    episode_fingerprint,
    incident_key,
)

__all__ = [
    "GRADES",
    "EpisodeState",
    "GradePolicy",
    "Grader",
    "Transition",
    "advance",
]


def _dt(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, UTC)


#: Alert kinds that are one cause for grouping: a node that creeps (degradation) and
#: then jumps (straggler) is one slow node, one incident.
INCIDENT_CAUSE: dict[AlertKind, str] = {
    AlertKind.STRAGGLER: "slowdown",
    AlertKind.DEGRADATION: "slowdown",
}


@dataclass
class _Tracked:
    state: EpisodeState
    last: Finding | None = None
    grade_fired: int = -1
    incident: str = ""  #: group key, fixed when the episode opens


@dataclass
class Grader:
    """Grades findings per subject and emits :class:`schemas.Alert` updates.

    Parameters
    ----------
    job_id
        Job the alerts belong to.
    policies
        Grading policy per signal name.
    """

    job_id: str
    policies: Mapping[str, GradePolicy]
    _subjects: dict[SubjectKey, _Tracked] = field(default_factory=dict, repr=False)
    #: (culprit node or "", alert kind) -> key of its open incident
    _groups: dict[tuple[str, str], str] = field(default_factory=dict, repr=False)
    #: open incident -> its causes in the order they joined: (alert kind, first step)
    _causes: dict[str, list[tuple[str, int]]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        if not self.job_id:
            raise ValueError("job_id must not be empty")

    def firing(self) -> dict[SubjectKey, Grade]:
        """Subjects with an open episode and their grade."""
        return {k: GRADES[t.state.grade] for k, t in self._subjects.items() if t.state.firing}

    def state_of(self, key: SubjectKey) -> EpisodeState | None:
        t = self._subjects.get(key)
        return None if t is None else t.state

    def min_score(self, signal: str) -> float:
        """Findings of ``signal`` scoring below this can be left out of :meth:`observe`."""
        return self.policies[signal].lowest_threshold

    def observe(
        self,
        findings: Iterable[Finding],
        *,
        signals: Collection[str],
        step: int,
        ts: float,
        node: str | None = None,
    ) -> list[Alert]:
        """Feed one observation for every subject of ``signals`` (and ``node``, if given).

        Subjects tracked for these signals but absent from ``findings`` observe a score
        of 0. Returns the alert updates caused, in a deterministic order.
        """
        scored: dict[SubjectKey, Finding] = {}
        for finding in findings:
            if finding.signal not in signals:
                raise ValueError(f"finding for signal {finding.signal!r} outside {sorted(signals)}")
            old = scored.get(finding.key)
            if old is None or finding.score > old.score:
                scored[finding.key] = finding
        keys = set(scored)
        for k in self._subjects:
            if k[0] in signals and (node is None or k[1] == node):
                keys.add(k)
        alerts: list[Alert] = []
        for key in sorted(keys, key=_sort_key):
            policy = self.policies[key[0]]
            f = scored.get(key)
            tracked = self._subjects.get(key)
            if tracked is None:
                if f is None or f.score < policy.lowest_threshold:
                    continue
                tracked = self._subjects[key] = _Tracked(EpisodeState())
            score = 0.0 if f is None else f.score
            new_state, transition = advance(tracked.state, score, policy, step=step, ts=ts)
            tracked.state = new_state
            if f is not None and (new_state.firing or tracked.last is None):
                tracked.last = f
            if transition is not None:
                alerts.append(self._alert(key, tracked, transition, policy, step, ts))
            if new_state.idle(policy):
                del self._subjects[key]
        return alerts

    def _incident(self, key: SubjectKey, tracked: _Tracked, transition: Transition) -> str:
        """The incident an update belongs to: a new episode joins its culprit node's
        open incident whatever its cause (a thermal throttle that makes a straggler is
        one sick node), a job-wide one the job's open incident of the same cause
        (:data:`INCIDENT_CAUSE`, else its kind); otherwise it opens one. The last
        episode to resolve closes it. An episode keeps its incident for life."""
        kind = self.policies[key[0]].kind
        cause = INCIDENT_CAUSE.get(kind, kind.value)
        group = (key[1], "node") if key[1] else ("", cause)
        if transition is Transition.NEW or not tracked.incident:
            open_key = self._groups.get(group)
            tracked.incident = open_key or incident_key(
                self.job_id, key[1], group[1], round(tracked.state.started_ts * 1000)
            )
            chain = self._causes_map().setdefault(tracked.incident, [])
            if kind.value not in {k for k, _ in chain}:
                chain.append((kind.value, tracked.state.first_step or 0))
        if transition is Transition.RESOLVE:
            still_open = any(
                t.state.firing and t.incident == tracked.incident
                for k, t in self._subjects.items()
                if k != key
            )
            if not still_open:
                self._causes_map().pop(tracked.incident, None)
            if not still_open and self._groups.get(group) == tracked.incident:
                del self._groups[group]
        else:
            self._groups.setdefault(group, tracked.incident)
        return tracked.incident

    def _causes_map(self) -> dict[str, list[tuple[str, int]]]:
        # a state stored before the field existed has none: start it empty
        return self.__dict__.setdefault("_causes", {})  # type: ignore[no-any-return]

    def chain(self, incident: str) -> str:
        """The causes of an open incident in the order they appeared, e.g.
        ``thermal (step 120) -> straggler (step 131)``; empty for one cause."""
        causes = self._causes_map().get(incident, [])
        if len(causes) < 2:
            return ""
        return " -> ".join(f"{k} (step {s})" for k, s in causes)

    def close(self, why: str, *, step: int, ts: float, node: str | None = None) -> list[Alert]:
        """Resolve every open episode (of ``node``, if given) at once, whatever its
        scores say: the job ended, or the node left it. Each gets one RESOLVED update
        that gives ``why``; every closed subject is forgotten, so nothing re-opens.

        >>> from schemas import AlertKind
        >>> from detectors.base import Finding
        >>> hang = GradePolicy(AlertKind.HANG, enter=(None, None, 2.5), exit=1.0,
        ...                    min_obs=(1, 1, 1))
        >>> g = Grader("job-1", {"hang": hang})
        >>> fs = [Finding("hang", None, None, 3.0, "seconds_since_step", 9.0, 3.0,
        ...               detail="no step for 3.0 median step times")]
        >>> [a.state.value for a in g.observe(fs, signals={"hang"}, step=7, ts=20.0)]
        ['firing']
        >>> [a.summary for a in g.close("job ended: completed", step=7, ts=21.0)]
        ['hang (hang) on job resolved (job ended: completed): no step for 3.0 median step times']
        >>> g.firing(), g.close("again", step=7, ts=22.0)
        ({}, [])
        """
        alerts: list[Alert] = []
        for key in sorted(self._subjects, key=_sort_key):
            if node is not None and key[1] != node:
                continue
            tracked = self._subjects[key]
            st = tracked.state
            if not st.firing or tracked.last is None:
                del self._subjects[key]
                continue
            tracked.state = replace(
                st, grade=-1, seq=st.seq + 1, resolved_at=st.n_obs, above=(0, 0, 0)
            )
            policy = self.policies[key[0]]
            alerts.append(self._alert(key, tracked, Transition.RESOLVE, policy, step, ts, why))
            del self._subjects[key]
        return alerts

    def _alert(
        self,
        key: SubjectKey,
        tracked: _Tracked,
        transition: Transition,
        policy: GradePolicy,
        step: int,
        ts: float,
        why: str = "",
    ) -> Alert:
        st = tracked.state
        signal, node, rank = key
        resolved = transition is Transition.RESOLVE
        grade_idx = tracked.grade_fired if resolved else st.grade
        if not resolved:
            tracked.grade_fired = st.grade
        grade = GRADES[max(grade_idx, 0)]
        assert st.first_step is not None
        last = tracked.last
        assert last is not None
        evidence = last.evidence()
        incident = self._incident(key, tracked, transition)
        chain = self.chain(incident)
        if chain:  # one incident per sick node: its causes, in order
            detail = f"{evidence.detail}; incident chain: {chain}".strip("; ")
            evidence = evidence.model_copy(update={"detail": detail[:2000]})
        action = RecommendedAction.NONE if resolved else policy.actions[max(grade_idx, 0)]
        subject = node if node is not None else "job"
        if rank is not None:
            subject = f"{subject} rank {rank}"
        verb = {
            Transition.NEW: "firing",
            Transition.ESCALATE: f"escalated to {grade.value}",
            Transition.REOPEN: "re-opened",
            Transition.RESOLVE: f"resolved ({why})" if why else "resolved",
        }[transition]
        summary = f"{policy.kind.value} ({signal}) on {subject} {verb}: {evidence.detail}".strip()
        return Alert(
            # the start time, not the first step: step numbers repeat after a restart,
            # and two episodes of one subject must never share a fingerprint
            fingerprint=episode_fingerprint(
                self.job_id, signal, node, rank, round(st.started_ts * 1000)
            ),
            seq=st.seq,
            kind=policy.kind,
            grade=grade,
            state=AlertState.RESOLVED if resolved else AlertState.FIRING,
            job_id=self.job_id,
            node=node,
            rank=rank,
            step=max(step, 0),
            started_at=_dt(st.started_ts),
            ts=_dt(max(ts, st.started_ts)),
            evidence=evidence,
            recommended_action=action,
            summary=summary[:1000],
            incident=incident,
        )


def _sort_key(key: SubjectKey) -> tuple[str, str, int]:
    return (key[0], key[1] or "", -1 if key[2] is None else key[2])
