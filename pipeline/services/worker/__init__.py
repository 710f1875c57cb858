"""``stepguard worker``: the Faust stage that turns telemetry into graded alerts.

- :mod:`pipeline.services.worker.state` — the logic (decode, route, detect, snapshot, tick),
  no Faust: :class:`~pipeline.services.worker.state.WorkerDetection`, composed of one
  collaborator per concern (its module docstring has the table);
- :mod:`pipeline.services.worker.app` — the Faust app built from Settings, its agents,
  table and timer in :mod:`pipeline.services.worker.streams`, its consumer in
  :mod:`pipeline.services.worker.consumer`;
- :mod:`pipeline.services.worker.metrics` — Prometheus metrics;
- :mod:`pipeline.cli.worker` — the ``worker``, ``simulate``, ``export-health`` and
  ``export-node`` subcommands.
"""

from pipeline.services.worker.runner import run_worker

__all__ = ["run_worker"]
