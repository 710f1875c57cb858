"""The ``stepguard alertmanager`` command (:mod:`pipeline.cli.app` adds :data:`commands`)."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from pipeline.cli.util import err, stop_event
from pipeline.io.settings import load_settings

__all__ = ["alertmanager", "commands"]

commands = typer.Typer()


@commands.command()
def alertmanager(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log every post.")] = False,
) -> None:
    """Push alert episodes from the decisions topic to Alertmanager's API v2
    (STEPGUARD_ALERTMANAGER_URL): one alert per episode, re-sent while it fires, ended
    at RESOLVED; held actions are alerts of their own."""
    from pipeline.io.metrics import serve_metrics
    from pipeline.io.redact import url_origin
    from pipeline.services.alertmanager.service import AlertmanagerBridge, BridgeMetrics

    if verbose:
        logging.getLogger("pipeline.services.alertmanager").setLevel(logging.INFO)
    settings = load_settings()
    metrics = BridgeMetrics()
    serve_metrics(metrics.registry, settings, "alertmanager_metrics_port")
    bridge = AlertmanagerBridge(settings, metrics=metrics)
    err.print(
        f"alertmanager bridge: {url_origin(settings.alertmanager)}, cluster "
        f"{settings.alertmanager_cluster}; {len(bridge.table)} episodes firing after reading "
        f"{bridge.stats.rebuilt} decisions back; consuming {settings.kafka_bootstrap}"
    )
    stop = stop_event()
    try:
        stats = bridge.run(stop.is_set)
    finally:
        bridge.close()
    err.print(
        f"alertmanager bridge stopped: {stats.consumed} decisions, {stats.sent} alerts sent, "
        f"{stats.rejected} refused, {stats.dead_letters} dead letters"
    )
