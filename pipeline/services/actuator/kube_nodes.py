"""What the Kubernetes executor writes on a Node, and whose it is: pure functions on the
Node as the API server returns it (a JSON dict), no client, no I/O.

===================================  =====================================================
On the Node                          Written by stepguard (and only removed if so)
===================================  =====================================================
``spec.unschedulable: true``         the cordon, when the node was schedulable; owned when
                                     the annotation ``stepguard.io/cordoned`` says so
taint ``stepguard.io/unhealthy``     ``NoSchedule`` (or ``NoExecute``), value: the
                                     incident key; the key is stepguard's alone
``stepguard.io/*`` annotations       provenance: ``isolated-by`` (stepguard + the
                                     actuator's key id), ``cause`` (kind and evidence),
                                     ``incident``, ``command-id``, ``job``, ``isolated-at``
condition ``StepguardHealthy``       ``False`` with reason ``StepguardIsolated`` and the
                                     cause (on ``nodes/status``, where the role may)
===================================  =====================================================

Someone else's: a cordon without stepguard's annotation, every taint whose key is not
:data:`TAINT_KEY`, every other annotation and condition. A node is *isolated by someone
else* (:func:`foreign_isolation`) when it is cordoned by them or carries a taint of theirs
that keeps work off it (``NoExecute``, or one of :data:`OUT_OF_SERVICE_TAINTS`); such a
node is left exactly as it is. A ``NoSchedule`` taint of theirs (a dedicated GPU pool's)
is no isolation: stepguard adds its own beside it and never touches it.

``spec.taints`` has no merge key: a patch that sets it replaces the whole list, so each
patch built here carries the ``resourceVersion`` it was computed from (the API server
answers 409 when the node changed in between, and the executor reads again).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from schemas import Command

__all__ = [
    "ANNOTATION_PREFIX",
    "CONDITION_TYPE",
    "CORDONED",
    "OUT_OF_SERVICE_TAINTS",
    "TAINT_KEY",
    "IsolateOutcome",
    "NodeView",
    "ResumeOutcome",
    "condition",
    "foreign_isolation",
    "isolate_patch",
    "label_value",
    "provenance",
    "resume_patch",
    "still_isolated",
    "taint_value",
    "with_taint",
    "without_ours",
]

#: the taint key stepguard owns (nobody else writes it)
TAINT_KEY = "stepguard.io/unhealthy"
ANNOTATION_PREFIX = "stepguard.io/"
#: this annotation (value ``"true"``) says the cordon is stepguard's
CORDONED = f"{ANNOTATION_PREFIX}cordoned"
CONDITION_TYPE = "StepguardHealthy"
CONDITION_REASON = "StepguardIsolated"
#: taints of others that mean "out of service" even as NoSchedule
OUT_OF_SERVICE_TAINTS = frozenset(
    {"node.kubernetes.io/out-of-service", "node.kubernetes.io/unschedulable"}
)
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_ANNOTATION_MAX = 1024  # per stepguard annotation value (the whole node allows 256 KiB)


class IsolateOutcome(StrEnum):
    """What ISOLATE did with one node."""

    ISOLATED = "cordoned and tainted"
    #: stepguard's taint is on it already: left as it is
    ALREADY_OURS = "already isolated by stepguard"
    #: cordoned or tainted out of service by someone else: nothing written
    ISOLATED_BY_OTHER = "already isolated by someone else"
    #: only the faulty GPU taken out (a DRA DeviceTaintRule); the node stays in service
    DEVICE_TAINTED = "device tainted"


class ResumeOutcome(StrEnum):
    """What ``resume-node`` did."""

    RESUMED = "resumed"
    #: with ``--force``: someone else's cordon was lifted too (their taints never)
    FORCED = "resumed (forced)"
    NOT_ISOLATED = "not isolated"


@dataclass(frozen=True, slots=True)
class NodeView:
    """The parts of a Node (API JSON) that ownership is decided from."""

    name: str
    resource_version: str
    unschedulable: bool
    taints: tuple[Mapping[str, Any], ...]
    annotations: Mapping[str, str]
    conditions: tuple[Mapping[str, Any], ...]

    @classmethod
    def of(cls, node: Mapping[str, Any]) -> NodeView:
        meta = node.get("metadata") or {}
        spec = node.get("spec") or {}
        status = node.get("status") or {}
        return cls(
            name=str(meta.get("name", "")),
            resource_version=str(meta.get("resourceVersion", "")),
            unschedulable=bool(spec.get("unschedulable", False)),
            taints=tuple(spec.get("taints") or ()),
            annotations=dict(meta.get("annotations") or {}),
            conditions=tuple(status.get("conditions") or ()),
        )

    @property
    def our_taint(self) -> Mapping[str, Any] | None:
        return next((t for t in self.taints if t.get("key") == TAINT_KEY), None)

    @property
    def foreign_taints(self) -> tuple[Mapping[str, Any], ...]:
        return tuple(t for t in self.taints if t.get("key") != TAINT_KEY)

    @property
    def our_cordon(self) -> bool:
        """Cordoned, and stepguard's annotation says the cordon is its own."""
        return self.unschedulable and self.annotations.get(CORDONED) == "true"

    @property
    def foreign_cordon(self) -> bool:
        return self.unschedulable and not self.our_cordon

    @property
    def our_condition(self) -> Mapping[str, Any] | None:
        return next((c for c in self.conditions if c.get("type") == CONDITION_TYPE), None)

    @property
    def our_annotations(self) -> dict[str, str]:
        return {k: v for k, v in self.annotations.items() if k.startswith(ANNOTATION_PREFIX)}

    def describe(self) -> str:
        """``cordoned; taints: a=b:NoSchedule`` (what an operator sees of it)."""
        parts = ["cordoned" if self.unschedulable else "schedulable"]
        if self.taints:
            parts.append("taints: " + ", ".join(_taint_text(t) for t in self.taints))
        return "; ".join(parts)


