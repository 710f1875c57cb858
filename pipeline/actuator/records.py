"""Read-back views of the actuator's output topics (``stepguard pending``)."""

from __future__ import annotations

from pipeline.kafka import create_topics, read_to_end, registry_of
from pipeline.settings import Settings
from schemas import ActionRecord

__all__ = ["latest_actions"]


def latest_actions(settings: Settings) -> dict[str, ActionRecord]:
    """The latest record of every action id, in first-seen order."""
    create_topics(settings, ["actions"])
    latest: dict[str, ActionRecord] = {}
    for rec in read_to_end(settings, registry_of(settings), "actions"):
        msg = rec.message
        assert isinstance(msg, ActionRecord)
        latest[msg.action_id] = msg
    return latest
