"""The services floor: the long-running consumers.

- :mod:`pipeline.services.worker`: the Faust shell around the detection core
  (:class:`detectors.job.JobDetection`), per-job routing, control and takeover;
- :mod:`pipeline.services.actuator`: the actuator service (the pure decisions are
  :mod:`pipeline.policy`) and the executors;
- :mod:`pipeline.services.archive`: the archiver and both ClickHouse backends;
- :mod:`pipeline.services.alertmanager`: the Alertmanager bridge (alert episodes to
  Alertmanager's API v2).

May import :mod:`pipeline.policy`, :mod:`pipeline.io`, :mod:`pipeline.client` (the
listener types), :mod:`detectors` and :mod:`schemas`; never tools or the CLI.
"""
