"""Prometheus metrics of ``stepguard worker`` (served on ``worker_metrics_port``).

==========================================  =============================================
Metric                                      Meaning
==========================================  =============================================
stepguard_worker_records_total{topic}       records consumed (rate: events/s)
stepguard_worker_rank_steps_total           rank-steps scored (ranks x completed steps)
stepguard_worker_steps_total                job steps completed and scored
stepguard_worker_alerts_total{grade,state}  alert updates published
stepguard_worker_dead_letters_total{stage}  records sent to the dead-letter topic
stepguard_worker_unrouted_health_total      health reports naming no job (not scored)
stepguard_worker_health_watermarks_total{state}  watermarks of the health partitions this
                                            worker reads, written by its timer (state:
                                            ``read`` to the partition's end, or ``lagging``)
stepguard_worker_refused_telemetry_total{topic,node}  telemetry refused for want of its
                                            writer's proof, by the node it claims (the
                                            first 1,000 nodes; the rest as ``other``)
stepguard_worker_consumer_lag{topic,partition}  highwater - next offset to read
stepguard_worker_process_seconds            handler time per record (a steps batch: its mean, once)
stepguard_worker_step_latency_seconds       wall time at scoring - event time of step end
stepguard_worker_snapshots_total            detector snapshots written to the table
stepguard_worker_jobs                       jobs held by this process
stepguard_worker_assigned_partitions        steps + job-topic partitions owned
==========================================  =============================================
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pipeline.io.metrics import Readiness, serve_metrics, service_registry
from pipeline.io.settings import Settings

__all__ = ["REFUSED_WRITER_LABELS", "BoundedLabels", "WorkerMetrics"]

#: distinct claimed nodes the refused-telemetry counter names (then ``other``)
REFUSED_WRITER_LABELS = 1000


class BoundedLabels:
    """Label values as given until ``limit`` distinct ones were seen, then ``other``
    (a label's value here is whatever a refused record claims).

    >>> b = BoundedLabels(2)
    >>> [b.label(n) for n in ("a", "b", "c", "a")]
    ['a', 'b', 'other', 'a']
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.limit = limit
        self._seen: set[str] = set()

    def label(self, value: str) -> str:
        value = value[:256]
        if value in self._seen:
            return value
        if len(self._seen) >= self.limit:
            return "other"
        self._seen.add(value)
        return value


_LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1.0, 1.25,
    1.5, 2.0, 3.0, 5.0, 10.0, 30.0,
)  # fmt: skip


class WorkerMetrics:
    """The worker's metrics in their own registry (tests build several)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = reg = service_registry(registry)
        #: ``/readyz``: ready once Faust assigned it partitions (a rebalance marks it)
        self.readiness = Readiness(stale_s=None)
        p = "stepguard_worker_"
        self.records = Counter(p + "records", "Records consumed.", ["topic"], registry=reg)
        self.rank_steps = Counter(p + "rank_steps", "Rank-steps scored.", registry=reg)
        self.steps = Counter(p + "steps", "Job steps scored.", registry=reg)
        self.alerts = Counter(
            p + "alerts", "Alert updates published.", ["grade", "state"], registry=reg
        )
        self.health_watermarks = Counter(
            p + "health_watermarks", "Watermarks of the health partitions this worker reads, "
            "written to the jobs topic (a node's silence is judged only as far as its "
            "partition delivered).", ["state"], registry=reg,
        )  # fmt: skip
        self.dead_letters = Counter(
            p + "dead_letters", "Records dead-lettered.", ["stage"], registry=reg
        )
        self.refused_telemetry = Counter(
            p + "refused_telemetry", "Telemetry refused for want of its writer's proof.",
            ["topic", "node"], registry=reg,
        )  # fmt: skip
        self.unrouted_health = Counter(
            p + "unrouted_health", "Health reports without a job id.", registry=reg
        )
        self.lag = Gauge(
            p + "consumer_lag", "Records not yet read.", ["topic", "partition"], registry=reg
        )
        self.process_seconds = Histogram(
            p + "process_seconds", "Handler time per record (a steps batch: its mean, once).",
            registry=reg,
            buckets=(1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2, 0.1, 1.0),
        )  # fmt: skip
        self.step_latency = Histogram(
            p + "step_latency_seconds", "Scoring wall time minus step-end event time.",
            registry=reg, buckets=_LATENCY_BUCKETS,
        )  # fmt: skip
        self.snapshots = Counter(p + "snapshots", "Snapshots written.", registry=reg)
        self.jobs = Gauge(p + "jobs", "Jobs held by this process.", registry=reg)
        self.job_states = Gauge(
            p + "jobs_by_state", "Jobs held, by state (running; relaunching from a "
            "relaunch command to the new run's first step; relaunch_stuck past "
            "relaunch_max_s; ending).", ["state"], registry=reg,
        )  # fmt: skip
        self.state_events = Gauge(
            p + "state_events", "Since start: snapshots unreadable or oversized, records "
            "refused for a capacity limit or of an ended run.", ["event"], registry=reg,
        )  # fmt: skip
        self.assigned = Gauge(
            p + "assigned_partitions", "Steps + job-topic partitions owned.", registry=reg
        )

    def serve(self, settings: Settings) -> None:
        """Expose ``/metrics`` on ``worker_metrics_port`` (0: do nothing) and
        ``metrics_bind_address``; a port in use is a
        :class:`~pipeline.io.errors.ConfigError` naming STEPGUARD_WORKER_METRICS_PORT."""
        serve_metrics(self.registry, settings, "worker_metrics_port", self.readiness)
