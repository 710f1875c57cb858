"""What every executor shares: the :class:`Executor` base, its errors and node names.

Its own module so that executors in modules of their own (:mod:`.slurm`) and the runner
in :mod:`.executors` import it without importing each other.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from datetime import datetime

from pipeline.io.errors import StepguardError
from schemas import Command

__all__ = ["NODE_NAME", "ExecutionError", "Executor", "InvalidNodeName", "validate_node_name"]

#: What a node name may look like before it goes anywhere near ``scontrol``.
NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class ExecutionError(StepguardError):
    """An executor could not carry out a command."""


class InvalidNodeName(ExecutionError, ValueError):
    """A node name failed validation; nothing was run."""


def validate_node_name(name: str) -> str:
    """Return ``name`` if it is a plain host name, else raise :class:`InvalidNodeName`.

    >>> validate_node_name("gpu-node-017")
    'gpu-node-017'
    >>> validate_node_name("node1; rm -rf /")
    Traceback (most recent call last):
    ...
    pipeline.services.actuator.base.InvalidNodeName: invalid node name 'node1; rm -rf /'
    """
    if not NODE_NAME.fullmatch(name):
        raise InvalidNodeName(f"invalid node name {name!r}")
    return name


class Executor(ABC):
    """Carries out the command kinds it handles; ``execute`` returns a detail string."""

    name: str = "executor"

    @abstractmethod
    def handles(self, cmd: Command) -> bool: ...

    @abstractmethod
    def execute(self, cmd: Command) -> str:
        """Do it; raise :class:`ExecutionError` on failure."""

    def tick(self, now: datetime) -> None:  # noqa: B027 - most executors need no time
        """Time passes (the runner calls it after every poll)."""
