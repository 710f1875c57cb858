"""Alert episodes as Alertmanager alerts: the pure part of ``stepguard alertmanager``.

No I/O and no clock: the caller passes ``now`` (its wall clock), and gets back the
:class:`PostableAlert` items to ``POST /api/v2/alerts`` (Alertmanager's API v2, a JSON
array of ``{labels, annotations, startsAt, endsAt}``).

One Alertmanager alert per episode: Alertmanager tells alerts apart by their label
set, and every label set carries the episode's fingerprint (``episode``), so two
episodes never merge and one episode stays one alert while it fires.

===============  ========================================================================
label            value
===============  ========================================================================
``alertname``    per kind (:func:`alertname`): ``StepguardStraggler``, ...,
                 ``StepguardActionHeld`` (a hold notice), ``StepguardGuardrail``
``severity``     the grade: ``info``, ``warning``, ``critical``
``job``          the job id
``node``         the node, when there is one
``rank``         the rank, when there is one
``incident``     the incident key (Alertmanager's ``group_by``), else the fingerprint
``episode``      the episode fingerprint
``cluster``      ``STEPGUARD_ALERTMANAGER_CLUSTER``
===============  ========================================================================

Annotations: ``summary`` (the alert's), ``description`` (evidence, recommended action,
step) and ``runbook_url`` (``STEPGUARD_ALERTMANAGER_RUNBOOK_URL`` + the kind, when set).

Timing: ``startsAt`` is the episode's start; a firing episode is sent with ``endsAt`` =
now + ``resolve_timeout_s`` and sent again every ``resend_s`` (shorter), so
Alertmanager keeps it firing while stepguard runs and ends it by itself if stepguard
stops; the RESOLVED update is sent with ``endsAt`` at its time (never after now). An
episode whose grade changes (an escalation) changes its ``severity`` label, so the old
label set is ended at once when the new one is sent.

Memory: the :class:`EpisodeTable` holds firing episodes only (RESOLVED drops one), at
most ``max_episodes`` (oldest update first out, counted in ``evicted``), and forgets an
episode with no update for ``episode_ttl_s`` (counted in ``expired``): it is no longer
sent, and Alertmanager ends it at its last ``endsAt``.

Examples
--------
>>> from datetime import UTC, datetime, timedelta
>>> from schemas import Alert, AlertKind, AlertState, Evidence, Grade
>>> t = datetime(2026, 1, 1, tzinfo=UTC)
>>> a = Alert(fingerprint="fp-000001", seq=0, kind=AlertKind.STRAGGLER,
...           grade=Grade.WARNING, state=AlertState.FIRING, job_id="j", node="n3", rank=7,
...           started_at=t, ts=t, evidence=Evidence(metric="compute_s", value=1.3,
...           deviation=6.0), summary="rank 7 slow", incident="inc-1")
>>> table = EpisodeTable(BridgeParams(resend_s=60, resolve_timeout_s=300))
>>> [p.labels["alertname"] for p in table.observe(a, t, t)]
['StepguardStraggler']
>>> table.observe(a, t, t)  # a replay of the same update: nothing
[]
>>> table.due(t + timedelta(seconds=30)), len(table.due(t + timedelta(seconds=60)))
([], 1)
>>> end = a.model_copy(update={"seq": 1, "state": AlertState.RESOLVED,
...                            "ts": t + timedelta(seconds=90)})
>>> later = t + timedelta(seconds=95)
>>> [p.json()["endsAt"] for p in table.observe(end, later, later)]
['2026-01-01T00:01:30+00:00']
>>> len(table)
0
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pipeline.io.settings import AlertmanagerSettings
from schemas import Alert, AlertKind, AlertState, Grade

__all__ = [
    "BridgeParams",
    "EpisodeTable",
    "PostableAlert",
    "alertname",
    "description",
    "labels_of",
    "postable",
]

#: the grade as Alertmanager's conventional ``severity`` label
SEVERITY: dict[Grade, str] = {
    Grade.INFO: "info", Grade.WARNING: "warning", Grade.CRITICAL: "critical",
}  # fmt: skip
#: fingerprints of the actuator's hold notices (pipeline.policy._hold_notice)
HELD_PREFIX = "held-"
#: label sets of one episode still to be ended (escalations between two sends)
_MAX_ENDED = 8


@dataclass(frozen=True, kw_only=True)
class BridgeParams:
    """What the bridge needs from the settings (see ``STEPGUARD_ALERTMANAGER_*``)."""

    cluster: str = "stepguard"
    runbook_url: str = ""
    resolve_timeout_s: float = 300.0
    resend_s: float = 60.0
    episode_ttl_s: float = 6 * 3600.0
    max_episodes: int = 10_000

    def __post_init__(self) -> None:
        if not self.cluster:
            raise ValueError("cluster must not be empty")
        if self.resend_s <= 0 or self.resolve_timeout_s <= self.resend_s:
            raise ValueError("resend_s must be positive and shorter than resolve_timeout_s")
        if self.episode_ttl_s <= 0 or self.max_episodes < 1:
            raise ValueError("episode_ttl_s must be positive and max_episodes >= 1")

    @classmethod
    def from_settings(cls, settings: AlertmanagerSettings) -> BridgeParams:
        return cls(
            cluster=settings.alertmanager_cluster,
            runbook_url=settings.alertmanager_runbook_url,
            resolve_timeout_s=settings.alertmanager_resolve_timeout_s,
            resend_s=settings.alertmanager_resend_s,
            episode_ttl_s=settings.alertmanager_episode_ttl_s,
            max_episodes=settings.alertmanager_max_episodes,
        )


@dataclass(frozen=True)
class PostableAlert:
    """One element of Alertmanager's PostableAlerts array."""

    labels: dict[str, str]
    annotations: dict[str, str]
    starts_at: datetime
    ends_at: datetime

    def json(self) -> dict[str, Any]:
        """The JSON object Alertmanager's API v2 takes."""
        return {
            "labels": dict(self.labels),
            "annotations": dict(self.annotations),
            "startsAt": self.starts_at.isoformat(),
            "endsAt": self.ends_at.isoformat(),
        }


