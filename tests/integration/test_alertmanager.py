"""Issue 24 item 2: alert episodes reach a real Alertmanager (Debian's
prometheus-alertmanager 0.25, started by ``scripts/alertmanager.sh``) through
``stepguard alertmanager``'s bridge, with the broker the other tests use.

A signed alert on the decisions topic shows in ``GET /api/v2/alerts`` with its labels
and reaches a webhook receiver through Alertmanager's route; a silence mutes an episode
(shown silenced, nothing received for it); RESOLVED ends one (gone from the active
alerts, a ``resolved`` notification received); a hold notice of the actuator is an
alert of its own; a forged alert is a dead letter and nothing of it reaches
Alertmanager. Every wait polls a condition with a deadline.

Under ``CI=true`` a missing ``prometheus-alertmanager`` fails; elsewhere it skips.
``STEPGUARD_TEST_ALERTMANAGER_PORT`` fixes its port (the receiver takes the next one).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from pipeline.io.embedded import free_port
from pipeline.io.kafka import control_producer, create_topics, publish, read_back, registry_of
from pipeline.io.trust import SigningKey, sign
from pipeline.policy import Policy, PolicyParams
from pipeline.services.alertmanager.service import AlertmanagerBridge
from schemas import (
    ActuatorMode,
    Alert,
    AlertKind,
    AlertState,
    DeadLetter,
    Evidence,
    Grade,
    RecommendedAction,
)
from tests.conftest import IN_CI
from tests.factories import ACTUATOR_KEY, WORKER_KEY, key_settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
BINARY = os.environ.get("ALERTMANAGER_BIN", "prometheus-alertmanager")


class Receiver:
    """A webhook receiver: every notification Alertmanager posts, kept in order."""

    def __init__(self, port: int) -> None:
        self.bodies: list[dict[str, Any]] = []
        lock = self.lock = threading.Lock()
        bodies = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                with lock:
                    bodies.append(json.loads(raw))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def alerts(self, episode: str) -> list[dict[str, Any]]:
        """Every alert of ``episode`` received so far (one per notification)."""
        with self.lock:
            return [a for b in self.bodies for a in b["alerts"]
                    if a["labels"].get("episode") == episode]  # fmt: skip

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Alertmanager:
    def __init__(self, url: str, receiver: Receiver) -> None:
        self.url = url
        self.receiver = receiver

    def get(self, path: str, **query: str) -> Any:
        qs = urllib.parse.urlencode(query)
        with urllib.request.urlopen(f"{self.url}{path}?{qs}", timeout=5) as resp:
            return json.loads(resp.read())

    def alerts(self, cluster: str) -> list[dict[str, Any]]:
        return self.get("/api/v2/alerts", filter=f'cluster="{cluster}"')

    def silence(self, episode: str) -> str:
        now = datetime.now(UTC)
        body = {
            "matchers": [{"name": "episode", "value": episode, "isRegex": False,
                          "isEqual": True}],
            "startsAt": now.isoformat(), "endsAt": (now + timedelta(hours=1)).isoformat(),
            "createdBy": "test_alertmanager", "comment": "muted by the test",
        }  # fmt: skip
        req = urllib.request.Request(
            f"{self.url}/api/v2/silences", data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json"},
        )  # fmt: skip
        with urllib.request.urlopen(req, timeout=5) as resp:
            return str(json.loads(resp.read())["silenceID"])


@pytest.fixture(scope="module")
def alertmanager(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Alertmanager]:
    """A real Alertmanager routing every alert to a local receiver."""
    if shutil.which(BINARY) is None:
        what = f"{BINARY} is not installed (apt-get install prometheus-alertmanager)"
        if IN_CI:
            pytest.fail(f"CI=true but {what}; .ci/run must install it", pytrace=False)
        pytest.skip(what)
    fixed = os.environ.get("STEPGUARD_TEST_ALERTMANAGER_PORT")
    port = int(fixed) if fixed else free_port()
    receiver = Receiver(port + 1 if fixed else 0)
    state = tmp_path_factory.mktemp("alertmanager") / "am"
    env = os.environ | {
        "ALERTMANAGER_PORT": str(port), "ALERTMANAGER_STATE_DIR": str(state),
        "ALERTMANAGER_WEBHOOK_URL": receiver.url, "ALERTMANAGER_BIN": BINARY,
        "ALERTMANAGER_GROUP_WAIT": "1s", "ALERTMANAGER_GROUP_INTERVAL": "1s",
    }  # fmt: skip
    script = ["bash", str(ROOT / "scripts" / "alertmanager.sh")]
    started = subprocess.run([*script, "start"], env=env, capture_output=True, text=True,
                             timeout=60, check=False)  # fmt: skip
    try:
        assert started.returncode == 0, started.stderr
        url = started.stdout.strip().splitlines()[-1].partition("=")[2]
        assert url == f"http://127.0.0.1:{port}"
        yield Alertmanager(url, receiver)
    finally:
        subprocess.run([*script, "stop"], env=env, capture_output=True, timeout=60, check=False)
        receiver.close()


def wait_for(what: str, done: Callable[[], Any], poll: Callable[[], object],
             deadline_s: float = 60.0) -> Any:  # fmt: skip
    """Call ``poll`` until ``done()`` is truthy (returned) or the deadline passes."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        got = done()
        if got:
            return got
        poll()
    raise AssertionError(f"timed out after {deadline_s:.0f}s waiting for {what}")


