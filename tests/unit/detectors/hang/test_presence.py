"""Presence judged per node against its own health path (issue 23)."""

from detectors.hang.detector import HealthPresence
from detectors.job import JobDetection
from pipeline.tools.simulator import Scenario, simulate

IV = 10.0


def _fleet(p: HealthPresence, nodes: str, upto: float) -> None:
    for n in nodes:
        t = 0.0
        while t <= upto:
            p.learn(n, t, interval_s=IV)
            p.arrived(n, t, at=t + 0.5, interval_s=IV)
            t += IV


def test_a_backlog_half_delivered_is_not_silence_of_the_other_half():
    p = HealthPresence(factor=2.5)
    _fleet(p, "abcdef", 0.0)
    # the path stalls from t=0 to t=100; then a, b, c's backlogs arrive (late)
    for n in "abc":
        for t in range(10, 101, 10):
            p.arrived(n, float(t), at=101.0, interval_s=IV)
            p.learn(n, float(t), interval_s=IV)
    assert p.score(102.0) == {}  # d, e, f are still in the backlog


def test_a_dead_node_is_still_named_once_the_backlog_is_through():
    p = HealthPresence(factor=2.5)
    _fleet(p, "abcd", 0.0)
    for n in "abc":  # d died at t=0; the others' backlog arrives at 100
        for t in range(10, 101, 10):
            p.arrived(n, float(t), at=100.0, interval_s=IV)
            p.learn(n, float(t), interval_s=IV)
    for n in "abc":
        for t in range(110, 151, 10):
            p.arrived(n, float(t), at=t + 0.5, interval_s=IV)
            p.learn(n, float(t), interval_s=IV)
    assert set(p.score(150.0)) == {"d"}


def test_a_node_whose_reports_keep_arriving_late_is_not_missing():
    p = HealthPresence(factor=2.5)
    _fleet(p, "abc", 100.0)
    # c's own link lags 40 s, but its reports keep coming
    for t in range(110, 201, 10):
        for n in "ab":
            p.arrived(n, float(t), at=t + 0.5, interval_s=IV)
            p.learn(n, float(t), interval_s=IV)
        p.arrived("c", float(t - 40), at=float(t), interval_s=IV)
        p.learn("c", float(t - 40), interval_s=IV)
    assert p.score(200.5) == {}


def test_one_late_node_does_not_excuse_a_silent_one():
    p = HealthPresence(factor=2.5)
    _fleet(p, "abcd", 0.0)
    for t in range(10, 101, 10):  # d is dead; only c's link lags
        for n in "ab":
            p.arrived(n, float(t), at=t + 0.5, interval_s=IV)
            p.learn(n, float(t), interval_s=IV)
        p.arrived("c", float(t - 30), at=float(t), interval_s=IV)
        p.learn("c", float(t - 30), interval_s=IV)
    assert set(p.score(100.5)) == {"d"}


def test_forget_drops_every_trace_of_a_node():
    p = HealthPresence()
    _fleet(p, "ab", 30.0)
    p.arrived("b", 0.0, at=30.0, interval_s=IV)
    p.forget("b")
    assert set(p.nodes()) == {"a"} and "b" not in p._arrived and "b" not in p._late


def test_unknown_nodes_are_not_tracked():
    p = HealthPresence()
    p.arrived("stranger", 0.0, at=100.0, interval_s=IV)
    assert p._arrived == {} and p._late == {}


def test_health_held_behind_a_hang_drains_without_missing_alerts():
    """The issue's case: a long checkpoint, a real hang, health held on its path for
    the stall and drained node by node afterwards: the hang only."""
    sc = Scenario.model_validate(
        {
            "name": "burst", "nodes": 32, "steps": 140, "seed": 7,
            "checkpoint_every": 60, "checkpoint_s": 60.0,
            "health_interval_s": IV, "health_delay_s": 0.5,
            "faults": [
                {"kind": "hang", "onset_step": 60, "duration_steps": 30},
                {"kind": "health_delay", "variant": "stall", "magnitude": 1.0},
            ],
        }
    )  # fmt: skip
    det = JobDetection(sc.job)
    alerts = []
    for ev in simulate(sc):
        for h in ev.health:
            alerts += det.on_health(h)
        if ev.frame is not None:
            alerts += det.on_frame(ev.frame)
        alerts += det.tick(ev.ts)
    firing = {(a.kind.value, a.node) for a in alerts if a.state.value == "firing"}
    assert firing == {("hang", None)}


def test_a_path_that_stops_delivering_to_anyone_makes_no_node_silent():
    p = HealthPresence(factor=2.5)
    _fleet(p, "abc", 90.0)  # every node on time up to t=90 (arrived at 90.5) ...
    _fleet(p, "d", 70.0)  # ... but d's report of t=80 is slow on its way
    # and from t=91 the path delivers nothing to anyone: at t=96, d (26 s since its
    # last report) is judged at the path's newest delivery, 20 s: not missing
    assert p.score(96.0).get("d", 0.0) < 2.5
    # the path delivers again (a, b, c on time) and d stays silent: now it is missing
    for n in "abc":
        for t in (100.0, 110.0):
            p.arrived(n, t, at=t + 0.5, interval_s=IV)
            p.learn(n, t, interval_s=IV)
    assert p.score(111.0)["d"] >= 2.5