def alertname(alert: Alert) -> str:
    """The ``alertname`` of an alert: one per kind; a hold notice is its own.

    >>> from schemas import AlertKind
    >>> [alertname_of_kind(k) for k in (AlertKind.DATA_STALL, AlertKind.HANG)]
    ['StepguardDataStall', 'StepguardHang']
    """
    if alert.kind is AlertKind.GUARDRAIL and alert.fingerprint.startswith(HELD_PREFIX):
        return "StepguardActionHeld"
    return alertname_of_kind(alert.kind)


def alertname_of_kind(kind: AlertKind) -> str:
    return "Stepguard" + "".join(part.capitalize() for part in kind.value.split("_"))


def labels_of(alert: Alert, params: BridgeParams) -> dict[str, str]:
    """The label set of an alert update (see the module table)."""
    labels = {
        "alertname": alertname(alert),
        "severity": SEVERITY[alert.grade],
        "job": alert.job_id,
    }
    if alert.node:
        labels["node"] = alert.node
    if alert.rank is not None:
        labels["rank"] = str(alert.rank)
    labels["incident"] = alert.incident or alert.fingerprint
    labels["episode"] = alert.fingerprint
    labels["cluster"] = params.cluster
    return labels


def _num(v: float) -> str:
    return f"{v:.4g}"


def description(alert: Alert) -> str:
    """What the evidence says, the recommended action and the step, in one paragraph."""
    ev = alert.evidence
    parts = [f"{ev.metric} = {_num(ev.value)}"]
    if ev.peer_median is not None:
        parts.append(f"peer median {_num(ev.peer_median)}")
    if ev.baseline is not None:
        parts.append(f"baseline {_num(ev.baseline)}")
    parts.append(f"deviation {_num(ev.deviation)}")
    if ev.trend is not None:
        parts.append(f"trend {_num(ev.trend)}/step")
    text = ", ".join(parts)
    if ev.detail:
        text += f": {ev.detail}"
    text += f". Recommended action: {alert.recommended_action.value}."
    if alert.step is not None:
        text += f" Step {alert.step}."
    return text[:4000]


def _summary(alert: Alert) -> str:
    if alert.summary:
        return alert.summary[:1000]
    where = f"node {alert.node}" if alert.node else f"job {alert.job_id}"
    return f"{alert.kind.value} {alert.grade.value} on {where}"


