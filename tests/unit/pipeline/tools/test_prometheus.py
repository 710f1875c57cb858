"""The shipped Prometheus rules (pipeline/tools/prometheus/): promtool accepts them, their unit
tests pass (``promtool test rules``: input series, expected alerts), every metric they
name is one a service really exports, and the scrape configs load.

promtool comes with Debian's ``prometheus`` package (.ci/run installs it); without it
these tests skip, and under ``CI=true`` they fail.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric

from pipeline.io.metrics import ActuatorMetrics, ArchiverMetrics, ExecutorMetrics
from pipeline.services.worker.metrics import WorkerMetrics
from pipeline.services.worker.state import CoreTopics, WorkerDetection
from pipeline.tools.prometheus import (
    JOBS,
    RULES_TEST_FILE,
    file_sd,
    rules_path,
    scrape_config,
)
from tests.conftest import _missing


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        _missing("promtool is not installed (apt-get install prometheus)")
    assert found is not None
    return found


def run(argv: list[str], cwd: Path | None = None) -> str:
    done = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120,
                          check=False)  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    return out


def rules() -> list[dict]:
    doc = yaml.safe_load(rules_path().read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def test_promtool_accepts_the_rules(promtool):
    out = run([promtool, "check", "rules", str(rules_path())])
    assert f"SUCCESS: {len(rules())} rules found" in out


def test_the_rules_unit_tests_pass(promtool):
    """Each alert fires on the series it is about, after its ``for``, and not on the
    healthy ones (a finished job controller, a steady backlog, a worker restart)."""
    test_file = rules_path(RULES_TEST_FILE)
    out = run([promtool, "test", "rules", test_file.name], cwd=test_file.parent)
    assert "SUCCESS" in out


def test_every_alert_the_issue_asks_for_is_there_and_tested():
    alerts = {r["alert"] for r in rules() if "alert" in r}
    assert {
        "StepguardServiceDown", "StepguardConsumerLagGrowing", "StepguardDeadLettersArriving",
        "StepguardCircuitBreakerOpen", "StepguardActionHeldTooLong", "StepguardStepsUnscored",
        "StepguardServiceRestarting",
    } <= alerts  # fmt: skip
    tests = yaml.safe_load(rules_path(RULES_TEST_FILE).read_text())["tests"]
    tested = {t["alertname"] for group in tests for t in group.get("alert_rule_test", [])}
    firing = {
        t["alertname"] for group in tests for t in group.get("alert_rule_test", [])
        if t["exp_alerts"]
    }  # fmt: skip
    assert alerts == tested == firing  # each one seen firing and seen quiet
    for r in rules():
        if "alert" in r:
            assert r["labels"]["severity"] in ("critical", "warning"), r["alert"]
            assert r["annotations"]["summary"] and r["annotations"]["description"]


def _exported(metric: Metric) -> set[str]:
    suffixes = {
        "counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum"),
    }[metric.type]  # fmt: skip
    return {metric.name + s for s in suffixes}


def test_every_metric_the_rules_name_is_exported_by_a_service():
    """A renamed metric would silence its alert without a word: every
    ``stepguard_*`` name in the rules is one the services' registries define, and the
    ``event`` the job-refused alert selects is one the worker reports."""
    registries: list[CollectorRegistry] = [
        WorkerMetrics().registry, ActuatorMetrics().registry, ExecutorMetrics().registry,
        ArchiverMetrics().registry,
    ]  # fmt: skip
    exported = {name for reg in registries for m in reg.collect() for name in _exported(m)}
    named = {
        name for r in rules() for name in re.findall(r"\bstepguard_[a-z_]+\b", r["expr"])
    }  # fmt: skip
    assert named and named <= exported, named - exported
    for reg in registries:  # the restart alert counts new process start times
        assert reg.get_sample_value("process_start_time_seconds") is not None
    assert "refused_for_limit" in WorkerDetection(CoreTopics("s", "h", "j"), 1).counts()
    jobs = {j for r in rules() for j in re.findall(r"stepguard-[a-z-]+", r["expr"])}
    assert jobs <= set(JOBS.values()) | {"stepguard-"}, jobs


def test_the_scrape_configs_load(promtool, tmp_path):
    """The config ``stepguard up`` writes, and docker-compose's (its rule path made
    local), are valid Prometheus configuration."""
    targets = tmp_path / "targets.json"
    targets.write_text(json.dumps(file_sd({"worker-1": 9108, "actuator": 9109})))
    config = tmp_path / "prometheus.yml"
    config.write_text(scrape_config(targets, [rules_path()], alertmanagers=["127.0.0.1:9093"]))
    run([promtool, "check", "config", str(config)])
    compose = rules_path("compose.yml").read_text()
    assert "/etc/prometheus/stepguard.rules.yml" in compose
    local = tmp_path / "compose.yml"
    local.write_text(compose.replace("/etc/prometheus/stepguard.rules.yml", str(rules_path())))
    run([promtool, "check", "config", str(local)])
    jobs = {c["job_name"] for c in yaml.safe_load(compose)["scrape_configs"]}
    assert jobs == set(JOBS.values()) - {"stepguard-job-controller"}


def test_up_runs_prometheus_on_every_metrics_port_when_asked(promtool, tmp_path, monkeypatch):
    """``--prometheus``: one more supervised service whose targets are every metrics
    port of the plan, under the rules' job names; ``--durable`` implies it when the
    binary is there (a note when it is not); ``--no-prometheus`` leaves it out."""
    import pipeline.tools.prometheus as prom
    from pipeline.io.errors import ConfigError
    from pipeline.io.settings import load_settings
    from pipeline.tools.up import UpOptions, build_plan

    settings = load_settings({}, state_dir=tmp_path)

    def plan(**kw):
        options = UpOptions(workers=2, scenario="ci_smoke", **kw)
        return build_plan(settings, options, {"PATH": "/bin"}, python="py", run_id="r1",
                          bootstrap="127.0.0.1:9" if kw.get("durable") else None)  # fmt: skip

    p = plan(prometheus=True)
    spec = next(s for s in p.specs if s.name == "prometheus")
    port = int(next(a for a in spec.argv if a.startswith("--web.listen-address=")).split(":")[-1])
    assert p.shell_env["PROMETHEUS_URL"] == f"http://127.0.0.1:{port}"
    targets = json.loads((tmp_path / "prometheus" / "targets.json").read_text())
    want = {s.name: s.metrics_port for s in p.specs if s.metrics_port}
    got = {g["labels"]["service"]: int(g["targets"][0].rsplit(":", 1)[1]) for g in targets}
    assert got == want and len(want) == 6  # 2 workers, actuator, executor, archiver, simulate
    assert {g["labels"]["job"] for g in targets} == set(JOBS.values()) - {"stepguard-alertmanager"}
    run([promtool, "check", "config", str(tmp_path / "prometheus" / "prometheus.yml")])
    assert spec.stop_tier == 0 and spec.ready is not None

    assert "prometheus" not in {s.name for s in plan(prometheus=False, durable=True).specs}
    assert "prometheus" not in {s.name for s in plan().specs}  # embedded: only when asked
    assert "prometheus" in {s.name for s in plan(durable=True).specs}
    monkeypatch.setattr(prom, "find_prometheus", lambda: None)
    quiet = plan(durable=True)
    assert "prometheus" not in {s.name for s in quiet.specs}
    assert any("no `prometheus` on PATH" in n for n in quiet.notes)
    with pytest.raises(ConfigError, match="--prometheus needs"):
        plan(prometheus=True)


def test_compose_runs_prometheus_with_the_shipped_files_and_opens_the_endpoints():
    """docker-compose's Prometheus mounts the shipped scrape config and rules (paths
    that exist in the repository), and the stepguard services listen on 0.0.0.0 there:
    loopback inside a container would be unreachable."""
    root = Path(__file__).resolve().parents[4]
    compose = yaml.safe_load((root / "docker-compose.yml").read_text())
    prom = compose["services"]["prometheus"]
    mounts = {m.split(":")[1]: m.split(":")[0] for m in prom["volumes"] if m.startswith("./")}
    assert (root / mounts["/etc/prometheus/prometheus.yml"]).resolve() == rules_path("compose.yml")
    assert (root / mounts["/etc/prometheus/stepguard.rules.yml"]).resolve() == rules_path()
    assert all(p.startswith("127.0.0.1:") for p in prom["ports"])
    for name in ("worker", "actuator", "archiver"):
        env = compose["services"][name]["environment"]
        assert env["STEPGUARD_METRICS_BIND_ADDRESS"] == "0.0.0.0", name


def test_the_config_names_its_files_by_absolute_paths_from_a_relative_state_dir(
    tmp_path, monkeypatch
):
    """Issue 41 item 6: with the default relative state dir, prometheus.yml named
    `.stepguard/prometheus/targets.json`, which Prometheus resolves from the config's
    own folder: it scraped nothing and StepguardNoWorkerUp fired while workers ran."""
    from pipeline.tools.prometheus import prometheus_service

    monkeypatch.chdir(tmp_path)
    spec = prometheus_service("prometheus", Path(".stepguard/prometheus"), 9090, {"worker-1": 1})
    config_path = tmp_path / ".stepguard" / "prometheus" / "prometheus.yml"
    config = json.loads(config_path.read_text())
    [sd] = config["scrape_configs"][0]["file_sd_configs"][0]["files"]
    assert Path(sd) == tmp_path / ".stepguard" / "prometheus" / "targets.json"
    assert all(Path(r).is_absolute() for r in config["rule_files"])
    assert f"--config.file={config_path}" in spec.argv
