"""The suite drives every member through a protocol (:mod:`detectors.suite_members`),
and a worker's snapshot written before the members existed still resumes its job.

The snapshot ``data/suite_before_members.sgst`` was written by the release before
(main at 1bacfef) running this module's :func:`_write_before` after 30 steps of
:func:`_job`::

    cd <a checkout of 1bacfef> && PYTHONPATH=$PWD python -m tests.unit.detectors.test_suite_members
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from detectors.engine import DetectorSuite
from detectors.frame import StepFrame
from pipeline.io.statecodec import dumps, loads
from schemas import AlertKind, GpuHealth, Grade, NodeHealth

BEFORE = Path(__file__).parent / "data" / "suite_before_members.sgst"
SPLIT = 30  #: steps the snapshot had seen


def _job(steps: int) -> list[tuple[StepFrame, list[NodeHealth], float]]:
    """64 ranks on 8 nodes: rank 3 slows from step 26, node-6 stops reporting health
    after step 33, node-5 runs hot from step 40; a tick after every step."""
    rng = np.random.default_rng(7)
    ts, out = 1_800_000_000.0, []
    for step in range(steps):
        compute = 1.0 + 0.005 * rng.standard_normal(64)
        if step >= 26:
            compute[3] *= 1.25
        comm = compute.max() + 0.05 - compute
        ts += float(compute.max()) + 0.05
        frame = StepFrame.from_arrays("job", step, ts=ts, compute=compute, comm_wait=comm)
        health = []
        for node in range(8):
            if node == 6 and step > 33:
                continue
            temp = 96.0 if node == 5 and step >= 40 else 60.0 + float(rng.random())
            gpu = GpuHealth(index=0, temperature_c=temp, power_w=300, sm_clock_mhz=1980,
                            utilization_pct=90)  # fmt: skip
            at = datetime.fromtimestamp(ts, UTC)
            health.append(NodeHealth(job_id="job", node=f"node-{node}", ts=at, gpus=(gpu,),
                                     interval_s=1.0))  # fmt: skip
        out.append((frame, health, ts + 0.5))
    return out


def _run(suite: DetectorSuite, job: list[tuple[StepFrame, list[NodeHealth], float]]) -> list:
    alerts = []
    for frame, health, tick in job:
        alerts += suite.process_step(frame)
        for msg in health:
            alerts += suite.process_health(msg)
        alerts += suite.tick(tick)
    return [a.model_dump(mode="json") for a in alerts]


def _write_before() -> None:
    suite = DetectorSuite("job")
    _run(suite, _job(SPLIT))
    BEFORE.parent.mkdir(exist_ok=True)
    BEFORE.write_bytes(dumps(suite, level=9))


def test_every_member_is_driven_in_order():
    m = DetectorSuite("job").members
    assert [x.name for x in m.scorers] == ["missing", "nonfinite", "peer", "baselines"]
    assert [x.name for x in m.collectors] == ["replicas", "groups"]
    assert [x.name for x in m.clock] == ["hang", "silent_nodes"]
    assert [x.name for x in m.health] == ["presence", "hardware"]
    graded = {s for member in (*m.clock, *m.health) for s in member.signals}
    assert {"hang", "relaunch_stuck", "health_missing", "hw_fatal"} <= graded


def test_members_drive_the_family_objects_a_snapshot_names():
    suite = DetectorSuite("job")
    m = suite.members
    wrapped = [x.det for x in (*m.scorers, *m.collectors, *m.clock, *m.health) if hasattr(x, "det")]
    for family in (suite.missing, suite.peer, suite.baselines, suite.replicas, suite.groups,
                   suite.hang, suite.presence, suite.hardware):  # fmt: skip
        assert any(w is family for w in wrapped)
    back = loads(dumps(suite))
    assert back.members.clock[0].det is back.hang  # one object, not a copy


def test_a_state_written_before_the_members_resumes_its_job():
    """A worker upgraded under a running job reads the snapshot the release before
    wrote (no members in it) and goes on exactly as if it had never stopped."""
    blob = BEFORE.read_bytes()
    assert "members" not in vars(loads(blob))
    job = _job(70)
    whole = _run(DetectorSuite("job"), job)
    resumed = _run(loads(blob), job[SPLIT:])
    assert resumed == whole[len(whole) - len(resumed) :]
    assert whole[: len(whole) - len(resumed)] == _run(DetectorSuite("job"), job[:SPLIT])
    # every kind of member acted after the snapshot: steps, the clock, health reports
    seen = {(a["kind"], a["grade"], a["node"]) for a in resumed}
    assert (AlertKind.STRAGGLER, Grade.CRITICAL, "node-0") in seen  # it was WARNING before
    assert (AlertKind.MISSING, Grade.CRITICAL, "node-6") in seen  # its health stopped
    assert (AlertKind.THERMAL, Grade.CRITICAL, "node-5") in seen  # it ran hot


if __name__ == "__main__":
    _write_before()
    sys.exit(0)