def alert(
    fp: str,
    *,
    seq: int = 0,
    node: str = "node-0003",
    rank: int | None = 27,
    state: AlertState = AlertState.FIRING,
    key: SigningKey = WORKER_KEY,
) -> Alert:
    now = datetime.now(UTC)
    return sign(Alert(
        fingerprint=fp, seq=seq, kind=AlertKind.HARDWARE, grade=Grade.CRITICAL, state=state,
        job_id="job-am", node=node, rank=rank, step=100, started_at=now - timedelta(seconds=30),
        ts=now, evidence=Evidence(metric="ecc_uncorrected", value=1, deviation=1,
                                  detail="XID 79 on GPU 2"),
        recommended_action=RecommendedAction.ISOLATE, summary=f"uncorrectable ECC on {node}",
        incident=f"inc-{fp}",
    ), key)  # fmt: skip


def by_episode(alerts: list[dict[str, Any]], episode: str) -> dict[str, Any] | None:
    return next((a for a in alerts if a["labels"].get("episode") == episode), None)


def test_episodes_page_through_alertmanager_its_silences_apply_and_resolved_ends_them(
    settings, alertmanager
):
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    s = settings.model_copy(update=key_settings() | {
        "alertmanager_url": SecretStr(alertmanager.url), "alertmanager_cluster": cluster,
        "alertmanager_runbook_url": "https://runbooks.example/stepguard/",
        "alertmanager_resend_s": 1.0, "alertmanager_resolve_timeout_s": 60.0,
    })  # fmt: skip
    create_topics(s)
    producer = control_producer(s)
    registry = registry_of(s)

    def send(*msgs: Alert) -> None:
        for m in msgs:
            publish(producer, registry, "decisions", m).get(timeout=30)

    bridge = AlertmanagerBridge(s)
    receiver = alertmanager.receiver
    tick = lambda: bridge.poll_once(timeout_ms=200)  # noqa: E731
    try:
        # 1. a forged alert (a key no worker holds) is a dead letter; a signed one pages
        forged = alert("fp-forged-0001", key=SigningKey.generate("intruder"))
        paged = alert("fp-paged-00001")
        send(forged, paged)
        got = wait_for("the signed alert in GET /api/v2/alerts",
                       lambda: by_episode(alertmanager.alerts(cluster), "fp-paged-00001"),
                       tick)  # fmt: skip
        assert got["labels"] == {
            "alertname": "StepguardHardware", "severity": "critical", "job": "job-am",
            "node": "node-0003", "rank": "27", "incident": "inc-fp-paged-00001",
            "episode": "fp-paged-00001", "cluster": cluster,
        }  # fmt: skip
        assert got["annotations"]["summary"] == "uncorrectable ECC on node-0003"
        assert "XID 79 on GPU 2" in got["annotations"]["description"]
        assert got["annotations"]["runbook_url"] == "https://runbooks.example/stepguard/hardware"
        assert got["status"]["state"] == "active"
        assert datetime.fromisoformat(got["startsAt"]) == paged.started_at.replace(
            microsecond=paged.started_at.microsecond // 1000 * 1000
        )
        wait_for("the receiver to get the alert through the route",
                 lambda: receiver.alerts("fp-paged-00001"), tick)  # fmt: skip
        assert receiver.alerts("fp-paged-00001")[0]["status"] == "firing"
        letters = [r.message for r in read_back(s, "deadletter")]
        assert [(d.stage, "fp-forged-0001" in d.raw.decode()) for d in letters
                if isinstance(d, DeadLetter)] == [("signature", True)]  # fmt: skip
        assert by_episode(alertmanager.alerts(cluster), "fp-forged-0001") is None

        # 2. a silence mutes an episode: shown silenced, nothing received for it
        silence_id = alertmanager.silence("fp-muted-00001")
        send(alert("fp-muted-00001", node="node-0005", rank=None))
        muted = wait_for(
            "the muted alert shown suppressed",
            lambda: (
                (a := by_episode(alertmanager.alerts(cluster), "fp-muted-00001"))
                and a["status"]["state"] == "suppressed"
                and a
            ),
            tick,
        )
        assert muted["status"]["silencedBy"] == [silence_id] and "rank" not in muted["labels"]
        # a later alert that is not silenced is received: the muted one, earlier, never
        send(alert("fp-after-00001", node="node-0006"))
        wait_for("the unsilenced alert after it", lambda: receiver.alerts("fp-after-00001"),
                 tick)  # fmt: skip
        assert receiver.alerts("fp-muted-00001") == []

        # 3. a hold notice of the actuator (approve mode) is an alert of its own
        policy = Policy(PolicyParams(mode=ActuatorMode.APPROVE, spare_nodes=("spare-0",)))
        [notice] = policy.on_alert(alert("fp-held-00001", node="node-0007"),
                                   datetime.now(UTC)).alerts  # fmt: skip
        send(sign(notice, ACTUATOR_KEY))
        held = wait_for(
            "the hold notice",
            lambda: [a for a in alertmanager.alerts(cluster)
                     if a["labels"]["alertname"] == "StepguardActionHeld"],
            tick,
        )  # fmt: skip
        assert held[0]["labels"]["node"] == "node-0007"
        assert "stepguard approve act-" in held[0]["annotations"]["summary"]

        # 4. RESOLVED ends the paged episode: no longer active, a resolved notification
        send(alert("fp-paged-00001", seq=1, state=AlertState.RESOLVED))
        wait_for("the resolved notification",
                 lambda: [a for a in receiver.alerts("fp-paged-00001")
                          if a["status"] == "resolved"], tick)  # fmt: skip
        ended = [a for a in receiver.alerts("fp-paged-00001") if a["status"] == "resolved"]
        assert datetime.fromisoformat(ended[0]["endsAt"]) <= datetime.now(UTC)
        wait_for("the resolved alert to leave the active ones",
                 lambda: by_episode(alertmanager.alerts(cluster), "fp-paged-00001") is None,
                 tick)  # fmt: skip
        assert bridge.stats.dead_letters == 1 and bridge.stats.rejected == 0
        assert "fp-paged-00001" not in bridge.table.firing()
    finally:
        bridge.close()
        producer.close()


