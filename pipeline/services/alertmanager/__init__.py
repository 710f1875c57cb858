"""``stepguard alertmanager``: alert episodes from the decisions topic into Prometheus
Alertmanager (API v2), so that its routing, grouping, inhibition and silences apply.

- :mod:`~pipeline.services.alertmanager.episodes` — pure: an alert update to a
  PostableAlert, the table of firing episodes, the re-send cadence;
- :mod:`~pipeline.services.alertmanager.client` — the HTTP client (retries, backoff,
  the body of a refusal logged);
- :mod:`~pipeline.services.alertmanager.service` — the Kafka loop: decode, verify,
  call the table, post, commit.

The ``stepguard alertmanager`` command is :mod:`pipeline.cli.alertmanager`.
"""

from pipeline.services.alertmanager.episodes import (
    BridgeParams,
    EpisodeTable,
    PostableAlert,
    alertname,
    labels_of,
    postable,
)

__all__ = ["BridgeParams", "EpisodeTable", "PostableAlert", "alertname", "labels_of", "postable"]
