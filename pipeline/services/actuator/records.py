"""The actuator's action records read back (the CLI's views of held actions).

Topics are read back with :func:`pipeline.io.kafka.read_back`: from the beginning to the
end offsets seen at the start, however many polls that takes, with progress.
"""

from __future__ import annotations

import logging

from pipeline.io.kafka import create_topics, read_back
from pipeline.io.settings import Settings
from schemas import ActionRecord

__all__ = ["latest_actions"]

log = logging.getLogger(__name__)


def latest_actions(settings: Settings) -> dict[str, ActionRecord]:
    """The latest record of every action id, in first-seen order."""
    create_topics(settings, ["actions"])
    latest: dict[str, ActionRecord] = {}
    for rec in read_back(settings, "actions"):
        msg = rec.message
        assert isinstance(msg, ActionRecord)
        latest[msg.action_id] = msg
    return latest
