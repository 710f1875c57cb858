"""The stepguard exception hierarchy.

``StepguardError`` is the base; catch it to handle any of ours. Infrastructure errors
(broker or archive unreachable) make a service exit non-zero for its supervisor.
:class:`CapacityError` is the detection core's (:mod:`detectors.errors`), re-exported here:
the record is dead-lettered and the service goes on.
"""

from __future__ import annotations

from detectors.errors import CapacityError

__all__ = [
    "ArchiveError",
    "ArchiveRowError",
    "BrokerError",
    "CapacityError",
    "ConfigError",
    "EmbeddedServiceError",
    "StepguardError",
]


class StepguardError(Exception):
    """Base of every stepguard error."""


class ConfigError(StepguardError):
    """A setting or CLI argument is invalid; the message names the variable."""


class BrokerError(StepguardError):
    """The Kafka-compatible broker is unreachable or refused an operation."""


class ArchiveError(StepguardError):
    """ClickHouse (server or chDB) is unreachable or refused an operation."""


class ArchiveRowError(ArchiveError):
    """The archive refused the rows themselves (a value outside a column's type):
    retrying cannot help; the source message goes to the dead-letter topic."""


class EmbeddedServiceError(StepguardError):
    """An embedded service (Tansu broker) failed to start or stop."""
