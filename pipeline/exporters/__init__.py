"""Exporters: the training-loop step hook, the node aggregator, NVML health, replay.

- :class:`StepExporter` — one ``record_step`` call per rank per step, never blocking;
- :class:`NodeAggregator` — one producer per node fed over a Unix socket;
- :mod:`pipeline.exporters.health` — ``stepguard export-health`` (NVML);
- :mod:`pipeline.exporters.dcgm` — ``stepguard export-health --from-dcgm URL`` (a
  running dcgm-exporter);
- :func:`play` — ``stepguard simulate`` (a scenario to the broker).
"""

from pipeline.exporters.batcher import RankRecord, StepBatcher
from pipeline.exporters.node import NodeAggregator
from pipeline.exporters.player import PlayStats, play
from pipeline.exporters.sink import KafkaSink, SinkStats
from pipeline.exporters.step import ExporterStats, StepExporter

__all__ = [
    "ExporterStats",
    "KafkaSink",
    "NodeAggregator",
    "PlayStats",
    "RankRecord",
    "SinkStats",
    "StepBatcher",
    "StepExporter",
    "play",
]
