"""The actuator's answers to operators (topic ``acks``): pure, no I/O.

Every approval and control message the actuator consumes live gets one
:class:`~schemas.Acknowledgement`, naming the message by its topic, partition and offset:
*applied* (an approval: the action's new state and the ids of the commands it issued) or
*refused* and why (a key the actuator does not trust, too old, not held any more, a
guardrail, observe mode). At start the actuator says which mode it runs in. Every answer
carries the mode after it, so ``stepguard pending`` shows the running actuator's mode.
``stepguard approve``/``reject``/``control`` wait for theirs
(:mod:`pipeline.cli.actuator`).
"""

from __future__ import annotations

from datetime import datetime

from pipeline.policy import Outcome, PolicyParams
from schemas import (
    Acknowledgement,
    AckOutcome,
    ActionState,
    Approval,
    ControlMessage,
    Message,
)

__all__ = ["answer", "started"]


def _modes(params: PolicyParams) -> dict[str, object]:
    return {"mode": params.mode, "action_modes": dict(params.action_modes)}


def started(params: PolicyParams, now: datetime) -> Acknowledgement:
    """The actuator's status at start: its mode after the rebuild."""
    return Acknowledgement(
        subject="actuator", request="start", outcome=AckOutcome.APPLIED, ts=now,
        detail="started", **_modes(params),  # type: ignore[arg-type]
    )  # fmt: skip


def answer(
    msg: Message, where: tuple[str, int, int], out: Outcome, params: PolicyParams, now: datetime
) -> Acknowledgement | None:
    """The answer to an operator's ``msg`` read at ``where`` (topic, partition, offset)
    that led to ``out``; ``None`` for any other message.

    An approval took effect when the action reached the state it asked for (approved:
    its commands issued; rejected); it is refused when the actuator refused the message
    (:attr:`Outcome.refusal`) or the action ended otherwise (a guardrail, observe mode).
    """
    topic, partition, offset = where
    common = {"source_topic": topic[:256], "partition": partition, "offset": offset, "ts": now}
    common |= _modes(params)
    if isinstance(msg, ControlMessage):
        return Acknowledgement(
            subject=msg.change_id, request="control", by=msg.by[:256],
            outcome=AckOutcome.REFUSED if out.refusal else AckOutcome.APPLIED,
            detail=out.refusal[:2000], **common,  # type: ignore[arg-type]
        )  # fmt: skip
    if not isinstance(msg, Approval):
        return None
    decided = [r for r in out.records if r.action_id == msg.action_id]
    state = decided[-1].state if decided else None
    wanted = ActionState.APPROVED if msg.decision.value == "approve" else ActionState.REJECTED
    if out.refusal or state is not wanted:
        why = out.refusal or (
            f"{state.value}: {decided[-1].detail}" if state is not None else out.note
        )
        outcome = AckOutcome.REFUSED
    else:
        why, outcome = "", AckOutcome.APPLIED
    return Acknowledgement(
        subject=msg.action_id, request="approval", by=msg.by[:256], outcome=outcome,
        state=state, detail=why[:2000],
        commands=tuple(c.command_id for c in out.commands)[:64], **common,  # type: ignore[arg-type]
    )  # fmt: skip
