"""``stepguard export-node``: the node aggregator as a node daemon.

Each rank's :class:`~pipeline.client.exporter.StepExporter` (``to_aggregator``) sends
datagrams of records; :class:`NodeAggregator` groups them per step and publishes one
StepTelemetry per node per step with a single Kafka producer. A record or lifecycle
event dated more than ``STEPGUARD_MAX_CLOCK_SKEW_S`` beyond this host's clock is not
published (counted in ``future_dated``, one warning per interval); a record whose times
are not numbers makes its datagram malformed. The aggregator itself stands on the
client floor (:mod:`pipeline.client.aggregator`: the PyTorch integration runs it inside
the job too); this module is the daemon around it.
"""

from __future__ import annotations

import signal
from pathlib import Path

from pipeline.client.aggregator import NodeAggregator
from pipeline.client.sink import KafkaSink
from pipeline.io.settings import Settings

__all__ = ["NodeAggregator", "run_node_aggregator"]


def run_node_aggregator(
    settings: Settings,
    socket_path: Path,
    *,
    ranks_per_node: int,
    node: str | None = None,
    rack: tuple[str, int] | None = None,
) -> None:
    """``stepguard export-node``: serve until SIGTERM/SIGINT. With ``rack`` (the rack
    aggregator's UDP address) the steps go to the rack, lifecycle events to Kafka."""
    from pipeline.agents.rack import RackLink

    sink = RackLink(rack, KafkaSink(settings)) if rack is not None else None
    agg = NodeAggregator(settings, socket_path, ranks_per_node=ranks_per_node, sink=sink)
    signal.signal(signal.SIGTERM, lambda *_: agg.stop())
    del node  # records carry their node; the option documents the deployment
    try:
        agg.serve()
    except KeyboardInterrupt:
        agg.stop()
    finally:
        agg.close()
