"""Which archived alerts, commands, action records and approvals count as signed.

The archive keeps every alert and command it reads, with a ``signed`` column that the
named queries filter on (:mod:`pipeline.services.archive.queries`): anyone who can write the
decisions or commands topic could invent rows. A message counts as signed when it
carries a well-formed signature (the schema refuses malformed ones) and, where the
archiver holds its writers' public keys, one of those keys made it: alerts are checked
when ``STEPGUARD_WORKER_PUBLIC_KEYS`` is set (against the workers' and the actuator's
keys: the actuator signs its guardrail notices), commands and action records when
``STEPGUARD_ACTUATOR_PUBLIC_KEYS`` is, approvals and control changes when
``STEPGUARD_OPERATOR_PUBLIC_KEYS`` is (migration 010). Without them, presence is all
it can check.
"""

from __future__ import annotations

import logging
from typing import TypeVar

from pipeline.io.settings import Settings
from pipeline.io.trust import PublicKeys, public_keys, signature_problem
from schemas import ActionRecord, Alert, Approval, Command, ControlMessage, Message

__all__ = ["SignatureCheck"]

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Message)


class SignatureCheck:
    """Marks alerts, commands, action records and approvals whose signature does not
    verify as unsigned.

    ``mark(message)`` returns the message itself, or, for a signed message of those
    kinds that none of its writers' keys verifies, a copy without the signature (archived
    with ``signed = 0``). ``failed`` counts those.
    """

    def __init__(self, settings: Settings) -> None:
        worker = public_keys(settings, "worker")
        actuator = public_keys(settings, "actuator")
        operator = public_keys(settings, "operator")
        # alerts come from workers (and guardrail notices from the actuator): without
        # the workers' keys a worker's alert cannot be told from a forgery, so none is
        # checked
        self._keys: dict[type[Message], list[PublicKeys]] = {
            Alert: [k for k in (worker, actuator) if k] if worker else [],
            Command: [actuator] if actuator else [],
            ActionRecord: [actuator] if actuator else [],
            Approval: [operator] if operator else [],
            ControlMessage: [operator] if operator else [],
        }
        self.failed = 0

    @property
    def verifies(self) -> bool:
        """Whether any key is held (else only the presence of a signature counts)."""
        return any(self._keys.values())

    def mark(self, message: M) -> M:
        keysets = self._keys.get(type(message))
        if not keysets or getattr(message, "signature", None) is None:
            return message
        problems = [signature_problem(message, keys) for keys in keysets]  # type: ignore[arg-type]
        if None in problems:
            return message
        self.failed += 1
        log.warning(
            "archived as unsigned: a %s whose signature does not verify (%s)",
            type(message).__name__, problems[0],
        )  # fmt: skip
        return message.model_copy(update={"signature": None, "key_id": None})
