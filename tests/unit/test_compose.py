"""docker-compose.yml is validated statically (no Docker engine runs here): against the
Compose Specification's JSON Schema (vendored by check-jsonschema), and every stepguard
service's command must exist in the CLI."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from pipeline.cli import app

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
