"""A real Prometheus (Debian's 2.42) with stepguard's shipped rules.

- ``stepguard up --prometheus`` on the embedded default: Prometheus scrapes every
  service, loads the rules, and StepguardServiceDown fires for the executor once its
  process is killed and stays dead (``up`` itself is held with SIGSTOP so that it cannot
  restart it; SIGCONT lets it, and the alert ends). Every wait is a bounded poll of
  Prometheus's API.
- ``scripts/prometheus.sh start|stop`` with static targets: a service's endpoint is
  scraped under its job name, the recording rules evaluate, stop leaves nothing.

Without a ``prometheus`` binary these skip (fail under ``CI=true``). Ports: free ones,
or ``STEPGUARD_TEST_UP_BASE_PORT`` / ``STEPGUARD_TEST_PROMETHEUS_PORT``.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from pipeline.io.embedded import free_port
from pipeline.io.metrics import serve_metrics
from pipeline.io.settings import load_settings
from pipeline.services.worker.metrics import WorkerMetrics
from tests.conftest import _missing

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
STEPGUARD = str(Path(sys.executable).parent / "stepguard")


@pytest.fixture(scope="module", autouse=True)
def prometheus_binary() -> None:
    if shutil.which("prometheus") is None:
        _missing("no `prometheus` on PATH (scripts/prometheus.sh install)")


def api(url: str, path: str, **params: str) -> Any:
    query = f"?{urllib.parse.urlencode(params)}" if params else ""
    with urllib.request.urlopen(f"{url}/api/v1/{path}{query}", timeout=5) as resp:
        doc = json.loads(resp.read())
    assert doc["status"] == "success", doc
    return doc["data"]


def poll(
    check: Callable[[], Any], timeout: float, what: str, tail: Callable[[], str],
    proc: subprocess.Popen[bytes] | None = None,
) -> Any:  # fmt: skip
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline and (proc is None or proc.poll() is None):
        with contextlib.suppress(OSError, ValueError):
            last = check()
            if last:
                return last
        time.sleep(0.5)  # polling the API, bounded
    pytest.fail(f"timed out after {timeout:.0f}s waiting for {what}; last: {last}\n{tail()}")


class Up:
    def __init__(self, tmp: Path) -> None:
        self.state = tmp / ".stepguard"
        self.out = tmp / "up.out"
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEPGUARD_")}
        env |= {
            # relative, as by default: Prometheus resolved the targets file from the
            # config's folder and scraped nothing (issue 41 item 6)
            "STEPGUARD_STATE_DIR": ".stepguard",
            "STEPGUARD_TOPIC_PREFIX": f"t{uuid.uuid4().hex[:10]}.",
            "STEPGUARD_CONSUMER_GROUP": f"g{uuid.uuid4().hex[:10]}",
        }
        argv = [STEPGUARD, "up", "--workers", "1", "--prometheus"]
        if base := os.environ.get("STEPGUARD_TEST_UP_BASE_PORT"):
            argv += ["--base-port", base]
        with self.out.open("wb") as out:
            self.proc = subprocess.Popen(argv, cwd=tmp, env=env, stdout=out, stderr=out)
        self.pids: set[int] = set()

    def status(self) -> dict[str, Any]:
        try:
            doc = json.loads((self.state / "up.json").read_text())
        except (OSError, ValueError):
            return {}
        self.pids |= {s["pid"] for s in doc["services"].values() if s["pid"]}
        return doc

    def prometheus_url(self) -> str | None:
        with contextlib.suppress(OSError):
            for line in (self.state / "up.env").read_text().splitlines():
                if line.startswith("PROMETHEUS_URL="):
                    return line.partition("=")[2]
        return None

    def tail(self) -> str:
        logs = ""
        for log in sorted((self.state / "logs").glob("*.log")):
            logs += f"\n== {log.name}\n{log.read_text(errors='replace')[-1200:]}"
        return self.out.read_text(errors="replace")[-3000:] + logs

    def close(self) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self.status()
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(running(p) for p in self.pids) and time.monotonic() < deadline:
            time.sleep(0.1)  # their ports free before the next test


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    u = Up(tmp_path)
    yield u
    u.close()


def running(pid: int) -> bool:
    """Alive and not a zombie (a child reparented to a reaper that has not reaped it
    yet still answers kill 0)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def active_alerts(url: str) -> set[str]:
    """Names of the alerts pending or firing now."""
    return {a["labels"]["alertname"] for a in api(url, "alerts")["alerts"]}


def fetch(url: str) -> int:
    """HTTP status of a GET (a probe)."""
    import urllib.error

    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def service_down(url: str) -> dict[str, str]:
    """Labels of each StepguardServiceDown alert, by job, with its state."""
    alerts = api(url, "alerts")["alerts"]
    return {
        a["labels"]["job"]: a["state"]
        for a in alerts
        if a["labels"].get("alertname") == "StepguardServiceDown"
    }


