"""build_app without a broker: the agents, timer, table and handlers it wires, and the
core it configures from Settings (the Faust app connects only when started)."""

from __future__ import annotations

from pipeline.io.settings import Settings
from pipeline.services.worker.app import build_app
from pipeline.services.worker.streams import WorkerStreams
from tests.factories import key_settings, telemetry_settings


def test_build_app_wires_the_agents_timer_table_and_handlers_to_one_core(tmp_path):
    settings = Settings(
        kafka_bootstrap="localhost:1", worker_data_dir=tmp_path, worker_snapshot_steps=7,
        worker_tick_interval_s=2.0, **key_settings(), **telemetry_settings(),
    )  # fmt: skip
    worker = build_app(settings, 4)
    app, core = worker.app, worker.core
    assert sorted(app.agents) == [
        f"stepguard.worker.{what}" for what in ("command", "health", "jobs", "lifecycle", "result")
    ]
    assert len(app._app_tasks) == 1  # the tick timer
    assert list(app.tables.keys()) == ["job-states"]
    handlers = [
        *app.on_partitions_revoked._filter_receivers.values(),
        *app.on_partitions_assigned._filter_receivers.values(),
    ]
    owners = {h.__self__ for receivers in handlers for h in receivers}
    assert len(owners) == 1 and isinstance(owners.pop(), WorkerStreams)
    config = core.config
    assert (config.n_partitions, config.snapshots.snapshot_steps) == (4, 7)
    assert config.timing.blind_after_s == 10.0  # 5 ticks
    assert config.trust.seal is not None and config.trust.telemetry is not None
    assert config.trust.command_keys and config.trust.result_keys
