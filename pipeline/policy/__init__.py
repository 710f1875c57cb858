"""The actuator's decisions as a pure, picklable state machine (no I/O, no clocks).

A package by concern, behind the small :class:`Policy` façade (:mod:`.core`):

- :mod:`.params` — :class:`PolicyParams` (mode, thresholds) and :class:`Outcome`;
- :mod:`.planning` — which commands carry out an action, spares, the job's nodes;
- :mod:`.guardrails` — breaker, budget, cooldowns; typed :class:`Refusal` values;
- :mod:`.holds` — approval holds (announced, expired, cancelled);
- :mod:`.ledger` — issued command ids and action records;
- :mod:`.memory` — ordered, pruned and capped maps.

:class:`Policy` turns alert updates, approvals and control messages into an
:class:`Outcome`: unsigned commands to publish, action records (observed, held,
refused ...) and its own guardrail alerts. The Kafka service around it only decodes,
calls, signs, publishes and commits.

Time: ``now`` (the caller's wall clock) stamps commands and drives the guardrail
windows and cooldowns, because executors compare ``expires_at`` with their own clock
and a rebuilt actuator reads the windows back from ``issued_at``. Event time
(``alert.ts``) decides staleness (against the newest alert of the same job, so one
alert dated in the future stales only its own job) and how long a WARNING has
persisted. Isolations are bounded per job (the circuit breaker) and across all jobs
(``max_isolations_global`` per window), so invented job ids do not bypass the bound.

Modes are per action kind: ``PolicyParams.action_modes`` overrides the global mode
for a kind (say auto for straggler replacement, approve for restarts), set at runtime
by a control message; a global OBSERVE still stops every kind.

Held actions (approve mode) are announced and expire (:mod:`.holds`).

Memory: everything the policy keeps per episode, command, action, node or job is
stamped with ``now`` and forgotten :attr:`Policy.horizon_s` after (the longest of the
guard window, the cooldowns, the command TTL, the stale-alert, confirmation and hold
horizons), so inside that horizon no decision changes. Pruning runs on every input and
on :meth:`Policy.on_tick`. Repair marks (nodes that failed twice in a window) and job
sizes are kept past the horizon. Every map also has a hard cap, ``max_tracked`` entries
(oldest dropped first, counted in :attr:`Policy.evicted`): a backstop against an alert
storm, not the normal bound. An episode silent for longer than the horizon is
forgotten; should it fire again it is decided afresh (its command ids are the same, so
executors, which remember what they ran, skip them).

Examples
--------
>>> from datetime import UTC, datetime
>>> from schemas import (ActuatorMode, Alert, AlertKind, AlertState, Evidence, Grade,
...                      RecommendedAction)
>>> t = datetime(2026, 1, 1, tzinfo=UTC)
>>> policy = Policy(PolicyParams(mode=ActuatorMode.AUTO, spare_nodes=("spare-0",)))
>>> alert = Alert(fingerprint="fp-000001", seq=0, kind=AlertKind.HARDWARE,
...               grade=Grade.CRITICAL, state=AlertState.FIRING, job_id="j", node="n3",
...               step=10, started_at=t, ts=t, node_in_steps=True,
...               evidence=Evidence(metric="ecc_uncorrected", value=1, deviation=1),
...               recommended_action=RecommendedAction.ISOLATE)
>>> [(c.kind.value, c.targets, c.replacements) for c in policy.on_alert(alert, t).commands]
[('checkpoint', (), ()), ('isolate', ('n3',), ('spare-0',)), ('restart', ('n3',), ('spare-0',))]
>>> policy.on_alert(alert, t).commands  # a replay issues nothing
[]

A node the job's steps never showed (a health report can name any node) is never
taken from the job:

>>> outsider = alert.model_copy(update={"fingerprint": "fp-000002", "node": "n9",
...                                     "node_in_steps": False})
>>> [(c.kind.value, c.targets) for c in policy.on_alert(outsider, t).commands]
[('notify', ('n9',))]
"""

from pipeline.policy.core import Policy, action_id
from pipeline.policy.guardrails import GLOBAL_BUDGET, Refusal, RefusalKind
from pipeline.policy.holds import EXPIRED
from pipeline.policy.params import Issued, Outcome, PolicyParams

__all__ = [
    "EXPIRED",
    "GLOBAL_BUDGET",
    "Issued",
    "Outcome",
    "Policy",
    "PolicyParams",
    "Refusal",
    "RefusalKind",
    "action_id",
]