def postable(alert: Alert, params: BridgeParams, *, now: datetime) -> PostableAlert:
    """The Alertmanager alert of one update sent at ``now``: firing until now +
    ``resolve_timeout_s``, or ended at the RESOLVED update's time (at most now, at
    least the start)."""
    annotations = {"summary": _summary(alert), "description": description(alert)}
    if params.runbook_url:
        annotations["runbook_url"] = params.runbook_url + alert.kind.value
    if alert.state is AlertState.RESOLVED:
        ends = max(alert.started_at, min(alert.ts, now))
    else:
        ends = now + timedelta(seconds=params.resolve_timeout_s)
    return PostableAlert(labels_of(alert, params), annotations, alert.started_at, ends)


def _ended(
    labels: dict[str, str], alert: Alert, params: BridgeParams, now: datetime
) -> PostableAlert:
    """An earlier label set of the episode, ended now (its grade changed)."""
    p = postable(alert, params, now=now)
    return PostableAlert(labels, p.annotations, alert.started_at, max(alert.started_at, now))


@dataclass
class _Episode:
    alert: Alert
    labels: dict[str, str]
    #: when an update of it last arrived (wall clock, the broker's time when read back)
    seen_at: datetime
    #: when it was last sent; None: never (read back at start-up, or not yet)
    sent_at: datetime | None = None
    #: label sets it had before, still to be ended
    ended: list[dict[str, str]] = field(default_factory=list)


class EpisodeTable:
    """The firing episodes and what to send for them (see the module docstring).

    Counters: ``duplicates`` (updates not newer than the one held), ``evicted`` (dropped
    at the cap), ``expired`` (no update for ``episode_ttl_s``).
    """

    def __init__(self, params: BridgeParams) -> None:
        self.params = params
        self._episodes: OrderedDict[str, _Episode] = OrderedDict()
        self.duplicates = 0
        self.evicted = 0
        self.expired = 0

    def __len__(self) -> int:
        return len(self._episodes)

    def firing(self) -> dict[str, Alert]:
        """Fingerprint -> the latest update of every firing episode held."""
        return {fp: ep.alert for fp, ep in self._episodes.items()}

    def observe(
        self, alert: Alert, seen_at: datetime, now: datetime, *, replay: bool = False
    ) -> list[PostableAlert]:
        """One verified alert update; returns what to send now.

        ``seen_at`` is when it arrived (for the TTL). With ``replay`` (the start-up read
        back) nothing is returned: what is still firing is sent by the next :meth:`due`.
        A RESOLVED update of an episode not held is still sent (its FIRING may have been
        read before a restart).
        """
        fp = alert.fingerprint
        ep = self._episodes.get(fp)
        if ep is not None and alert.seq <= ep.alert.seq:
            self.duplicates += 1
            return []
        labels = labels_of(alert, self.params)
        ended = [] if ep is None else [*ep.ended, ep.labels]
        ended = [old for old in ended if old != labels][-_MAX_ENDED:]
        if alert.state is AlertState.RESOLVED:
            self._episodes.pop(fp, None)
            if replay:
                return []
            return [*(_ended(o, alert, self.params, now) for o in ended),
                    postable(alert, self.params, now=now)]  # fmt: skip
        ep = _Episode(alert, labels, seen_at, None if ep is None else ep.sent_at, ended)
        self._episodes[fp] = ep
        self._episodes.move_to_end(fp)
        while len(self._episodes) > self.params.max_episodes:
            self._episodes.popitem(last=False)
            self.evicted += 1
        if replay:
            ep.sent_at = None
            return []
        return self._send(ep, now)

    def _send(self, ep: _Episode, now: datetime) -> list[PostableAlert]:
        out = [_ended(old, ep.alert, self.params, now) for old in ep.ended]
        out.append(postable(ep.alert, self.params, now=now))
        ep.ended = []
        ep.sent_at = now
        return out

    def due(self, now: datetime) -> list[PostableAlert]:
        """Forget the episodes past their TTL, then what must be sent again now:
        every firing episode not sent for ``resend_s`` (or never sent)."""
        ttl = timedelta(seconds=self.params.episode_ttl_s)
        for fp in [fp for fp, ep in self._episodes.items() if now - ep.seen_at >= ttl]:
            del self._episodes[fp]
            self.expired += 1
        every = timedelta(seconds=self.params.resend_s)
        out: list[PostableAlert] = []
        for ep in self._episodes.values():
            if ep.sent_at is None or now - ep.sent_at >= every:
                out += self._send(ep, now)
        return out
