"""Planning: which commands carry out a confirmed action, with which spare, and the
job's known nodes that executors check targets against.

A plan never checks a guardrail (that is :mod:`pipeline.policy.guardrails`); it only
reads whether a protective checkpoint was taken moments ago and which spares are left.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from pipeline.policy.guardrails import Guardrails
from pipeline.policy.memory import Cap, drop_front, touch
from pipeline.policy.params import PolicyParams
from schemas import ActuatorMode, Alert, Command, CommandKind, RecommendedAction, command_id

__all__ = ["MAX_JOB_NODE_NAMES", "Plan", "Planner"]

_ISOLATING = (RecommendedAction.ISOLATE, RecommendedAction.REPLACE_AT_CHECKPOINT)
#: commands whose targets executors check against the job's known nodes
_SCOPED = (CommandKind.ISOLATE, CommandKind.RESTART)
#: most node names remembered per job (oldest first out); more: no hint on commands
MAX_JOB_NODE_NAMES = 4096


@dataclass(slots=True)
class _Nodes:
    touched: datetime  # ``now`` of the last alert that named one
    names: dict[str, None] = field(default_factory=dict)  # oldest first


@dataclass(frozen=True, slots=True)
class Plan:
    commands: tuple[Command, ...]
    isolated: str | None  # the node removed from the job, if any
    replacement: str | None
    summary: str


class Planner:
    """Plans from alerts; owns the spare pool and the job's known nodes."""

    def __init__(self, params: PolicyParams, cap: Cap, guards: Guardrails) -> None:
        self.params = params
        self._cap = cap
        self._guards = guards
        self.spares: list[str] = list(params.spare_nodes)
        #: job -> the nodes named in (worker-signed) alerts of the job
        self.nodes: dict[str, _Nodes] = {}

    def learn(self, alert: Alert, now: datetime) -> None:
        """Learn the alert's node as a member of its job when the worker-signed alert
        shows it in the job's steps: a rank's alert (its steps came from that node), or
        ``node_in_steps``. A health report's node is not evidence: it is whatever node
        the report names."""
        if alert.node is not None and (alert.rank is not None or alert.node_in_steps):
            self.learn_node(alert.job_id, alert.node, now)

    def learn_node(self, job: str, node: str, now: datetime) -> None:
        """``node`` is a member of ``job`` (executors check targets against these)."""
        seen = self.nodes.get(job) or _Nodes(now)
        seen.touched = now
        touch(seen.names, node, None)
        while len(seen.names) > MAX_JOB_NODE_NAMES:
            del seen.names[next(iter(seen.names))]
        touch(self.nodes, job, seen)
        self._cap(self.nodes)

    def spare(self, node: str | None) -> str | None:
        for spare in self.spares:
            if spare != node and spare not in self._guards.repair:
                return spare
        return None

    def prune(self, cut: datetime, *, full: bool) -> None:
        if full:
            self.nodes = {k: v for k, v in self.nodes.items() if v.touched >= cut}
        drop_front(self.nodes, lambda v: v.touched < cut)

    def plan(self, alert: Alert, first_step: int | None, now: datetime, mode: ActuatorMode) -> Plan:
        """The commands that carry out ``alert``'s recommended action in ``mode``."""
        action, node, fp = alert.recommended_action, alert.node, alert.fingerprint
        expires = now + timedelta(seconds=self.params.command_ttl_s)
        known = self.nodes.get(alert.job_id)
        hint = () if known is None else tuple(known.names)
        # what was seen, not what to do: the Slurm drain reason names it
        detail = alert.evidence.detail
        cause = (f"{alert.kind.value}: {detail}" if detail else alert.summary)[:500] or None
        outsider = node is not None and node not in hint
        if outsider and action in (*_ISOLATING, RecommendedAction.RESTART):
            # not a member of the job from its steps: nothing is taken from the job
            text = (
                f"{node} is not known as a node of job {alert.job_id} from its steps: "
                f"alert only ({alert.summary})"
            )
            notice = Command(
                command_id=command_id([fp], CommandKind.NOTIFY.value, [node]),
                kind=CommandKind.NOTIFY, job_id=alert.job_id, targets=(node,),
                reason=(fp,), mode=mode, issued_at=now, expires_at=expires,
                summary=text[:500], cause=cause, incident=alert.incident or None,
                grade=alert.grade,
            )  # fmt: skip
            return Plan((notice,), None, None, text)

        def cmd(
            kind: CommandKind,
            targets: tuple[str, ...] = (),
            replacements: tuple[str, ...] = (),
            checkpoint_step: int | None = None,
            summary: str = "",
        ) -> Command:
            return Command(
                command_id=command_id([fp], kind.value, list(targets)), kind=kind,
                job_id=alert.job_id, targets=targets, replacements=replacements,
                checkpoint_step=checkpoint_step, reason=(fp,), mode=mode, issued_at=now,
                expires_at=expires, summary=(summary or alert.summary)[:500],
                job_nodes=hint if targets and kind in _SCOPED else None,
                cause=cause, incident=alert.incident or None, grade=alert.grade,
            )  # fmt: skip

        nodes = (node,) if node else ()
        if action is RecommendedAction.ROLLBACK:
            to = None if first_step is None else max(0, first_step - 1)
            text = f"roll back to the last checkpoint at or before step {to}: {alert.summary}"
            return Plan(
                (cmd(CommandKind.ROLLBACK, checkpoint_step=to, summary=text),), None, None, text
            )
        if action is RecommendedAction.RESTART:
            # a relaunch that excludes no node (a job-wide hang) needs no replacement
            spare = self.spare(node) if node else None
            repl = (spare,) if spare else ()
            text = f"restart excluding {node or 'nothing'}" + (
                f", bringing in {spare}" if spare else ""
            )
            cmds = (cmd(CommandKind.RESTART, nodes, repl, summary=text),)
            if node:
                cmds = (cmd(CommandKind.ISOLATE, nodes, repl, summary=text), *cmds)
            return Plan(cmds, node, spare, text)
        if action in _ISOLATING and node:
            spare = self.spare(node)
            if spare:
                text = f"replace {node} with {spare} at the next checkpoint boundary"
                return Plan(
                    (
                        cmd(CommandKind.CHECKPOINT, summary=text),
                        cmd(CommandKind.ISOLATE, nodes, (spare,), summary=text),
                        cmd(CommandKind.RESTART, nodes, (spare,), summary=text),
                    ),
                    node,
                    spare,
                    text,
                )
            fresh = self._guards.checkpointed_recently(alert.job_id, now)
            if self.params.no_spare_policy == "checkpoint" and not fresh:
                text = f"no spare for {node}: checkpoint and keep running degraded"
                return Plan(
                    (
                        cmd(CommandKind.CHECKPOINT, summary=text),
                        cmd(CommandKind.NOTIFY, nodes, summary=text),
                    ),
                    None,
                    None,
                    text,
                )
            text = f"no spare for {node}: alert only" + (
                " (a checkpoint was taken moments ago)" if fresh else ""
            )
            return Plan((cmd(CommandKind.NOTIFY, nodes, summary=text),), None, None, text)
        text = f"investigate: {alert.summary}"
        return Plan((cmd(CommandKind.NOTIFY, nodes, summary=text),), None, None, text)
