"""``stepguard up``'s plan (what runs, with which environment) and its status table."""

from __future__ import annotations

import io
import socket
from pathlib import Path

import pytest
from rich.console import Console

from pipeline.io.errors import ConfigError
from pipeline.io.settings import load_settings
from pipeline.tools.supervisor import Supervisor
from pipeline.tools.up import UpOptions, build_plan
from pipeline.tools.up_board import MetricsBoard, status_table


def plan(tmp_path: Path, **kw: object):
    settings = load_settings({}, state_dir=tmp_path / "st")
    base = {"PATH": "/bin", "STEPGUARD_OPERATOR_PRIVATE_KEY": "should-not-leak"}
    return build_plan(settings, UpOptions(**kw), base, python="py", run_id="r1")  # type: ignore[arg-type]


def test_the_plan_runs_the_compose_services_with_their_own_ports_and_keys(tmp_path):
    p = plan(tmp_path, scenario="ci_smoke", workers=2, speed=4.0)
    specs = {s.name: s for s in p.specs}
    assert list(specs) == ["broker", "topics", "worker-1", "worker-2", "actuator",
                           "executor-dry-run", "archiver", "simulate"]  # fmt: skip
    assert p.broker_flavor == "tansu" and p.job_id == "ci_smoke-r1"
    assert any("in memory only" in n for n in p.notes)
    w1, w2 = specs["worker-1"], specs["worker-2"]
    assert w1.metrics_port != w2.metrics_port
    assert w1.env["STEPGUARD_WORKER_METRICS_PORT"] == str(w1.metrics_port)
    assert w1.env["STEPGUARD_WORKER_DATA_DIR"] != w2.env["STEPGUARD_WORKER_DATA_DIR"]
    assert specs["archiver"].env["STEPGUARD_CHDB_PATH"] == str(tmp_path / "st" / "archive")
    assert specs["simulate"].argv[3:] == (
        "simulate", "--scenario", "ci_smoke", "--speed", "4.0", "--job", "ci_smoke-r1",
        "--from-now", "--control",
    )  # fmt: skip
    private = {n: sorted(k for k in s.env if k.endswith("_PRIVATE_KEY")) for n, s in specs.items()}
    assert private["actuator"] == ["STEPGUARD_ACTUATOR_PRIVATE_KEY"]
    assert private["worker-1"] == ["STEPGUARD_WORKER_PRIVATE_KEY"]
    assert private["executor-dry-run"] == ["STEPGUARD_EXECUTOR_PRIVATE_KEY"]
    # the training job signs as its own job's controller, never as an executor
    assert private["simulate"] == ["STEPGUARD_JOB_CONTROLLER_PRIVATE_KEY"]
    assert private["archiver"] == []
    assert specs["worker-1"].env["STEPGUARD_JOB_CONTROLLER_PUBLIC_KEYS"]  # verifies results
    assert specs["simulate"].env["STEPGUARD_ACTUATOR_PUBLIC_KEYS"]
    assert specs["actuator"].env["STEPGUARD_ACTUATOR_MODE"] == "auto"
    assert specs["broker"].stop_tier > max(s.stop_tier for s in p.specs if s.name != "broker")
    assert all(s.log_path and s.log_path.endswith(f"logs/{s.name}.log") for s in p.specs)


def test_a_configured_broker_is_used_not_started(tmp_path):
    settings = load_settings({}, state_dir=tmp_path, kafka_bootstrap="k:9092")
    p = build_plan(settings, UpOptions(), {}, python="py")
    assert "broker" not in {s.name for s in p.specs}
    assert p.bootstrap == "k:9092" and p.broker_flavor == "kafka"


def test_the_alertmanager_bridge_runs_only_with_an_alertmanager(tmp_path):
    assert "alertmanager" not in {s.name for s in plan(tmp_path).specs}
    settings = load_settings({}, state_dir=tmp_path, alertmanager_url="http://u:pw@am:9093")
    p = build_plan(settings, UpOptions(), {}, python="py")
    bridge = {s.name: s for s in p.specs}["alertmanager"]
    assert bridge.argv[3:] == ("alertmanager",) and bridge.after == ("topics",)
    assert bridge.env["STEPGUARD_ALERTMANAGER_URL"] == "http://u:pw@am:9093"
    assert bridge.env["STEPGUARD_ALERTMANAGER_METRICS_PORT"] == str(bridge.metrics_port)
    assert (
        bridge.env["STEPGUARD_WORKER_PUBLIC_KEYS"] and bridge.env["STEPGUARD_ACTUATOR_PUBLIC_KEYS"]
    )
    assert not [k for k in bridge.env if k.endswith("_PRIVATE_KEY")]
    assert "alert episodes go to Alertmanager at http://am:9093" in p.notes  # no password
    # --durable: the Alertmanager scripts/alertmanager.sh started
    settings = load_settings({}, state_dir=tmp_path)
    durable = build_plan(settings, UpOptions(durable=True), {}, python="py",
                         alertmanager_url="http://127.0.0.1:19094")  # fmt: skip
    [spec] = [s for s in durable.specs if s.name == "alertmanager"]
    assert spec.env["STEPGUARD_ALERTMANAGER_URL"] == "http://127.0.0.1:19094"


