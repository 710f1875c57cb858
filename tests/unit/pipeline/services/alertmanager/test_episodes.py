"""The Alertmanager bridge's pure part (alert -> PostableAlert, the episode table, the
re-send cadence) and its HTTP client against a local server (no Alertmanager)."""

from __future__ import annotations

import json
import logging
import threading
from datetime import datetime, timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from pipeline.io.errors import ConfigError
from pipeline.io.settings import load_settings
from pipeline.services.alertmanager.client import AlertmanagerClient, AlertmanagerUnavailable
from pipeline.services.alertmanager.episodes import (
    BridgeParams,
    EpisodeTable,
    alertname,
    labels_of,
    postable,
)
from schemas import Alert, AlertKind, AlertState, Evidence, Grade, RecommendedAction
from tests.clock import day_start

T0 = day_start(hour=12)
P = BridgeParams(cluster="c1", runbook_url="https://runbooks.example/sg/", resend_s=60,
                 resolve_timeout_s=300, episode_ttl_s=3600, max_episodes=3)  # fmt: skip


def s(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def alert(fp: str = "fp-node3-0001", seq: int = 0, **kw) -> Alert:
    fields = dict(
        fingerprint=fp, seq=seq, kind=AlertKind.STRAGGLER, grade=Grade.WARNING,
        state=AlertState.FIRING, job_id="job-1", node="node-3", rank=27, step=104,
        started_at=T0, ts=T0,
        evidence=Evidence(metric="compute_s", value=0.46, peer_median=0.38, baseline=0.38,
                          deviation=9.3, detail="high compute, low comm wait"),
        recommended_action=RecommendedAction.REPLACE_AT_CHECKPOINT,
        summary="rank 27 on node-3 is 21% slower than its stage peers", incident="inc-42",
    )  # fmt: skip
    return Alert(**(fields | kw))


# -- one alert ---------------------------------------------------------------------------
def test_labels_name_the_kind_grade_job_node_rank_incident_and_cluster():
    assert labels_of(alert(), P) == {
        "alertname": "StepguardStraggler", "severity": "warning", "job": "job-1",
        "node": "node-3", "rank": "27", "incident": "inc-42", "episode": "fp-node3-0001",
        "cluster": "c1",
    }  # fmt: skip
    job_wide = labels_of(alert(node=None, rank=None, incident="", grade=Grade.CRITICAL), P)
    assert "node" not in job_wide and "rank" not in job_wide
    assert job_wide["incident"] == "fp-node3-0001" and job_wide["severity"] == "critical"
    assert labels_of(alert(rank=0), P)["rank"] == "0"  # rank 0 is a rank


def test_every_kind_has_its_own_alertname_and_a_hold_notice_its_own():
    names = {alertname(alert(kind=k)) for k in AlertKind}
    assert len(names) == len(AlertKind) and "StepguardDataStall" in names
    held = alert(fp="held-0123456789abcdef", kind=AlertKind.GUARDRAIL)
    assert alertname(held) == "StepguardActionHeld"
    assert alertname(alert(kind=AlertKind.GUARDRAIL)) == "StepguardGuardrail"


def test_annotations_and_times_of_a_firing_and_a_resolved_update():
    firing = postable(alert(ts=s(40)), P, now=s(50)).json()
    assert firing["annotations"]["summary"].startswith("rank 27 on node-3")
    desc = firing["annotations"]["description"]
    assert "compute_s = 0.46" in desc and "peer median 0.38" in desc
    assert "high compute, low comm wait" in desc and "replace_at_checkpoint" in desc
    assert firing["annotations"]["runbook_url"] == "https://runbooks.example/sg/straggler"
    assert firing["startsAt"] == T0.isoformat() and firing["endsAt"] == s(350).isoformat()
    ended = postable(alert(state=AlertState.RESOLVED, ts=s(90)), P, now=s(95)).json()
    assert ended["endsAt"] == s(90).isoformat()
    # never after now (a skewed clock), never before the start
    assert postable(alert(state=AlertState.RESOLVED, ts=s(90)), P, now=s(60)).ends_at == s(60)
    early = alert(state=AlertState.RESOLVED, started_at=s(10), ts=s(10))
    assert postable(early, P, now=s(5)).ends_at == s(10)
    bare = BridgeParams()
    assert "runbook_url" not in postable(alert(), bare, now=T0).annotations
    assert postable(alert(summary=""), bare, now=T0).annotations["summary"] == (
        "straggler warning on node node-3"
    )


# -- the table ---------------------------------------------------------------------------
def test_a_firing_episode_is_sent_at_once_then_again_at_the_cadence_and_ended_at_resolved():
    t = EpisodeTable(P)
    [first] = t.observe(alert(), s(0), s(0))
    assert first.ends_at == s(300)
    assert t.due(s(59)) == []
    [again] = t.due(s(60))
    assert again.labels == first.labels and again.ends_at == s(360)  # kept firing
    assert t.due(s(61)) == []
    [end] = t.observe(alert(seq=1, state=AlertState.RESOLVED, ts=s(70)), s(71), s(71))
    assert end.labels == first.labels and end.ends_at == s(70)
    assert len(t) == 0 and t.due(s(500)) == []


def test_replays_and_older_updates_send_nothing():
    t = EpisodeTable(P)
    t.observe(alert(seq=1), s(0), s(0))
    assert t.observe(alert(seq=1), s(1), s(1)) == []
    assert t.observe(alert(seq=0), s(1), s(1)) == []
    assert t.duplicates == 2


def test_an_escalation_ends_the_old_severity_and_sends_the_new_one():
    t = EpisodeTable(P)
    t.observe(alert(), s(0), s(0))
    old, new = t.observe(alert(seq=1, grade=Grade.CRITICAL, ts=s(20)), s(20), s(20))
    assert old.labels["severity"] == "warning" and old.ends_at == s(20)
    assert new.labels["severity"] == "critical" and new.ends_at == s(320)
    [again] = t.due(s(80))  # the old label set is ended once, not again
    assert again.labels["severity"] == "critical"
    # RESOLVED carries the grade that fired: one alert ended
    [end] = t.observe(alert(seq=2, grade=Grade.CRITICAL, state=AlertState.RESOLVED), s(90),
                      s(90))  # fmt: skip
    assert end.labels["severity"] == "critical"


def test_the_start_up_read_back_sends_nothing_and_the_first_due_sends_what_still_fires():
    t = EpisodeTable(P)
    assert t.observe(alert(fp="fp-a-00001"), s(0), s(100), replay=True) == []
    assert t.observe(alert(fp="fp-b-00001"), s(0), s(100), replay=True) == []
    assert t.observe(alert(fp="fp-b-00001", seq=1, state=AlertState.RESOLVED), s(5), s(100),
                     replay=True) == []  # fmt: skip
    [resent] = t.due(s(100))
    assert resent.labels["episode"] == "fp-a-00001" and resent.ends_at == s(400)
    # the live read of a record already read back: nothing more
    assert t.observe(alert(fp="fp-a-00001"), s(0), s(101)) == []


def test_a_resolved_update_of_an_unknown_episode_is_still_sent():
    [end] = EpisodeTable(P).observe(alert(seq=3, state=AlertState.RESOLVED, ts=s(9)), s(9), s(9))
    assert end.ends_at == s(9)


def test_the_table_is_bounded_by_its_cap_and_forgets_silent_episodes():
    t = EpisodeTable(P)
    for i in range(5):
        t.observe(alert(fp=f"fp-{i}-000001"), s(i), s(i))
    assert len(t) == 3 and t.evicted == 2
    assert sorted(t.firing()) == ["fp-2-000001", "fp-3-000001", "fp-4-000001"]
    t.observe(alert(fp="fp-4-000001", seq=1), s(3000), s(3000))  # an update: kept
    assert [p.labels["episode"] for p in t.due(s(3603))] == ["fp-4-000001"]
    assert t.expired == 2 and list(t.firing()) == ["fp-4-000001"]


def test_params_refuse_a_cadence_that_lets_alertmanager_end_a_firing_alert():
    with pytest.raises(ValueError, match="shorter"):
        BridgeParams(resend_s=300, resolve_timeout_s=300)
    with pytest.raises(ConfigError, match="ALERTMANAGER_RESEND_S"):
        load_settings({"STEPGUARD_ALERTMANAGER_RESEND_S": "600"})
    with pytest.raises(ConfigError, match="ALERTMANAGER_URL"):
        load_settings({"STEPGUARD_ALERTMANAGER_URL": "ftp://am:9093"})
    st = load_settings(
        {"STEPGUARD_ALERTMANAGER_URL": "http://am:9093/", "STEPGUARD_ALERTMANAGER_CLUSTER": "eu"}
    )
    assert st.alertmanager == "http://am:9093"
    assert BridgeParams.from_settings(st).cluster == "eu"


# -- the client --------------------------------------------------------------------------
@pytest.fixture
def am():
    """A local HTTP server standing in for Alertmanager: ``answers`` (status, body) in
    order, then 200."""
    state: dict = {"bodies": [], "answers": [], "paths": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):
            body = self.rfile.read(int(self.headers["Content-Length"]))
            state["bodies"].append(json.loads(body))
            state["paths"].append(self.path)
            code, text = state["answers"].pop(0) if state["answers"] else (200, b"")
            self.send_response(code)
            self.send_header("Content-Length", str(len(text)))
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    state["url"] = f"http://127.0.0.1:{server.server_address[1]}"
    yield state
    server.shutdown()
    server.server_close()


def test_the_client_posts_a_postable_alerts_array_in_batches(am):
    client = AlertmanagerClient(am["url"] + "/", retries=0, batch=2)
    alerts = [postable(alert(fp=f"fp-{i}-000001"), P, now=T0) for i in range(3)]
    out = client.post(alerts)
    assert (out.sent, out.rejected) == (3, 0)
    assert am["paths"] == ["/api/v2/alerts"] * 2
    first = am["bodies"][0]
    assert isinstance(first, list) and len(first) == 2
    assert set(first[0]) == {"labels", "annotations", "startsAt", "endsAt"}


def test_a_refusal_is_not_retried_and_its_body_is_logged(am, caplog):
    sleeps: list[float] = []
    client = AlertmanagerClient(am["url"], retries=3, sleep=sleeps.append)
    reason = b'{"code":400,"message":"start time must be before end time"}'
    am["answers"].append((400, reason))
    with caplog.at_level(logging.ERROR):
        out = client.post([postable(alert(), P, now=T0)])
    assert (out.sent, out.rejected) == (0, 1) and sleeps == []
    assert "start time must be before end time" in out.error and "HTTP 400" in out.error
    assert "start time must be before end time" in caplog.text


def test_server_errors_are_retried_with_backoff_then_raise(am):
    sleeps: list[float] = []
    client = AlertmanagerClient(am["url"], retries=3, backoff_s=0.5, sleep=sleeps.append)
    am["answers"] += [(503, b"busy"), (429, b"slow down")]
    assert client.post([postable(alert(), P, now=T0)]).sent == 1
    assert sleeps == [0.5, 1.0] and len(am["bodies"]) == 3
    am["answers"] += [(500, b"")] * 4
    with pytest.raises(AlertmanagerUnavailable, match="HTTP 500"):
        client.post([postable(alert(), P, now=T0)])
    with pytest.raises(AlertmanagerUnavailable):
        AlertmanagerClient("http://127.0.0.1:9", retries=0, timeout_s=1).post(
            [postable(alert(), P, now=T0)]
        )
    with pytest.raises(ValueError, match="http"):
        AlertmanagerClient("file:///etc/passwd")
