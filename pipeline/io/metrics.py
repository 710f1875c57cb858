"""Prometheus metrics of the services beside the worker, and serving them.

Each service keeps its metrics in its own registry (tests build several side by side)
and serves ``/metrics`` on its own port setting; 0 turns the endpoint off:

==================  ================================  =====================================
service             setting (default)                 metrics
==================  ================================  =====================================
worker              STEPGUARD_WORKER_METRICS_PORT     :mod:`pipeline.services.worker.metrics`
                    (9108)
actuator            STEPGUARD_ACTUATOR_METRICS_PORT   :class:`ActuatorMetrics`
                    (9109)
executor            STEPGUARD_EXECUTOR_METRICS_PORT   :class:`ExecutorMetrics`
                    (9110)
archiver            STEPGUARD_ARCHIVER_METRICS_PORT   :class:`ArchiverMetrics`
                    (9111)
job controller      STEPGUARD_LISTENER_METRICS_PORT   :class:`ExecutorMetrics`, executor
(CommandListener)   (0: off; runs in training code)   ``job-controller``
==================  ================================  =====================================

Two services of one kind on one host need a port each (``stepguard up`` assigns free
ones); a port already taken is one :class:`~pipeline.io.errors.ConfigError` naming the
setting and the port, so the service exits with one line instead of a traceback.

Actuator (``stepguard_actuator_``):

=====================================  ==============================================
inputs_total{topic}                    decisions, approvals and control records read
alerts_total{grade,result}             alerts read: ``acted`` (an outcome followed),
                                       ``ignored`` (nothing to do), ``refused``
                                       (no worker signature)
actions_total{state}                   action records published, by state
commands_total{kind}                   signed commands published, by kind
guardrail_alerts_total                 guardrail alerts published
refused_total                          approvals and control messages refused
held_actions                           actions waiting for approve/reject now
breakers_open                          jobs whose circuit breaker is open now
=====================================  ==============================================

Executor (``stepguard_executor_``, labelled by ``executor``):

=====================================  ==============================================
commands_total{executor,kind,result}   commands answered: succeeded, failed, refused
refused_total{executor}                commands refused (signature, expiry, target)
consumed_total{executor}               records read from the commands topic
=====================================  ==============================================

Archiver (``stepguard_archiver_``):

=====================================  ==============================================
messages_total                         messages stored (rows or dead letters), committed
rows_total{table}                      rows inserted per table
dead_letters_total                     messages dead-lettered
insert_seconds{table}                  time per insert (histogram)
consumer_lag{topic}                    high watermark - next offset to fetch
=====================================  ==============================================
"""

from __future__ import annotations

import errno

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from pipeline.io.errors import ConfigError
from pipeline.io.settings import ENV_PREFIX

__all__ = ["ActuatorMetrics", "ArchiverMetrics", "ExecutorMetrics", "serve_metrics"]


def serve_metrics(
    registry: CollectorRegistry,
    port: int,
    setting: str,
    addr: str = "0.0.0.0",  # noqa: S104 - a scrape target
) -> None:
    """Serve ``/metrics`` of ``registry`` on ``port`` (0: do nothing).

    ``setting`` is the field name (``worker_metrics_port``) named in the error.

    Raises
    ------
    ConfigError
        The port cannot be bound (in use, or not allowed): one line naming the
        ``STEPGUARD_*`` variable and the port.
    """
    if not port:
        return
    try:
        start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        var = f"{ENV_PREFIX}{setting.upper()}"
        why = "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc})"
        raise ConfigError(
            f"{var}={port}: port {port} {why}; set {var} to a free port (0: no metrics)"
        ) from exc


class ActuatorMetrics:
    """The actuator's metrics (see the module table)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = reg = registry if registry is not None else CollectorRegistry()
        p = "stepguard_actuator_"
        self.inputs = Counter(p + "inputs", "Records read.", ["topic"], registry=reg)
        self.alerts = Counter(
            p + "alerts", "Alerts read, by result.", ["grade", "result"], registry=reg
        )
        self.actions = Counter(p + "actions", "Action records published.", ["state"], registry=reg)
        self.commands = Counter(p + "commands", "Commands published.", ["kind"], registry=reg)
        self.guardrail_alerts = Counter(
            p + "guardrail_alerts", "Guardrail alerts published.", registry=reg
        )
        self.refused = Counter(
            p + "refused", "Approvals and control messages refused.", registry=reg
        )
        self.held = Gauge(p + "held_actions", "Actions waiting for a decision.", registry=reg)
        self.breakers_open = Gauge(
            p + "breakers_open", "Jobs whose circuit breaker is open.", registry=reg
        )


class ExecutorMetrics:
    """An executor's metrics (see the module table)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = reg = registry if registry is not None else CollectorRegistry()
        p = "stepguard_executor_"
        self.commands = Counter(
            p + "commands", "Commands answered.", ["executor", "kind", "result"], registry=reg
        )
        self.refused = Counter(p + "refused", "Commands refused.", ["executor"], registry=reg)
        self.consumed = Counter(
            p + "consumed", "Records read from the commands topic.", ["executor"], registry=reg
        )


class ArchiverMetrics:
    """The archiver's metrics (see the module table)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = reg = registry if registry is not None else CollectorRegistry()
        p = "stepguard_archiver_"
        self.messages = Counter(p + "messages", "Messages stored and committed.", registry=reg)
        self.rows = Counter(p + "rows", "Rows inserted.", ["table"], registry=reg)
        self.dead_letters = Counter(p + "dead_letters", "Messages dead-lettered.", registry=reg)
        self.insert_seconds = Histogram(
            p + "insert_seconds", "Time per insert.", ["table"], registry=reg,
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
        )  # fmt: skip
        self.lag = Gauge(
            p + "consumer_lag", "High watermark - next offset to fetch.", ["topic"], registry=reg
        )