def _taint_text(taint: Mapping[str, Any]) -> str:
    value = taint.get("value")
    return f"{taint.get('key')}{'=' + str(value) if value else ''}:{taint.get('effect')}"


def foreign_isolation(view: NodeView) -> str | None:
    """Why someone else has the node out of service (``None``: nobody has).

    >>> v = NodeView("n", "1", True, ({"key": "admin/psu", "effect": "NoSchedule"},), {}, ())
    >>> foreign_isolation(v)
    'cordoned; taints: admin/psu:NoSchedule'
    >>> pool = ({"key": "gpu", "effect": "NoSchedule"},)
    >>> foreign_isolation(NodeView("n", "1", False, pool, {}, ()))
    >>> maintenance = ({"key": "x", "effect": "NoExecute"},)
    >>> foreign_isolation(NodeView("n", "1", False, maintenance, {}, ()))
    'schedulable; taints: x:NoExecute'
    """
    blocking = [
        t for t in view.foreign_taints
        if t.get("effect") == "NoExecute" or t.get("key") in OUT_OF_SERVICE_TAINTS
    ]  # fmt: skip
    # the cordon's own taint (node.kubernetes.io/unschedulable) follows a cordon of ours
    if view.our_cordon and all(
        t.get("key") == "node.kubernetes.io/unschedulable" for t in blocking
    ):
        return None
    if view.foreign_cordon or blocking:
        return view.describe()
    return None


def label_value(text: str) -> str | None:
    """``text`` if it is a valid label value (63 characters, alphanumerics at both ends,
    ``-_.`` inside), else ``None`` (it never goes into a selector then).

    >>> label_value("llm-7"), label_value("a,b=c"), label_value("x" * 64)
    ('llm-7', None, None)
    """
    return text if text and _LABEL_VALUE.fullmatch(text) else None


def taint_value(incident: str) -> str:
    """The taint's value: the incident key as a label value (at most 63 characters).

    >>> taint_value("1a2b3c4d5e6f7a8b9c0d"), taint_value("a/b c"), taint_value("")
    ('1a2b3c4d5e6f7a8b9c0d', 'abc', 'isolated')
    """
    value = re.sub(r"[^A-Za-z0-9]", "", incident)[:63]
    return value or "isolated"


def _clip(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _ANNOTATION_MAX else text[: _ANNOTATION_MAX - 3] + "..."


def provenance(cmd: Command, now: datetime) -> dict[str, str]:
    """The annotations an operator reads with ``kubectl describe node``: who (stepguard,
    the actuator key that signed the command), why (the cause, not the remedy), which
    incident, command and job, and when."""
    incident = cmd.incident or (cmd.reason[0] if cmd.reason else cmd.command_id)
    return {
        f"{ANNOTATION_PREFIX}isolated-by": _clip(f"stepguard (actuator key {cmd.key_id or '-'})"),
        f"{ANNOTATION_PREFIX}cause": _clip(cmd.cause or cmd.summary or f"command {cmd.kind}"),
        f"{ANNOTATION_PREFIX}incident": _clip(incident),
        f"{ANNOTATION_PREFIX}command-id": _clip(cmd.command_id),
        f"{ANNOTATION_PREFIX}job": _clip(cmd.job_id),
        f"{ANNOTATION_PREFIX}isolated-at": now.isoformat(timespec="seconds"),
    }


def with_taint(
    taints: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]
) -> list[dict[str, Any]]:
    """``taints`` with stepguard's ``taint`` set (any earlier one of stepguard's replaced),
    every other taint kept as it is and where it is.

    >>> ours = {"key": TAINT_KEY, "value": "i1", "effect": "NoSchedule"}
    >>> [t["key"] for t in with_taint([{"key": "gpu", "effect": "NoSchedule"}, ours], ours)]
    ['gpu', 'stepguard.io/unhealthy']
    """
    return [*without_ours(taints), dict(taint)]