def test_a_busy_base_port_is_one_clear_error(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ConfigError, match=f"port {port} \\(broker\\) is in use"):
            plan(tmp_path, base_port=port)


def test_the_status_table_renders_in_80_columns(tmp_path):
    p = plan(tmp_path, scenario="ci_smoke")
    sup = Supervisor(p.specs)
    sup.started("broker", 10, 0.0)
    board = MetricsBoard({})
    out = io.StringIO()
    Console(file=out, width=80, color_system="truecolor", force_terminal=True).print(
        status_table(sup, board, 5.0, "t")
    )
    text = out.getvalue()
    assert "executor-dry-run" in text and "waiting" in text


def test_a_watched_job_gets_its_nodes_spares_mode_and_its_own_signing_key(tmp_path):
    p = plan(tmp_path, job="ddp-1", nodes="node-a,node-b", spares="1", mode="auto")
    specs = {s.name: s for s in p.specs}
    assert "simulate" not in specs and p.job_id == "ddp-1"
    act = specs["actuator"].env
    assert act["STEPGUARD_ACTUATOR_MODE"] == "auto"
    assert act["STEPGUARD_GUARD_JOB_NODES"] == "2" and act["STEPGUARD_SPARE_NODES"] == "spare-0"
    # what the job reads from up.env (no secrets) ...
    assert p.shell_env["STEPGUARD_JOB_ID"] == "ddp-1"
    assert p.shell_env["STEPGUARD_NODES"] == "node-a,node-b"
    assert p.shell_env["STEPGUARD_SPARES"] == "spare-0"
    assert not [k for k in p.shell_env if k.endswith("_PRIVATE_KEY")]
    # ... and from job-controller.env (0600) the one key its results are signed with
    # ... and the cluster telemetry secret (this job's processes speak for its nodes)
    assert sorted(p.job_env) == [
        "STEPGUARD_JOB_CONTROLLER_PRIVATE_KEY", "STEPGUARD_TELEMETRY_SECRET",
    ]  # fmt: skip
    assert "STEPGUARD_TELEMETRY_SECRET" not in p.shell_env  # up.env is not 0600
    assert p.shell_env["STEPGUARD_ACTUATOR_PUBLIC_KEYS"]  # it verifies commands
    assert any("job ddp-1: 2 nodes" in n and "auto mode" in n for n in p.notes), p.notes


def test_a_job_without_mode_is_observed_and_a_count_of_nodes_is_enough(tmp_path):
    p = plan(tmp_path, job="j", nodes="16")
    act = {s.name: s for s in p.specs}["actuator"].env
    assert act["STEPGUARD_ACTUATOR_MODE"] == "observe" and act["STEPGUARD_GUARD_JOB_NODES"] == "16"
    assert "STEPGUARD_NODES" not in p.shell_env and "STEPGUARD_SPARE_NODES" not in act


def test_mode_applies_to_a_played_scenario_too(tmp_path):
    """Issue 41: `up --mode approve --scenario ...` ran the actuator in auto mode (the
    scenario's default), silently: --mode now wins, and the notes say so."""
    p = plan(tmp_path, scenario="ci_smoke", mode="approve")
    act = {s.name: s for s in p.specs}["actuator"].env
    assert act["STEPGUARD_ACTUATOR_MODE"] == "approve"
    assert any("approve mode" in n and "--mode" in n for n in p.notes), p.notes


def test_a_played_scenario_gets_the_skew_its_lead_needs_on_ups_own_stack(tmp_path):
    """Issue 41: `up --scenario X --speed 8` held the job to real time once its lead
    reached 80 % of the default 300 s allowance (a 2-minute play took ~12). On a stack
    up starts itself the allowance grows by the job's lead, as the demo's does; the
    simulator's argv uses the canonical spellings."""
    from pipeline.tools.simulator import find_scenario, lead_s

    p = plan(tmp_path, scenario="ci_smoke", speed=8.0)
    specs = {s.name: s for s in p.specs}
    want = str(round(300 + lead_s(find_scenario("ci_smoke"), 8.0)))
    for name in ("simulate", "worker-1", "actuator", "archiver", "executor-dry-run"):
        assert specs[name].env["STEPGUARD_MAX_CLOCK_SKEW_S"] == want, name
    assert any("clock-skew allowance" in n for n in p.notes), p.notes
    argv = specs["simulate"].argv
    assert "--job-id" not in argv and argv[argv.index("--job") + 1] == "ci_smoke-r1"
    # real time: no lead, nothing raised
    p = plan(tmp_path, scenario="ci_smoke", speed=1.0)
    assert "STEPGUARD_MAX_CLOCK_SKEW_S" not in {s.name: s for s in p.specs}["simulate"].env


