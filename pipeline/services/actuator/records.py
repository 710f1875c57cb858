"""The actuator's action records and answers read back (the CLI's views of held
actions, of the running actuator's mode, and of the answer to an operator's message).

Topics are read back with :func:`pipeline.io.kafka.read_back`: from the beginning to the
end offsets seen at the start, however many polls that takes, with progress.
"""

from __future__ import annotations

import logging
import time

from pipeline.io.kafka import create_topics, read_back
from pipeline.io.settings import Settings
from pipeline.io.trust import PublicKeys, signature_problem
from schemas import Acknowledgement, ActionRecord

__all__ = ["AnswerWaiter", "latest_actions", "running_status"]

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


def _verified(ack: Acknowledgement, keys: PublicKeys) -> bool:
    """Signed by an actuator key, or no actuator key is known here to check with."""
    return not keys or signature_problem(ack, keys) is None


def running_status(settings: Settings) -> Acknowledgement | None:
    """The latest answer or start status an actuator key signed (read back from the
    acks topic): the mode the running actuator reported last, or ``None``."""
    from pipeline.io.trust import public_keys

    keys = public_keys(settings, "actuator")
    create_topics(settings, ["acks"])
    latest = None
    for rec in read_back(settings, "acks"):
        msg = rec.message
        if isinstance(msg, Acknowledgement) and _verified(msg, keys):
            latest = msg
    return latest


class AnswerWaiter:
    """Waits for the actuator's answer to one message the caller publishes.

    Opened before the message is sent (it reads the acks topic from its end then), so
    no answer is missed; :meth:`wait` returns the answer naming the message's topic,
    partition and offset (an actuator key signed it, where such keys are known here),
    or ``None`` when none came before the deadline.
    """

    def __init__(self, settings: Settings) -> None:
        from pipeline.io.kafka import assigned_consumer, registry_of
        from pipeline.io.trust import public_keys

        create_topics(settings, ["acks"])
        self.keys = public_keys(settings, "actuator")
        self._topic = registry_of(settings).name("acks")
        self._consumer = assigned_consumer(settings, [self._topic], None)
        parts = list(self._consumer.assignment())
        self._consumer.seek_to_end(*parts)
        for tp in parts:  # resolve the end now: what comes after the send is read
            self._consumer.position(tp)

    def wait(self, where: tuple[str, int, int], timeout_s: float) -> Acknowledgement | None:
        from schemas import decode

        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            batches = self._consumer.poll(timeout_ms=int(min(left, 0.5) * 1000) + 1)
            for records in batches.values():
                for rec in records:
                    msg = decode(Acknowledgement, rec.value)
                    if not isinstance(msg, Acknowledgement) or not _verified(msg, self.keys):
                        continue
                    if (msg.source_topic, msg.partition, msg.offset) == where:
                        return msg
        return None

    def close(self) -> None:
        self._consumer.close()
