"""The worker's role (``stepguard worker``): :class:`WorkerSettings`, its state, pace and
limits."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings

from pipeline.io.settings._base import MODEL_CONFIG

__all__ = ["WorkerSettings"]


class WorkerSettings(BaseSettings):
    """The worker's knobs: its table and snapshots, its batches and timers, the
    bounds of what it holds (jobs, ranks, nodes, phases)."""

    model_config = MODEL_CONFIG

    #: Prometheus port of ``stepguard worker`` (0: off; :mod:`pipeline.io.metrics`)
    worker_metrics_port: int = Field(default=9108, ge=0, le=65535)
    worker_store: str = Field(default="memory://", pattern=r"^(memory|rocksdb)://.*$")
    worker_data_dir: Path = Path(".stepguard/worker")
    #: snapshot a job's detector state to the table after this many completed steps ...
    worker_snapshot_steps: int = Field(default=10, ge=1)
    #: ... or when this much wall time passed since the last snapshot of a changed job
    worker_snapshot_interval_s: float = Field(default=2.0, gt=0)
    #: ... and never so often that snapshots take more than this share of the worker's
    #: time: a job whose last snapshot took c seconds waits c / budget before the next
    #: (a 131k-rank state takes a good part of a second to encode on the agent's task)
    worker_snapshot_budget: float = Field(default=0.05, gt=0, le=1)
    #: event seconds a silent job's clock moves per wall second (the hang and presence
    #: clocks between steps): 1 in production; a job replayed at SPEED x real time
    #: (``stepguard simulate --speed``, the real-time benchmark) sets SPEED
    worker_event_rate: float = Field(default=1.0, gt=0, le=1000)
    #: how often the hang timer ticks every owned job (wall seconds)
    worker_tick_interval_s: float = Field(default=1.0, gt=0)
    #: the job agent reads up to this many events per call (Faust's noack_take; a steps
    #: event is a whole fetch of one partition, a jobs-topic event one record) ...
    worker_batch_max: int = Field(default=1000, ge=1, le=100_000)
    #: ... waiting at most this long for a batch to fill (adds to a step's latency)
    worker_batch_within_s: float = Field(default=0.005, gt=0, le=1.0)
    #: larger input messages go to the dead-letter topic
    worker_max_message_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    #: largest compressed detector snapshot of one job (~140 B per rank before zlib):
    #: the changelog topic's max.message.bytes and the worker's request and fetch sizes
    worker_max_snapshot_bytes: int = Field(default=64 * 1024 * 1024, ge=1024 * 1024)
    #: consumer-group session timeout of the worker (Tansu: 3-6 s, see docs/backends.md)
    worker_session_timeout_s: float = Field(default=10.0, ge=1.0, le=300.0)
    #: a worker whose table recovery has not completed for this long exits (code 75)
    #: for its supervisor to restart it (Faust's recovery can stall after a rebalance)
    worker_recovery_timeout_s: float = Field(default=120.0, gt=0)
    #: jobs one worker holds at most; records of more jobs are dead-lettered
    worker_max_jobs: int = Field(default=10_000, ge=1)
    #: a job with no step, command or lifecycle record for this long (wall seconds) is
    #: abandoned: its state is dropped with one INFO alert
    job_idle_ttl_s: float = Field(default=3600.0, gt=0)
    #: distinct ranks one job may have; records of further ranks are dead-lettered
    max_ranks_per_job: int = Field(default=262_144, ge=1, le=1_048_576)
    #: distinct nodes one job may have; records of further nodes are dead-lettered
    max_nodes_per_job: int = Field(default=65_536, ge=1, le=65_536)
    #: jobs named only by health reports or start events (no step yet) one worker holds,
    #: and for how many wall seconds: they never count against worker_max_jobs
    worker_max_pending_jobs: int = Field(default=1024, ge=1)
    worker_pending_ttl_s: float = Field(default=300.0, gt=0)
    #: the longest allowance an announced phase (checkpoint, eval) gets, seconds; a
    #: longer one is cut to it (a lifecycle anomaly)
    max_phase_s: float = Field(default=3600.0, gt=0, le=86_400.0)
    #: event time an end stays pending (refused by any later step) before it ends the job
    end_confirm_s: float = Field(default=60.0, gt=0, le=3600.0)
    #: detector thresholds of new jobs (pipeline/io/detector_config.py); None: defaults
    detector_config: Path | None = None
