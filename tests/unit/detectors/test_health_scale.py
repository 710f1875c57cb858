"""Health in O(1) per report (issue 40, item 4).

A health report updates its own node's presence and signals; the job-wide clock check
(hang, :class:`~detectors.hang.presence.HealthPresence` over every node, the grader's
sweep) runs once for the reports a call releases, not once per report. Before, an
8,192-node job ran 8,192 sweeps over 8,192 nodes per health round.

The alerts must not change: each scenario of the simulator's health faults is scored by
the core and by :class:`PerReportClock`, the path before the change kept as a slow
reference (every report released by a tick or by an overflow of the hold checks the
clock at once, as ``JobDetection._health`` did), and both say the same.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from detectors.job import JobDetection
from pipeline.tools.simulator import Scenario, simulate
from pipeline.tools.simulator.catalog import find_scenario, resize_scenario
from schemas import Alert, NodeHealth


class PerReportClock(JobDetection):
    """The reference: the clock checked after every report a tick releases."""

    def _health(self, hts: float, msg: NodeHealth, *, tick: bool) -> list[Alert]:
        return super()._health(hts, msg, tick=tick) + self._check_clock()


def _play(det: JobDetection, sc: Scenario) -> list[Alert]:
    alerts: list[Alert] = []
    for ev in simulate(sc):
        for h in ev.health:
            alerts += det.on_health(h)
        if ev.frame is not None:
            for msg in ev.frame.to_messages():
                alerts += det.on_step(msg).alerts
        alerts += det.tick(ev.ts)
    return alerts + det.flush()


def _said(alerts: list[Alert]) -> list[tuple[object, ...]]:
    return [(a.kind.value, a.grade.value, a.state.value, a.node, a.rank, a.step) for a in alerts]


#: (suite scenario, the alert it must raise: kind, node or None), played on 16 nodes and
#: 150 steps (:func:`~pipeline.tools.simulator.catalog.resize_scenario` keeps the faults)
HEALTH_SCENARIOS = [
    ("drain_xid_128n_pp4", ("hardware", "node-0008")),  # XIDs (fatal rules)
    ("ecc_storm_128n", ("hardware", "node-0008")),  # ECC storm, then the crash
    ("thermal_rank_64n", ("thermal", "node-0003")),
    ("nic_flap_64n", ("network", "node-0010")),  # NIC error and retransmit counters
    ("crash_64n", ("missing", "node-0005")),  # a node's health stops
    ("crash_health_clock_128n", ("missing", "node-0002")),  # own clocks, a path stall
]
NODES, STEPS = 16, 150


@pytest.fixture(scope="module")
def start() -> datetime:
    return datetime.now(UTC).replace(microsecond=0) - timedelta(days=1)


@pytest.mark.parametrize("name,expect", HEALTH_SCENARIOS)
def test_alerts_are_those_of_the_per_report_clock(name, expect, start):
    sc = resize_scenario(find_scenario(name), NODES, STEPS)
    sc = sc.model_copy(update={"start_time": start})
    new = _play(JobDetection(sc.job), sc)
    ref = _play(PerReportClock(sc.job), sc)
    assert _said(new) == _said(ref)
    fired = {(a.kind.value, a.node) for a in new if a.state.value == "firing"}
    assert expect in fired, sorted(map(str, fired))


def test_an_overflowing_round_at_one_time_says_what_the_reference_says(start):
    """Held reports beyond ``max_held_health`` (an 8k-node job's every round with the
    default hold of 4,096): processed at once, their clock check deferred."""
    sc = resize_scenario(find_scenario("crash_64n"), NODES, STEPS)
    sc = sc.model_copy(update={"start_time": start})
    new = _play(JobDetection(sc.job, max_held_health=4), sc)
    ref = _play(PerReportClock(sc.job, max_held_health=4), sc)
    assert {(k, g, s, n) for k, g, s, n, *_ in _said(new) if k != "hang"} == {
        (k, g, s, n) for k, g, s, n, *_ in _said(ref) if k != "hang"
    }
    assert ("missing", "node-0005") in {(a.kind.value, a.node) for a in new}


class _Counting:
    """Counts the suite's clock checks (``DetectorSuite.tick``)."""

    def __init__(self, det: JobDetection) -> None:
        self.calls = 0
        suite = det.suite
        inner = suite.tick

        def tick(now: float) -> list[Alert]:
            self.calls += 1
            return inner(now)

        suite.tick = tick  # type: ignore[method-assign]


def _warm(nodes: int, hold: int, cls: type[JobDetection] = JobDetection):
    """A job's steps up to its last, whose health round (every node, dated at that
    step's end) is returned with it: ahead of the job's frames."""
    job = {"name": "round", "nodes": nodes, "gpus_per_node": 1, "tp": 1, "steps": 8,
           "seed": 3, "health_interval_steps": 4}  # fmt: skip
    sc = Scenario.model_validate(job)
    det = cls(sc.job, max_held_health=hold)
    events = list(simulate(sc))
    for ev in events[:-1]:
        if ev.frame is not None:
            det.on_frame(ev.frame)
    last = events[-1]
    assert len(last.health) == nodes and det.now is not None
    assert min(h.ts.timestamp() for h in last.health) > det.now
    return det, last


@pytest.mark.parametrize("cls,checks", [(JobDetection, 1), (PerReportClock, 48 + 1)])
def test_a_round_released_by_a_tick_checks_the_clock_once(cls, checks):
    det, ev = _warm(48, hold=4096, cls=cls)
    count = _Counting(det)
    for h in ev.health:
        assert det.on_health(h) == []
    assert count.calls == 0 and det.held_health == 48
    det.tick(max(h.ts.timestamp() for h in ev.health) + 0.5)  # the job is stalled
    assert det.held_health == 0
    assert count.calls == checks


@pytest.mark.parametrize("cls,checks", [(JobDetection, 0), (PerReportClock, 40)])
def test_an_overflow_of_the_hold_defers_its_clock_check_to_the_next_call(cls, checks):
    det, ev = _warm(48, hold=8, cls=cls)
    count = _Counting(det)
    for h in ev.health:
        det.on_health(h)  # 40 of them processed at once, beyond the hold
    assert count.calls == checks and det.held_health == 8
    assert det.now >= min(h.ts.timestamp() for h in ev.health)  # they moved the clock
    assert ev.frame is not None
    det.on_frame(ev.frame)  # the step they were ahead of: the owed check, then its own
    assert det.held_health == 0
    assert count.calls == checks + (2 if cls is JobDetection else 1)


def test_a_state_from_before_owes_no_clock_check():
    det, ev = _warm(8, hold=4096)
    del det.__dict__["_clock_due"]  # written before the field existed
    for h in ev.health:
        det.on_health(h)
    det.tick(ev.ts + 0.5)
    assert det.held_health == 0