def test_prometheus_scrapes_up_and_service_down_fires_when_a_service_is_killed(up):
    url = poll(up.prometheus_url, 60, "up.env with PROMETHEUS_URL", up.tail, up.proc)
    kinds = {"stepguard-worker", "stepguard-actuator", "stepguard-executor", "stepguard-archiver"}

    def all_up() -> bool:
        targets = api(url, "targets")["activeTargets"]
        healthy = {t["labels"]["job"] for t in targets if t["health"] == "up"}
        return kinds <= healthy

    poll(all_up, 180, f"every service scraped and up: {sorted(kinds)}", up.tail, up.proc)
    groups = api(url, "rules")["groups"]
    rules = {r["name"]: r for g in groups for r in g["rules"]}
    assert "StepguardServiceDown" in rules and "stepguard:consumer_lag:sum" in rules
    assert all(r["health"] == "ok" for r in rules.values()), rules
    # targets down while they started leave pending alerts until the next evaluation
    poll(lambda: not service_down(url), 30, "no service reported down", up.tail)
    # the worker is up, so "no worker up" is silent (it fired while nothing was scraped)
    poll(lambda: "StepguardNoWorkerUp" not in active_alerts(url), 30,
         "StepguardNoWorkerUp silent while the worker runs", up.tail)  # fmt: skip
    # every service answers its probes on its metrics port
    for target in api(url, "targets")["activeTargets"]:
        base = target["scrapeUrl"].removesuffix("/metrics")
        assert fetch(f"{base}/healthz") == 200, target["labels"]
        assert poll(lambda b=base: fetch(f"{b}/readyz") == 200, 60,
                    f"{target['labels']['service']} ready", up.tail)  # fmt: skip
    # the documented families are really there, under the rules' job names
    names = set(api(url, "label/__name__/values"))
    assert {
        "stepguard_worker_steps_total", "stepguard_actuator_oldest_held_seconds",
        "stepguard_executor_consumed_total", "stepguard_archiver_messages_total",
        "process_start_time_seconds",
    } <= names  # fmt: skip

    executor = up.status()["services"]["executor-dry-run"]["pid"]
    os.kill(up.proc.pid, signal.SIGSTOP)  # its supervisor cannot bring it back
    try:
        os.kill(executor, signal.SIGKILL)
        fired = poll(
            lambda: service_down(url).get("stepguard-executor") == "firing",
            150, "StepguardServiceDown firing for stepguard-executor", up.tail,
        )  # fmt: skip
        assert fired
        assert set(service_down(url)) == {"stepguard-executor"}  # nothing else reported
    finally:
        os.kill(up.proc.pid, signal.SIGCONT)
    poll(lambda: "stepguard-executor" not in service_down(url), 90,
         "the alert to end once up restarted the executor", up.tail)  # fmt: skip

    pids = set(up.pids)
    up.proc.send_signal(signal.SIGINT)
    assert up.proc.wait(60) == 0, up.tail()
    final = up.status()
    assert final["services"]["prometheus"]["state"] == "stopped", final
    assert all(s["pid"] is None for s in final["services"].values()), final
    assert not [pid for pid in pids if running(pid)]


def test_the_script_scrapes_static_targets_evaluates_the_rules_and_stops(tmp_path):
    metrics = WorkerMetrics()
    metrics.lag.labels("stepguard.steps", "0").set(42)
    port = free_port()
    server = serve_metrics(
        metrics.registry, load_settings({}, worker_metrics_port=port), "worker_metrics_port"
    )
    assert server is not None
    state = tmp_path / "prometheus"
    prom_port = os.environ.get("STEPGUARD_TEST_PROMETHEUS_PORT") or str(free_port())
    env = os.environ | {
        "PROMETHEUS_STATE_DIR": str(state),
        "PROMETHEUS_PORT": prom_port,
        "PROMETHEUS_SCRAPE_INTERVAL": "1s",
        "PROMETHEUS_TARGETS": f"stepguard-worker=127.0.0.1:{port}",
    }
    script = [str(ROOT / "scripts" / "prometheus.sh")]

    def tail() -> str:
        log = state / "prometheus.log"
        return log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"

    try:
        done = subprocess.run([*script, "start"], env=env, capture_output=True, text=True,
                              timeout=120, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"PROMETHEUS_URL=http://127.0.0.1:{prom_port}"
        url = done.stdout.strip().partition("=")[2]
        pid = int((state / "prometheus.pid").read_text())

        def recorded() -> list[Any]:
            result = api(url, "query", query="stepguard:consumer_lag:sum")["result"]
            return [r for r in result if r["metric"].get("job") == "stepguard-worker"]

        got = poll(recorded, 60, "the recording rule over the scraped lag", tail)
        assert got[0]["metric"]["topic"] == "stepguard.steps" and got[0]["value"][1] == "42"
        status = subprocess.run([*script, "status"], env=env, capture_output=True, text=True,
                                timeout=30, check=False)  # fmt: skip
        assert status.returncode == 0 and status.stdout.strip() == done.stdout.strip()
    finally:
        stop = subprocess.run([*script, "stop"], env=env, capture_output=True, text=True,
                              timeout=60, check=False)  # fmt: skip
        server.shutdown()
        server.server_close()
    assert stop.returncode == 0, stop.stderr
    assert not state.exists()
    assert not running(pid)