def test_an_operators_own_skew_or_broker_is_never_overridden(tmp_path):
    settings = load_settings({"STEPGUARD_MAX_CLOCK_SKEW_S": "120"}, state_dir=tmp_path)
    base = {"STEPGUARD_MAX_CLOCK_SKEW_S": "120"}
    p = build_plan(settings, UpOptions(scenario="ci_smoke", speed=8.0), base, python="py")
    assert {s.env["STEPGUARD_MAX_CLOCK_SKEW_S"] for s in p.specs} == {"120"}
    # a broker up does not start is shared: its other clients keep the default
    settings = load_settings({}, state_dir=tmp_path, kafka_bootstrap="k:9092")
    p = build_plan(settings, UpOptions(scenario="ci_smoke", speed=8.0), {}, python="py")
    assert all("STEPGUARD_MAX_CLOCK_SKEW_S" not in s.env for s in p.specs)


def test_job_and_scenario_together_are_refused():
    with pytest.raises(ValueError, match="--job and --scenario"):
        UpOptions(job="j", scenario="ci_smoke")
    with pytest.raises(ValueError, match="describe a --job"):
        UpOptions(nodes="2")


def test_up_writes_the_jobs_controller_key_where_only_the_user_reads_it(tmp_path):
    """Issue 22 item 4 / 25: the listener could not sign results with up's keys (only
    public keys went to up.env), and training processes were handed the executor's key.
    Now the job gets a key of its own role, bound to its job, in a 0600 file."""
    import stat

    from pipeline.io.trust import job_controller_key_id, signing_key
    from pipeline.tools.up import JOB_ENV_FILE, write_job_env

    p = plan(tmp_path, scenario="ci_smoke")
    assert list(p.job_env) == [
        "STEPGUARD_JOB_CONTROLLER_PRIVATE_KEY", "STEPGUARD_TELEMETRY_SECRET",
    ]  # fmt: skip
    assert not any(k.endswith("_PRIVATE_KEY") for k in p.shell_env)  # up.env: no secret
    path = tmp_path / JOB_ENV_FILE
    write_job_env(path, p.job_env)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    written = dict(line.split("=", 1) for line in path.read_text().splitlines())
    assert written == p.job_env
    key = signing_key(load_settings(written), "job_controller", "t")
    assert key.key_id.split(".")[0] == job_controller_key_id("ci_smoke-r1")
    public = {s.name: s.env.get("STEPGUARD_JOB_CONTROLLER_PUBLIC_KEYS", "") for s in p.specs}
    assert key.public_text() in public["worker-1"]
    # no job: no controller key (the telemetry secret, for a job started by hand)
    assert list(plan(tmp_path).job_env) == ["STEPGUARD_TELEMETRY_SECRET"]


def test_a_port_whose_connections_linger_in_time_wait_is_free_for_up():
    """A scraped endpoint closes its connections first, so after a stop its port holds
    TIME_WAIT sockets for a minute; the services bind with SO_REUSEADDR, and so must
    up's check (`up --base-port` again right after a stop with Prometheus)."""
    import socket

    from pipeline.tools.up import _port_free

    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port), timeout=5)
        conn, _ = server.accept()
        conn.close()  # the server side closes first: its end goes to TIME_WAIT
        client.recv(1)
        client.close()
        assert not _port_free(port)  # still listening
    assert _port_free(port)


def test_up_hands_the_ephemeral_telemetry_secret_to_the_workers_and_the_simulator_only(tmp_path):
    """Issue 39: the embedded default authenticates telemetry out of the box: one
    ephemeral cluster secret for the run, given to the workers (they verify), the
    simulator (it plays every node) and the watched job, to no other child."""
    p = plan(tmp_path, scenario="ci_smoke")
    holders = {s.name for s in p.specs if "STEPGUARD_TELEMETRY_SECRET" in s.env}
    assert holders == {n for n in (s.name for s in p.specs) if n.startswith("worker-")} | {
        "simulate"
    }
    secrets = {s.env["STEPGUARD_TELEMETRY_SECRET"] for s in p.specs if s.name in holders}
    assert len(secrets) == 1 and secrets == {p.job_env["STEPGUARD_TELEMETRY_SECRET"]}
    assert any("telemetry" in n for n in p.notes), p.notes
