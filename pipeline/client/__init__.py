"""The client floor: everything training code imports.

Owns the step exporter (:class:`StepExporter`, its :class:`StepBatcher` and the Kafka
sink) and the command listener (:mod:`pipeline.client.listener`); framework hooks
(PyTorch) sit in sub-packages. Imports only :mod:`schemas`, :mod:`pipeline.io` modules
that are as light (settings, kafka, clock skew, trust), kafka-python, pydantic and
cryptography: never numpy, yaml, faust, aiokafka, chdb, clickhouse-driver or
matplotlib (``tests/unit/test_import_layers.py`` checks it in a subprocess).
"""

from pipeline.client.batcher import RankRecord, StepBatcher
from pipeline.client.exporter import (
    AggregatorTransport,
    DirectTransport,
    ExporterStats,
    StepExporter,
    Transport,
)
from pipeline.client.sink import KafkaSink, SinkStats
from pipeline.io.settings import ClientSettings, load_client_settings

__all__ = [
    "AggregatorTransport",
    "ClientSettings",
    "DirectTransport",
    "ExporterStats",
    "KafkaSink",
    "RankRecord",
    "SinkStats",
    "StepBatcher",
    "StepExporter",
    "Transport",
    "load_client_settings",
]
