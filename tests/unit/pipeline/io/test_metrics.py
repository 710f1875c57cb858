"""Metrics endpoints: a busy port is one clear error line naming the setting, for
every service, before any broker is contacted."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import urllib.request

import pytest
from prometheus_client import CollectorRegistry, Counter

from pipeline.io.embedded import free_port
from pipeline.io.errors import ConfigError
from pipeline.io.metrics import serve_metrics
from pipeline.io.settings import load_settings


@pytest.fixture
def busy_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", 0))
        s.listen(1)
        yield s.getsockname()[1]


def test_a_busy_port_names_the_setting_and_the_port(busy_port):
    settings = load_settings({}, archiver_metrics_port=busy_port)
    with pytest.raises(ConfigError) as info:
        serve_metrics(CollectorRegistry(), settings, "archiver_metrics_port")
    text = str(info.value)
    assert f"STEPGUARD_ARCHIVER_METRICS_PORT={busy_port}" in text and "in use" in text
    assert "\n" not in text


def test_port_zero_serves_nothing_and_a_free_port_serves_the_registry():
    reg = CollectorRegistry()
    Counter("stepguard_x", "x", registry=reg).inc(3)
    off = load_settings({}, worker_metrics_port=0)
    assert serve_metrics(reg, off, "worker_metrics_port") is None  # nothing, nothing raised
    port = free_port()
    server = serve_metrics(reg, load_settings({}, worker_metrics_port=port), "worker_metrics_port")
    assert server is not None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            assert "stepguard_x_total 3.0" in resp.read().decode()
    finally:
        server.shutdown()
        server.server_close()


def _non_loopback_address() -> str | None:
    """An address of this host other than loopback (the one a default route uses)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent for UDP connect
        except OSError:
            return None
        addr = s.getsockname()[0]
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


def test_metrics_bind_loopback_by_default_and_the_setting_changes_it():
    """Outside a container nothing but this host can scrape (issue 22/24): the
    default listens on 127.0.0.1; STEPGUARD_METRICS_BIND_ADDRESS=0.0.0.0 opens it."""
    assert load_settings({}).metrics_bind_address == "127.0.0.1"
    reg = CollectorRegistry()
    port = free_port()
    server = serve_metrics(reg, load_settings({}, worker_metrics_port=port), "worker_metrics_port")
    assert server is not None
    try:
        assert server.server_address[0] == "127.0.0.1"
        other = _non_loopback_address()
        if other is not None:  # the endpoint is not reachable on the host's own address
            with pytest.raises(OSError):
                socket.create_connection((other, port), timeout=2).close()
    finally:
        server.shutdown()
        server.server_close()
    env = {"STEPGUARD_METRICS_BIND_ADDRESS": "0.0.0.0", "STEPGUARD_WORKER_METRICS_PORT": "0"}
    assert load_settings(env).metrics_bind_address == "0.0.0.0"
    with pytest.raises(ConfigError, match="STEPGUARD_METRICS_BIND_ADDRESS"):
        load_settings({"STEPGUARD_METRICS_BIND_ADDRESS": "everywhere"})


@pytest.mark.parametrize(
    ("argv", "var"),
    [
        (["worker"], "STEPGUARD_WORKER_METRICS_PORT"),
        (["actuator"], "STEPGUARD_ACTUATOR_METRICS_PORT"),
        (["executor", "dry-run"], "STEPGUARD_EXECUTOR_METRICS_PORT"),
        (["archiver"], "STEPGUARD_ARCHIVER_METRICS_PORT"),
        (["alertmanager"], "STEPGUARD_ALERTMANAGER_METRICS_PORT"),
    ],
)
def test_a_service_on_a_busy_port_exits_with_one_line(argv, var, busy_port, tmp_path):
    """The second service of a kind on one host: exit 2 and one line, no traceback
    (the broker address is unreachable: the port is checked before it is used)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPGUARD_")}
    env |= {
        "STEPGUARD_KAFKA_BOOTSTRAP": "127.0.0.1:9",
        "STEPGUARD_STATE_DIR": str(tmp_path),
        "STEPGUARD_CHDB_PATH": str(tmp_path / "archive"),
        "STEPGUARD_WORKER_DATA_DIR": str(tmp_path / "worker"),
        var: str(busy_port),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pipeline", *argv], env=env, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    out = (done.stdout + done.stderr).strip()
    assert done.returncode == 2, out
    assert "Traceback" not in out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) <= 2, out  # rich may wrap the one message
    assert var in " ".join(lines) and str(busy_port) in out


def test_up_gives_every_service_its_own_metrics_port_and_sums_their_counters(tmp_path):
    from pipeline.io.settings import load_settings
    from pipeline.tools.up import UpOptions, build_plan
    from pipeline.tools.up_board import parse_metrics

    settings = load_settings({}, state_dir=tmp_path)
    p = build_plan(settings, UpOptions(workers=2, scenario="ci_smoke"), {"PATH": "/bin"},
                   python="py", run_id="r1")  # fmt: skip
    var = {"worker-1": "WORKER", "worker-2": "WORKER", "actuator": "ACTUATOR",
           "executor-dry-run": "EXECUTOR", "archiver": "ARCHIVER",
           "simulate": "LISTENER"}  # fmt: skip
    ports = {s.name: s.metrics_port for s in p.specs if s.metrics_port}
    assert set(ports) == set(var) and len(set(ports.values())) == len(ports)
    for spec in p.specs:
        if spec.name in var:
            assert spec.env[f"STEPGUARD_{var[spec.name]}_METRICS_PORT"] == str(spec.metrics_port)
    # another shell (up.env) gets the public keys to verify alerts, never a private one
    assert {"STEPGUARD_WORKER_PUBLIC_KEYS", "STEPGUARD_ACTUATOR_PUBLIC_KEYS"} <= set(p.shell_env)
    assert not [k for k in p.shell_env if "PRIVATE" in k]
    text = (
        'stepguard_executor_commands_total{executor="dry-run",kind="isolate",result="ok"} 2\n'
        'stepguard_executor_commands_total{executor="dry-run",kind="stop",result="refused"} 1\n'
        'stepguard_executor_consumed_total{executor="dry-run"} 5\n'
        'stepguard_archiver_consumer_lag{topic="steps"} 40\n'
    )
    assert parse_metrics(text) == {"commands": 3.0, "records": 5.0, "lag": 40.0}
