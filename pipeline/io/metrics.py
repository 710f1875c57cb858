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

Every endpoint also answers ``/healthz`` (200 while the process serves) and ``/readyz``
(200 once the service consumes its topics: its last poll of the broker, or the worker's
last partition assignment, is recent; else 503 with the reason, one line), for a
supervisor or Kubernetes probe (:class:`Readiness`).

Every endpoint listens on ``STEPGUARD_METRICS_BIND_ADDRESS``: 127.0.0.1 unless set
(the Docker image and docker-compose set ``0.0.0.0``, for a scraper in another
container). Two services of one kind on one host need a port each (``stepguard up``
assigns free ones); a port already taken is one :class:`~pipeline.io.errors.ConfigError`
naming the setting and the port, so the service exits with one line instead of a
traceback. Each registry also holds the process's own ``process_*`` metrics
(:func:`service_registry`): its start time shows restarts.

Actuator (``stepguard_actuator_``):

=====================================  ==============================================
inputs_total{topic}                    decisions, approvals and control records read
alerts_total{grade,result}             alerts read: ``acted`` (an outcome followed),
                                       ``ignored`` (nothing to do), ``refused``
                                       (no worker signature)
actions_total{mode,state}              actions decided: each action record published
                                       (observed, held, approved, rejected,
                                       cancelled, refused), and ``issued`` for an
                                       action carried out at once (auto mode), whose
                                       commands go out with no record of their own
commands_total{kind}                   signed commands published, by kind
guardrail_alerts_total                 guardrail alerts published
refused_total                          approvals and control messages refused
held_actions                           actions waiting for approve/reject now
oldest_held_seconds                    age of the oldest of them (0: none)
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
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    make_wsgi_app,
)

from pipeline.io.errors import ConfigError
from pipeline.io.settings import ENV_PREFIX, ClientSettings

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

__all__ = [
    "Readiness",
    "ActuatorMetrics",
    "ArchiverMetrics",
    "ExecutorMetrics",
    "serve_metrics",
    "service_registry",
]


def service_registry(registry: CollectorRegistry | None = None) -> CollectorRegistry:
    """``registry``, or a new one holding the process's own metrics
    (``process_start_time_seconds``, CPU, memory, open files): a restart shows as a new
    start time, which the shipped StepguardServiceRestarting alert counts."""
    if registry is not None:
        return registry
    reg = CollectorRegistry()
    ProcessCollector(registry=reg)
    return reg


class Readiness:
    """Whether a service is ready: it has polled its topics within ``stale_s`` seconds
    (``None``: once is enough, e.g. the worker's partition assignment).

    >>> clock = [0.0]
    >>> r = Readiness(stale_s=30, clock=lambda: clock[0])
    >>> r.problem()
    'not consuming yet (starting)'
    >>> r.polled(); r.problem() is None
    True
    >>> clock[0] = 45.0; r.problem()
    'no poll of its topics for 45s (more than 30s)'
    """

    def __init__(
        self, stale_s: float | None = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.stale_s = stale_s
        self._clock = clock
        self._last: float | None = None

    def polled(self) -> None:
        """The service has just polled its topics (or been assigned them)."""
        self._last = self._clock()

    def problem(self) -> str | None:
        """Why the service is not ready, or ``None``."""
        if self._last is None:
            return "not consuming yet (starting)"
        age = self._clock() - self._last
        if self.stale_s is not None and age > self.stale_s:
            return f"no poll of its topics for {age:.0f}s (more than {self.stale_s:.0f}s)"
        return None


def _app(registry: CollectorRegistry, readiness: Readiness | None) -> Callable[..., Any]:
    """``/metrics`` of ``registry``, ``/healthz`` and ``/readyz``."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/readyz"):
            why = readiness.problem() if path == "/readyz" and readiness else None
            status = "200 OK" if why is None else "503 Service Unavailable"
            start(status, [("Content-Type", "text/plain; charset=utf-8")])
            return [f"{why or 'ok'}\n".encode()]
        return metrics(environ, start)  # type: ignore[no-any-return]

    return app


def _start(port: int, addr: str, app: Callable[..., Any]) -> WSGIServer:
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client.exposition import ThreadingWSGIServer, _get_best_family

    class Server(ThreadingWSGIServer):
        address_family, _ = _get_best_family(addr, port)  # IPv6 addresses too

    class Quiet(WSGIRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            """Every scrape is not a log line."""

    server = make_server(addr, port, app, Server, handler_class=Quiet)
    threading.Thread(target=server.serve_forever, daemon=True, name="metrics").start()
    return server


def serve_metrics(
    registry: CollectorRegistry,
    settings: ClientSettings,
    setting: str,
    readiness: Readiness | None = None,
) -> WSGIServer | None:
    """Serve ``/metrics`` of ``registry``, ``/healthz`` and ``/readyz`` (``readiness``;
    ``None``: ready while it serves) on the port of ``setting`` (0: do nothing),
    listening on ``settings.metrics_bind_address`` (loopback unless configured).

    ``setting`` is the field name of the port (``worker_metrics_port``), named in the
    error. Returns the server (``shutdown()`` stops it), or None when the port is 0.

    Raises
    ------
    ConfigError
        The port cannot be bound (in use, or not allowed): one line naming the
        ``STEPGUARD_*`` variable and the port.
    """
    port = int(getattr(settings, setting))
    if not port:
        return None
    addr = settings.metrics_bind_address
    try:
        server = _start(port, addr, _app(registry, readiness))
    except OSError as exc:
        var = f"{ENV_PREFIX}{setting.upper()}"
        why = "is in use" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc})"
        raise ConfigError(
            f"{var}={port}: port {port} on {addr} {why}; set {var} to a free port (0: no metrics)"
        ) from exc
    return server


class ActuatorMetrics:
    """The actuator's metrics (see the module table)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = reg = service_registry(registry)
        #: ``/readyz``: ready while it polls its topics
        self.readiness = Readiness()
        p = "stepguard_actuator_"
        self.inputs = Counter(p + "inputs", "Records read.", ["topic"], registry=reg)
        self.alerts = Counter(
            p + "alerts", "Alerts read, by result.", ["grade", "result"], registry=reg
        )
        self.actions = Counter(
            p + "actions", "Actions decided, by mode and state (issued: carried out at once).",
            ["mode", "state"], registry=reg,
        )  # fmt: skip
        self.commands = Counter(p + "commands", "Commands published.", ["kind"], registry=reg)
        self.guardrail_alerts = Counter(
            p + "guardrail_alerts", "Guardrail alerts published.", registry=reg
        )
        self.refused = Counter(
            p + "refused", "Approvals and control messages refused.", registry=reg
        )
        self.held = Gauge(p + "held_actions", "Actions waiting for a decision.", registry=reg)
        self.oldest_held = Gauge(
            p + "oldest_held_seconds", "Age of the oldest action waiting for a decision.",
            registry=reg,
        )  # fmt: skip
        self.breakers_open = Gauge(
            p + "breakers_open", "Jobs whose circuit breaker is open.", registry=reg
        )


class ExecutorMetrics:
    """An executor's metrics (see the module table)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = reg = service_registry(registry)
        #: ``/readyz``: ready while it polls its topics
        self.readiness = Readiness()
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
        self.registry = reg = service_registry(registry)
        #: ``/readyz``: ready while it polls its topics
        self.readiness = Readiness()
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