def test_the_shipped_alertmanager_config_is_valid():
    """deploy/alertmanager.yml (docker-compose's) passes Alertmanager's own check."""
    amtool = shutil.which("amtool")
    if amtool is None:
        if IN_CI:
            pytest.fail("CI=true but amtool (prometheus-alertmanager) is missing", pytrace=False)
        pytest.skip("amtool is not installed (apt-get install prometheus-alertmanager)")
    done = subprocess.run([amtool, "check-config", str(ROOT / "deploy" / "alertmanager.yml")],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_a_batch_alertmanager_refuses_is_logged_with_its_reason_and_not_retried(
    alertmanager, caplog
):
    """Alertmanager's own 400 (an alert that ends before it starts): the reason it
    gives is kept, nothing is retried, the next batch goes through."""
    from pipeline.services.alertmanager.client import AlertmanagerClient
    from pipeline.services.alertmanager.episodes import BridgeParams, postable

    sleeps: list[float] = []
    client = AlertmanagerClient(alertmanager.url, retries=3, sleep=sleeps.append)
    cluster = f"c-{uuid.uuid4().hex[:8]}"
    params = BridgeParams(cluster=cluster)
    now = datetime.now(UTC)
    good = postable(alert("fp-good-000001"), params, now=now)
    backwards = replace(good, starts_at=now, ends_at=now - timedelta(hours=1))
    with caplog.at_level("ERROR"):
        refused = client.post([backwards])
    assert (refused.sent, refused.rejected, sleeps) == (0, 1, [])
    assert refused.error == 'HTTP 400: "start time must be before end time"'
    assert "start time must be before end time" in caplog.text
    assert client.post([good]).sent == 1
    assert by_episode(alertmanager.alerts(cluster), "fp-good-000001") is not None
