"""``stepguard worker``: the Faust stage that turns telemetry into graded alerts.

- :mod:`pipeline.worker.state` — the logic (decode, route, detect, snapshot, tick),
  no Faust;
- :mod:`pipeline.worker.app` — the Faust app, agents, table and timer built from
  Settings;
- :mod:`pipeline.worker.metrics` — Prometheus metrics;
- :mod:`pipeline.worker.cli` — the ``worker``, ``simulate``, ``export-health`` and
  ``export-node`` subcommands.
"""

from pipeline.worker.runner import run_worker

__all__ = ["run_worker"]
