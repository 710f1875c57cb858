"""Start ``stepguard worker``: create topics, serve metrics, run the Faust worker."""

from __future__ import annotations

import logging

from pipeline.io.settings import Settings

__all__ = ["run_worker"]

log = logging.getLogger(__name__)


def run_worker(settings: Settings, loglevel: str = "warning") -> None:
    """Run until SIGTERM/SIGINT; a broker failure raises (exit non-zero)."""
    import faust
    from kafka.errors import KafkaError

    from pipeline.io.errors import BrokerError
    from pipeline.services.worker.app import build_app, prepare_topics
    from pipeline.services.worker.metrics import WorkerMetrics

    settings.worker_data_dir.mkdir(parents=True, exist_ok=True)
    metrics = WorkerMetrics()
    metrics.serve(settings)  # a busy port: one line, before the broker
    try:
        n = prepare_topics(settings)
    except KafkaError as exc:
        raise BrokerError(f"cannot reach {settings.kafka_bootstrap}: {exc}") from exc
    wa = build_app(settings, n, metrics)
    if wa.control is not None:  # signed detector settings, read by every worker
        wa.control.start()
    _use_uvloop()
    _tune_gc()
    worker = faust.Worker(wa.app, loglevel=loglevel, quiet=True)
    worker.execute_from_commandline()


#: Allocations between two collections of the youngest generation (CPython: 700).
GC_GEN0_THRESHOLD = 20_000


def _tune_gc() -> None:
    """Collect cycles less often: the hot path allocates a tuple per rank sample and
    a few objects per record, nearly none of them in cycles, and at CPython's default
    threshold the cyclic collector ran every few dozen records (measured: 5 % of the core's
    time at 128 nodes x 8 ranks). What the process holds at start (modules, Faust, the
    app) is frozen out of every collection."""
    import gc

    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


def _use_uvloop() -> None:
    """Run Faust on uvloop where it is installed (Linux, macOS): Faust spends most of a
    record's time in event-loop machinery (a task per record), which uvloop makes
    cheaper. Without it the stock asyncio loop works the same, only slower."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        log.info("uvloop not installed; using the asyncio event loop")
        return
    import mode.loop

    mode.loop.use("uvloop")
