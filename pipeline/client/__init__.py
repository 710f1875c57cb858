"""The client floor: everything training code imports.

The public face, one import for a training script (``__all__``)::

    from pipeline.client import CommandKind, CommandListener, StepExporter

=================================  ======================================================
name                               what training code does with it
=================================  ======================================================
:class:`StepExporter`              one ``record_step`` per rank per step; the job's
                                   lifecycle (start, phases, end)
:class:`CommandListener`           the actuator's signed commands at step boundaries,
                                   results signed back (``Callback`` its callbacks)
:func:`load_client_settings`       the exporter's and listener's ``STEPGUARD_*``
                                   settings (:class:`ClientSettings`)
``Command``, ``CommandKind``,      what the listener hands over and reports (re-exported
``CommandStatus``                  from :mod:`schemas`)
:func:`watch`, ``TorchGuard``,     PyTorch in about three lines; ``pip install
``RelaunchRequested``              'stepguard[torch]'`` (loaded on first use, so
                                   ``import pipeline.client`` never imports torch)
=================================  ======================================================

Also exported, for code that builds its own transport or sink: :class:`StepBatcher`
and :class:`RankRecord`, the transports (:class:`DirectTransport`,
:class:`AggregatorTransport`, the :class:`Transport` protocol), :class:`KafkaSink` and
the stats (:class:`ExporterStats`, :class:`SinkStats`). Anything not in ``__all__`` is
internal. The node aggregator's core is :mod:`pipeline.client.aggregator`; framework
hooks sit in sub-packages, each behind its own extra (:mod:`pipeline.client.pytorch`,
Lightning and Hugging Face callbacks beside it).

Imports only :mod:`schemas`, :mod:`pipeline.io` modules that are as light (settings,
kafka, clock skew, trust), kafka-python, pydantic and cryptography: never torch (until
``watch`` is used), numpy, yaml, faust, aiokafka, chdb, clickhouse-driver or matplotlib
(``tests/unit/test_import_layers.py`` checks it in a subprocess).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.client.batcher import RankRecord, StepBatcher
from pipeline.client.exporter import (
    AggregatorTransport,
    DirectTransport,
    ExporterStats,
    StepExporter,
    Transport,
)
from pipeline.client.listener import Callback, CommandListener
from pipeline.client.sink import KafkaSink, SinkStats
from pipeline.io.settings import ClientSettings, load_client_settings
from schemas import Command, CommandKind, CommandStatus

if TYPE_CHECKING:  # for type checkers and IDEs; at run time __getattr__ loads them
    from pipeline.client.pytorch.guard import RelaunchRequested, TorchGuard, watch

#: what needs the ``torch`` extra: resolved by :func:`__getattr__` on first use
_TORCH = ("RelaunchRequested", "TorchGuard", "watch")

__all__ = [
    "AggregatorTransport",
    "Callback",
    "ClientSettings",
    "Command",
    "CommandKind",
    "CommandListener",
    "CommandStatus",
    "DirectTransport",
    "ExporterStats",
    "KafkaSink",
    "RankRecord",
    "RelaunchRequested",
    "SinkStats",
    "StepBatcher",
    "StepExporter",
    "TorchGuard",
    "Transport",
    "load_client_settings",
    "watch",
]


def __getattr__(name: str) -> Any:
    if name in _TORCH:
        # pipeline.client.pytorch says "pip install 'stepguard[torch]'" without torch
        from pipeline.client import pytorch

        return getattr(pytorch, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_TORCH})
