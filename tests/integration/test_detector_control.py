"""``stepguard calibrate --apply`` -> a control message signed by the operator -> every
worker builds new jobs' detectors with it (pipeline/services/worker/control.py), on a real
broker and a real worker process; and the running detector settings calibration
compares against are the latest signed change archived (both archive backends)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from detectors.config import DetectorConfig
from pipeline.io.kafka import read_back
from pipeline.io.trust import public_keys, sign, signature_problem
from pipeline.services.archive import rows_for
from pipeline.tools.calibrate.command import publish_calibration, running_detector
from pipeline.tools.simulator import simulate
from pipeline.tools.simulator.player import play
from schemas import AlertKind, ControlMessage, Grade
from tests.factories import OPERATOR_KEY, key_settings
from tests.integration import test_worker
from tests.integration.test_worker import Worker, firing, scenario

# the worker tests' fixtures: a worker process per call, and the decisions topic
workers, decisions = test_worker.workers, test_worker.decisions

pytestmark = pytest.mark.integration

APPLIED = 'stepguard_worker_state_events{event="detector_settings_applied"}'
REFUSED = 'stepguard_worker_state_events{event="refused_detector_settings"}'


def _wait_metric(w: Worker, name: str, at_least: float, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while w.metric(name) < at_least and time.monotonic() < deadline:
        if w.proc.poll() is not None:
            break
        time.sleep(0.1)  # polling the worker's metrics endpoint, bounded
    assert w.metric(name) >= at_least, (name, w.tail())


def test_apply_publishes_the_detector_settings_signed_by_the_operator(settings):
    s = settings.model_copy(update=key_settings())
    change = publish_calibration(s, "calibrated", detector={"hang_factor": 8.0})
    (msg,) = [d.message for d in read_back(s, "control", stall_s=30)
              if getattr(d.message, "change_id", None) == change]  # fmt: skip
    assert msg.detector_settings == {"hang_factor": 8.0} and msg.scope == "detector"
    assert msg.warning_confirm_steps is None  # the actuator's settings untouched
    assert signature_problem(msg, public_keys(s, "operator")) is None


def test_a_running_worker_builds_a_new_jobs_detectors_with_the_applied_settings(
    settings, workers, decisions
):
    """The hang threshold is 2.5 median step times by default (a hang fires at a score
    of ~2.5-3.5 with 1 s steps and 0.5 s ticks); applied at 8, the new job's first hang
    fires only at a score of 8 or more. An unsigned change before it is refused."""
    sc = scenario("applied", [], base_compute_s=1.0, collective_s=0.01, steps=100)
    w = workers(operator_public_keys=OPERATOR_KEY.public_text())
    s = settings.model_copy(update=key_settings())
    forged = ControlMessage(change_id="forged-1", scope="detector", by="x",
                            ts=datetime.now(UTC) - timedelta(seconds=5),
                            detector_settings={"hang_factor": 1.5})  # fmt: skip
    from pipeline.io.kafka import control_producer, publish, registry_of

    producer = control_producer(s)
    publish(producer, registry_of(s), "control", forged).get(timeout=30)
    producer.close()
    publish_calibration(s, "calibrated", detector={"hang_factor": 8.0})
    _wait_metric(w, APPLIED, 1, 90)
    assert w.metric(REFUSED) == 1
    last_ts = max(e.ts for e in simulate(sc) if e.frame is not None and e.step == 60)
    play(settings, sc, speed=None, stop_after_step=60)
    items = decisions.wait(firing(AlertKind.HANG), 90, "the hang", w)
    hang = next(a for a in items if a.kind is AlertKind.HANG)
    assert hang.grade is Grade.CRITICAL
    assert hang.evidence.deviation >= 8.0, (hang.evidence, w.tail())
    assert hang.ts.timestamp() - last_ts >= 7.0  # event time, as the worker reads it


def test_running_detector_settings_are_the_latest_signed_change_archived(archive):
    base = DetectorConfig(hang_factor=3.0)
    assert running_detector(archive, base) is base
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1)  # c1..c4: in the past

    def change(cid: str, minutes: int, settings: dict, signed: bool = True) -> ControlMessage:
        m = ControlMessage(change_id=cid, scope="detector", by="sre", detector_settings=settings,
                           ts=t0 + timedelta(minutes=minutes))  # fmt: skip
        return sign(m, OPERATOR_KEY) if signed else m

    messages = [
        change("c1", 0, {"hang_factor": 4.0}),
        change("c2", 1, {"straggler_warning": 0.07}),
        sign(
            ControlMessage(
                change_id="a1", warning_confirm_steps=3, by="sre", ts=t0 + timedelta(minutes=2)
            ),
            OPERATOR_KEY,
        ),
        change("c3", 3, {"hang_factor": 1.5}, signed=False),  # a forgery: ignored
        change("c4", 4, {"no_such_setting": 1.0}),  # the workers refuse it: so here
    ]
    for table, cols in rows_for([(m, 0) for m in messages], list(range(5))).items():
        archive.insert(table, cols)
    got = running_detector(archive, base)
    assert got == DetectorConfig(straggler_warning=0.07)
