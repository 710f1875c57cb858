"""``stepguard worker``: the Faust stage that turns telemetry into graded alerts.

- :mod:`pipeline.services.worker.state` — the logic (decode, route, detect, snapshot, tick),
  no Faust;
- :mod:`pipeline.services.worker.app` — the Faust app, agents, table and timer built from
  Settings;
- :mod:`pipeline.services.worker.metrics` — Prometheus metrics;
- :mod:`pipeline.cli.worker` — the ``worker``, ``simulate``, ``export-health`` and
  ``export-node`` subcommands.
"""

from pipeline.services.worker.runner import run_worker

__all__ = ["run_worker"]
