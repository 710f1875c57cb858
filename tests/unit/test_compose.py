"""docker-compose.yml is validated statically (no Docker engine runs here): against the
Compose Specification's JSON Schema (vendored by check-jsonschema), every stepguard
service's command must exist in the CLI, and every Kafka client has its own principal
among those `scripts/kafka.sh acl-spec` grants (docs/kafka-acls.md)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from pipeline.cli.app import app

ROOT = Path(__file__).resolve().parents[2]


def _compose_schema() -> dict:
    # check-jsonschema ships the compose-spec schema; read the file without importing
    # the package (its CLI module needs a newer click than faust allows).
    spec = importlib.util.find_spec("check_jsonschema")
    assert spec is not None and spec.submodule_search_locations, "pip install check-jsonschema"
    base = Path(next(iter(spec.submodule_search_locations)))
    return json.loads((base / "builtin_schemas" / "vendor" / "compose-spec.json").read_text())


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_file_matches_the_compose_specification(compose):
    schema = _compose_schema()
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(compose)]
    assert errors == []


def test_every_stepguard_service_command_exists_in_the_cli(compose):
    runner = CliRunner()
    services = {
        name: svc
        for name, svc in compose["services"].items()
        if svc.get("image") == "stepguard:latest"
    }
    assert {"worker", "actuator", "archiver"} <= set(services)
    for name, svc in services.items():
        argv = [str(a) for a in svc["command"]]
        # --help is eager: it proves the (sub)command and its options parse, runs nothing
        result = runner.invoke(app, [*argv, "--help"])
        assert result.exit_code == 0, (
            f"service {name}: `stepguard {' '.join(argv)}`: {result.output}"
        )


def test_workers_are_replicated_and_services_configured_by_stepguard_variables(compose):
    assert compose["services"]["worker"]["deploy"]["replicas"] >= 2
    for name in ("worker", "actuator", "archiver"):
        env = compose["services"][name]["environment"]
        assert env["STEPGUARD_KAFKA_BOOTSTRAP"] == "kafka:9092", name
        assert "STEPGUARD_CLICKHOUSE_DSN" in env, name
    for name in ("kafka", "clickhouse"):
        assert "healthcheck" in compose["services"][name]


# -- Kafka: one principal per service, the ACLs of scripts/kafka.sh ---------------------
def _acl_principals() -> set[str]:
    """The principals `scripts/kafka.sh acl-spec` grants anything (no broker needed)."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "kafka.sh"), "acl-spec"],
        check=True, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    return {line.split()[0].removeprefix("User:") for line in out.stdout.splitlines()}


#: service -> the principal it must use (topics runs once, as the admin)
SERVICE_PRINCIPALS = {
    "worker": "worker", "actuator": "actuator", "archiver": "archiver",
    "simulator": "simulator", "topics": "admin", "alertmanager-bridge": "alertmanager",
}  # fmt: skip


def test_each_kafka_service_has_its_own_principal_and_password(compose):
    services = compose["services"]
    granted = _acl_principals()
    for name, principal in SERVICE_PRINCIPALS.items():
        env = services[name]["environment"]
        assert env["STEPGUARD_KAFKA_SECURITY_PROTOCOL"] == "SASL_SSL", name
        assert env["STEPGUARD_KAFKA_SSL_CAFILE"], name
        assert env["STEPGUARD_KAFKA_SASL_USERNAME"] == principal, name
        password = env["STEPGUARD_KAFKA_SASL_PASSWORD"]
        if principal == "admin":
            assert env["STEPGUARD_KAFKA_SASL_MECHANISM"] == "PLAIN"
            assert password.startswith("${KAFKA_ADMIN_PASSWORD:?"), name
        else:
            assert principal in granted, f"{name}: no ACL for principal {principal}"
            assert env["STEPGUARD_KAFKA_SASL_MECHANISM"] == "SCRAM-SHA-512", name
            assert password.startswith(f"${{KAFKA_PASSWORD_{principal.upper()}:?"), name
    # the long-running services never share a principal
    running = [services[n]["environment"]["STEPGUARD_KAFKA_SASL_USERNAME"]
               for n in ("worker", "actuator", "archiver", "simulator",
                         "alertmanager-bridge")]  # fmt: skip
    assert len(set(running)) == len(running)


def test_every_stepguard_service_waits_for_the_acls_and_reads_the_ca(compose):
    for name, svc in compose["services"].items():
        if svc.get("image") != "stepguard:latest" or name in ("topics", "migrate"):
            continue
        assert svc["depends_on"]["kafka-init"]["condition"] == "service_completed_successfully"
        assert svc["depends_on"]["topics"]["condition"] == "service_completed_successfully"
        assert "./kafka-tls/ca.pem:/etc/stepguard/kafka-ca.pem:ro" in svc["volumes"], name


def test_kafka_init_applies_the_scripts_acls_for_every_principal(compose):
    init = compose["services"]["kafka-init"]
    assert "kafka.sh apply-acls" in init["command"][0]
    assert "./scripts/kafka.sh:/stepguard/kafka.sh:ro" in init["volumes"]
    env = init["environment"]
    wanted = {f"KAFKA_PASSWORD_{p.upper()}" for p in _acl_principals()}
    assert wanted <= set(env)
    assert all(env[k].startswith(f"${{{k}:?") for k in wanted)  # from .env, never inline


def test_the_broker_authenticates_and_authorises_every_client(compose):
    env = compose["services"]["kafka"]["environment"]
    protocols = dict(p.split(":") for p in env["KAFKA_LISTENER_SECURITY_PROTOCOL_MAP"].split(","))
    assert set(protocols.values()) == {"SASL_SSL", "SSL"}  # no PLAINTEXT listener
    assert env["KAFKA_LISTENER_NAME_CONTROLLER_SSL_CLIENT_AUTH"] == "required"
    assert env["KAFKA_AUTHORIZER_CLASS_NAME"].endswith("StandardAuthorizer")
    assert env["KAFKA_ALLOW_EVERYONE_IF_NO_ACL_FOUND"] == "false"
    assert set(env["KAFKA_SUPER_USERS"].split(";")) == {"User:admin", "User:CN=stepguard-broker"}
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"


def test_alert_episodes_reach_the_alertmanager_container_through_the_bridge(compose):
    services = compose["services"]
    am = services["alertmanager"]
    assert "--cluster.listen-address=" in am["command"] and "healthcheck" in am
    assert "./deploy/alertmanager.yml:/etc/alertmanager/alertmanager.yml:ro" in am["volumes"]
    assert (ROOT / "deploy" / "alertmanager.yml").is_file()
    bridge = services["alertmanager-bridge"]
    assert bridge["command"] == ["alertmanager"]
    assert bridge["environment"]["STEPGUARD_ALERTMANAGER_URL"] == "http://alertmanager:9093"
    assert bridge["depends_on"]["alertmanager"]["condition"] == "service_healthy"
