"""Which archived alerts, commands, action records, approvals, control changes and
command results count as signed.

The archive keeps every message it reads, with a ``signed`` column that the named
queries and ``stepguard calibrate`` filter on (:mod:`pipeline.services.archive.queries`):
anyone who can write a topic could invent rows. A message is archived with
``signed = 1`` only when a public key of the role that writes its kind verified its
signature (SECURITY.md, "Keys": the archiver holds public keys only):

====================  ==============================================================
kind                  verified with
====================  ==============================================================
alert                 ``STEPGUARD_WORKER_PUBLIC_KEYS``, ``STEPGUARD_ACTUATOR_PUBLIC_KEYS``
                      (the actuator signs its guardrail notices)
command, action       ``STEPGUARD_ACTUATOR_PUBLIC_KEYS``
approval, control     ``STEPGUARD_OPERATOR_PUBLIC_KEYS``
command result        the result writers' roles: ``STEPGUARD_EXECUTOR_PUBLIC_KEYS`` and,
                      where that role exists, the job controller's
====================  ==============================================================

Without a role's public keys nothing of its kinds can be told from a forgery, so
every such message is archived with ``signed = 0`` (a warning at start says so); a
signature's mere presence never counts.
"""

from __future__ import annotations

import logging
from typing import TypeVar, cast

from pipeline.io.settings import ROLES, Role, Settings
from pipeline.io.trust import PublicKeys, Signable, public_keys, signature_problem
from schemas import (
    Acknowledgement,
    ActionRecord,
    Alert,
    Approval,
    Command,
    CommandResult,
    ControlMessage,
    Message,
)

__all__ = ["RESULT_ROLES", "SignatureCheck", "WRITER_ROLES"]

log = logging.getLogger(__name__)
M = TypeVar("M", bound=Message)

#: The roles whose keys may sign a command result: executors, and job controllers
#: (the training side's CommandListener) where the settings know that role.
RESULT_ROLES: tuple[Role, ...] = tuple(
    r for r in cast(tuple[Role, ...], ("executor", "job_controller")) if r in ROLES
)

#: Message kind -> the roles whose public keys verify it.
WRITER_ROLES: dict[type[Message], tuple[Role, ...]] = {
    Alert: ("worker", "actuator"),
    Command: ("actuator",),
    ActionRecord: ("actuator",),
    Acknowledgement: ("actuator",),
    Approval: ("operator",),
    ControlMessage: ("operator",),
    CommandResult: RESULT_ROLES,
}


class SignatureCheck:
    """Marks every signed kind whose signature no key of its writers' roles verifies
    as unsigned.

    ``mark(message)`` returns the message itself when one of its writers' public keys
    verified it, or, for a message of those kinds that none verifies (or that came
    unsigned), a copy without the signature, archived with ``signed = 0``. ``failed``
    counts the signed ones that a held key did not verify; ``unverifiable`` lists the
    kinds for which no key is held at all (all of theirs are archived unsigned).
    """

    def __init__(self, settings: Settings) -> None:
        keys: dict[Role, PublicKeys] = {}
        for roles in WRITER_ROLES.values():
            for role in roles:
                if role not in keys:
                    keys[role] = public_keys(settings, role)
        self._keys: dict[type[Message], list[PublicKeys]] = {
            kind: [keys[r] for r in roles if keys[r]] for kind, roles in WRITER_ROLES.items()
        }
        self.unverifiable = sorted(k.__name__ for k, held in self._keys.items() if not held)
        if self.unverifiable:
            log.warning(
                "no public keys of their writers' roles: every %s is archived unsigned "
                '(set STEPGUARD_<ROLE>_PUBLIC_KEYS; SECURITY.md, "Keys")',
                ", ".join(self.unverifiable),
            )
        self.failed = 0

    @property
    def verifies(self) -> bool:
        """Whether a key is held for every signed kind."""
        return not self.unverifiable

    def mark(self, message: M) -> M:
        keysets = self._keys.get(type(message))
        if keysets is None:  # telemetry, dead letters, truth: nothing to verify
            return message
        if getattr(message, "signature", None) is None:
            return message
        if not keysets:  # said once at start: unverifiable, so unsigned
            return message.model_copy(update={"signature": None, "key_id": None})
        signable = cast(Signable, message)
        problems = [signature_problem(signable, keys) for keys in keysets]
        if None in problems:
            return message
        self.failed += 1
        log.warning(
            "archived as unsigned: a %s whose signature does not verify (%s)",
            type(message).__name__, problems[0],
        )  # fmt: skip
        return message.model_copy(update={"signature": None, "key_id": None})