def without_ours(taints: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``taints`` without stepguard's; the others untouched and in order."""
    return [dict(t) for t in taints if t.get("key") != TAINT_KEY]


def isolate_patch(
    view: NodeView, cmd: Command, now: datetime, effect: str = "NoSchedule"
) -> dict[str, Any]:
    """The merge patch that isolates a node nobody isolated: cordon (owned), stepguard's
    taint beside the others, provenance; pinned to ``view``'s resourceVersion."""
    incident = cmd.incident or (cmd.reason[0] if cmd.reason else cmd.command_id)
    taint: dict[str, Any] = {"key": TAINT_KEY, "value": taint_value(incident), "effect": effect}
    if effect == "NoExecute":
        taint["timeAdded"] = now.isoformat(timespec="seconds").replace("+00:00", "Z")
    annotations = provenance(cmd, now)
    spec: dict[str, Any] = {"taints": with_taint(view.taints, taint)}
    if not view.unschedulable:
        spec["unschedulable"] = True
        annotations[CORDONED] = "true"
    return {
        "metadata": {"resourceVersion": view.resource_version, "annotations": annotations},
        "spec": spec,
    }


def still_isolated(
    before: NodeView, after: NodeView, rules: list[str], *, force: bool = False
) -> list[str]:
    """What of the isolation ``resume`` undid is still there in ``after`` (the node read
    back) and ``rules`` (stepguard's DeviceTaintRules of it, listed again): empty when
    the resume took effect. Someone else's taints are never counted (they stay theirs).

    >>> ours = NodeView("n", "1", True, ({"key": TAINT_KEY, "effect": "NoSchedule"},),
    ...                 {CORDONED: "true"}, ())
    >>> still_isolated(ours, NodeView("n", "2", False, (), {}, ()), [])
    []
    >>> still_isolated(ours, NodeView("n", "3", True, (), {}, ()), ["r1"])
    ['cordoned', 'DeviceTaintRule r1']
    """
    left = []
    if after.unschedulable and (before.our_cordon or force):
        left.append("cordoned")
    if after.our_taint is not None:
        left.append(f"taint {TAINT_KEY}")
    if after.our_annotations:
        left.append("annotations " + ", ".join(sorted(after.our_annotations)))
    if after.our_condition is not None:
        left.append(f"condition {CONDITION_TYPE}")
    left += [f"DeviceTaintRule {name}" for name in rules]
    return left


def resume_patch(view: NodeView, *, force: bool = False) -> dict[str, Any]:
    """The merge patch that undoes what stepguard wrote: its taint (others' stay), its
    annotations, its cordon; someone else's cordon only with ``force``. Empty when
    there is nothing of stepguard's (and no forced cordon) to undo."""
    patch: dict[str, Any] = {}
    spec: dict[str, Any] = {}
    if view.our_taint is not None:
        spec["taints"] = without_ours(view.taints) or None
    if view.our_cordon or (force and view.foreign_cordon):
        spec["unschedulable"] = None
    if spec:
        patch["spec"] = spec
    if view.our_annotations:
        patch["metadata"] = {"annotations": dict.fromkeys(view.our_annotations)}
    if patch:
        patch.setdefault("metadata", {})["resourceVersion"] = view.resource_version
    return patch


def condition(cmd: Command, now: datetime) -> dict[str, Any]:
    """``StepguardHealthy=False`` with the cause, as node-problem-detector writes its own."""
    stamp = now.isoformat(timespec="seconds").replace("+00:00", "Z")
    incident = cmd.incident or (cmd.reason[0] if cmd.reason else cmd.command_id)
    cause = cmd.cause or cmd.summary or f"command {cmd.kind}"
    return {
        "type": CONDITION_TYPE,
        "status": "False",
        "reason": CONDITION_REASON,
        "message": _clip(f"stepguard: {cause} (incident {incident}, command {cmd.command_id})"),
        "lastHeartbeatTime": stamp,
        "lastTransitionTime": stamp,
    }
