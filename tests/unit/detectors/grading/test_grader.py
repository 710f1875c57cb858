"""Grading with hysteresis: min duration, hold, escalation, flap suppression."""

import pytest

from detectors.base import Finding
from detectors.grading.grader import EpisodeState, GradePolicy, Grader, Transition, advance
from schemas import AlertKind, AlertState, Grade, RecommendedAction

POLICY = GradePolicy(
    AlertKind.STRAGGLER,
    enter=(None, 0.05, 0.2),
    exit=0.025,
    min_obs=(1, 3, 2),
    hold_obs=3,
    cooloff_obs=10,
    actions=(
        RecommendedAction.INVESTIGATE,
        RecommendedAction.REPLACE_AT_CHECKPOINT,
        RecommendedAction.ISOLATE,
    ),
)


def feed(scores, grader=None, start=0):
    g = grader or Grader("job", {"straggler": POLICY})
    out = []
    for i, s in enumerate(scores, start):
        fs = [Finding("straggler", "n1", 3, s, "compute_s", 1 + s, 9.0, peer_median=1.0)]
        out += g.observe(fs if s else [], signals={"straggler"}, step=i, ts=1000.0 + i)
    return g, out


def test_single_step_blip_never_fires():
    _, alerts = feed([0.0, 0.5, 0.0, 0.0, 0.5, 0.0])
    assert alerts == []


def test_fires_after_min_duration_with_evidence_and_action():
    _, alerts = feed([0.1, 0.1, 0.1])
    (a,) = alerts
    assert (a.kind, a.grade, a.state, a.seq) == (
        AlertKind.STRAGGLER,
        Grade.WARNING,
        AlertState.FIRING,
        0,
    )
    assert (a.node, a.rank, a.step) == ("n1", 3, 2)
    assert a.recommended_action is RecommendedAction.REPLACE_AT_CHECKPOINT
    assert a.evidence.peer_median == 1.0 and a.evidence.value == pytest.approx(1.1)
    assert a.started_at.timestamp() == 1002.0


def test_updates_only_on_transitions_and_seq_increases():
    _, alerts = feed([0.1] * 5 + [0.3] * 5 + [0.0] * 5)
    assert [(a.grade.value, a.state.value, a.seq) for a in alerts] == [
        ("warning", "firing", 0),
        ("critical", "firing", 1),
        ("critical", "resolved", 2),
    ]
    assert len({a.fingerprint for a in alerts}) == 1
    assert alerts[-1].recommended_action is RecommendedAction.NONE


def test_hold_between_exit_and_enter_keeps_the_episode_open():
    _, alerts = feed([0.1] * 3 + [0.03] * 20)  # above exit, below enter
    assert [a.state for a in alerts] == [AlertState.FIRING]


def test_resolve_needs_hold_observations():
    _, alerts = feed([0.1] * 3 + [0.0, 0.0, 0.1, 0.0, 0.0])
    assert [a.state for a in alerts] == [AlertState.FIRING]


def test_refire_within_cooloff_reopens_the_same_episode():
    _, alerts = feed([0.1] * 3 + [0.0] * 3 + [0.1] * 3)
    assert [a.state.value for a in alerts] == ["firing", "resolved", "firing"]
    assert len({a.fingerprint for a in alerts}) == 1
    assert [a.seq for a in alerts] == [0, 1, 2]


def test_refire_after_cooloff_is_a_new_episode():
    _, alerts = feed([0.1] * 3 + [0.0] * 20 + [0.1] * 3)
    assert [a.state.value for a in alerts] == ["firing", "resolved", "firing"]
    assert alerts[0].fingerprint != alerts[2].fingerprint
    assert alerts[2].seq == 0


def test_fingerprint_is_stable_across_runs():
    _, a = feed([0.1] * 3)
    _, b = feed([0.1] * 3)
    assert a[0].fingerprint == b[0].fingerprint


def test_advance_is_pure():
    s0 = EpisodeState()
    s1, t = advance(s0, 1.0, POLICY, step=0, ts=0.0)
    assert s0 == EpisodeState() and t is None and s1.above == (0, 1, 1)  # info disabled


def test_nan_score_counts_as_above_every_threshold():
    st = EpisodeState()
    for i in range(2):
        st, t = advance(st, float("nan"), POLICY, step=i, ts=0.0)
    assert t is Transition.NEW and st.grade == 2


def test_idle_subjects_are_forgotten():
    g, _ = feed([0.1, 0.0, 0.0])
    assert g.state_of(("straggler", "n1", 3)) is None


def test_findings_outside_the_signals_are_rejected():
    g = Grader("job", {"straggler": POLICY})
    with pytest.raises(ValueError, match="outside"):
        g.observe([Finding("x", None, None, 1, "m", 1, 1)], signals={"straggler"}, step=0, ts=0)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"enter": (None, None, None)}, "enter"),
        ({"enter": (None, 0.3, 0.2)}, "enter"),
        ({"exit": 0.5}, "exit"),
        ({"min_obs": (0, 1, 1)}, "min_obs"),
        ({"hold_obs": 0}, "hold_obs"),
        ({"cooloff_obs": -1}, "cooloff_obs"),
    ],
)
def test_policy_validation_names_the_argument(kwargs, match):
    base = {"kind": AlertKind.STRAGGLER, "enter": (None, 0.05, 0.2), "exit": 0.02}
    with pytest.raises(ValueError, match=match):
        GradePolicy(**{**base, **kwargs})


def test_grader_needs_a_job():
    with pytest.raises(ValueError, match="job_id"):
        Grader("", {"straggler": POLICY})


def test_episodes_of_one_culprit_and_kind_group_into_one_incident_while_any_is_open():
    g = Grader("job", {"straggler": POLICY})

    def step(i, subjects):
        fs = [Finding("straggler", n, r, 0.3, "compute_s", 1.3, 9.0) for n, r in subjects]
        return g.observe(fs, signals={"straggler"}, step=i, ts=1000.0 + i)

    out = []
    for i in range(3):  # ranks 3 and 5 of n1 and rank 9 of n2 go slow together
        out += step(i, [("n1", 3), ("n1", 5), ("n2", 9)])
    for i in range(3, 6):  # rank 5 recovers; rank 3 keeps n1's incident open
        out += step(i, [("n1", 3), ("n2", 9)])
    for i in range(6, 9):  # rank 7 of n1 joins the open incident
        out += step(i, [("n1", 3), ("n1", 7), ("n2", 9)])
    by_rank = {}
    for a in out:
        by_rank.setdefault(a.rank, set()).add(a.incident)
    assert all(len(keys) == 1 for keys in by_rank.values())
    assert by_rank[3] == by_rank[5] == by_rank[7] != by_rank[9]
    for i in range(9, 30):  # everyone recovers: both incidents close (and cool off)
        out += step(i, [])
    for i in range(30, 33):  # later, n1 again: a new episode in a new incident
        out += step(i, [("n1", 3)])
    assert {a.incident for a in out if a.step >= 30} != by_rank[3]
    assert all(a.incident for a in out)


def test_a_creep_then_a_jump_on_one_node_is_one_slow_node_incident():
    degradation = GradePolicy(AlertKind.DEGRADATION, enter=(None, 0.02, 0.1), exit=0.01,
                              min_obs=(1, 2, 8), hold_obs=3)  # fmt: skip
    g = Grader("job", {"straggler": POLICY, "degradation": degradation})
    out = []
    for i in range(4):
        fs = [
            Finding("degradation", "n1", 3, 0.05, "compute_s", 1.05, 6.0),
            Finding("straggler", "n1", 5, 0.3, "compute_s", 1.3, 9.0),
            Finding("straggler", "n2", 9, 0.3, "compute_s", 1.3, 9.0),
        ]
        out += g.observe(fs, signals={"straggler", "degradation"}, step=i, ts=1000.0 + i)
    n1 = {a.incident for a in out if a.node == "n1"}
    assert {a.kind for a in out if a.node == "n1"} == {AlertKind.STRAGGLER, AlertKind.DEGRADATION}
    assert len(n1) == 1 and n1 != {a.incident for a in out if a.node == "n2"}


def test_one_incident_per_sick_node_across_causes_with_the_chain_in_evidence():
    thermal = GradePolicy(AlertKind.THERMAL, enter=(None, 5.0, None), exit=2.0,
                          min_obs=(1, 1, 1), hold_obs=3)  # fmt: skip
    g = Grader("job", {"straggler": POLICY, "thermal": thermal})
    out = []
    for i in range(8):  # n1 throttles from step 0; its ranks turn slow from step 3
        fs = [Finding("thermal", "n1", None, 20.0, "temperature_c", 92.0, 20.0)]
        if i >= 3:
            fs.append(Finding("straggler", "n1", 5, 0.3, "compute_s", 1.3, 9.0))
        fs.append(Finding("thermal", "n2", None, 20.0, "temperature_c", 92.0, 20.0))
        out += g.observe(fs, signals={"straggler", "thermal"}, step=i, ts=1000.0 + i)
    n1 = [a for a in out if a.node == "n1"]
    assert {a.kind for a in n1} == {AlertKind.THERMAL, AlertKind.STRAGGLER}
    assert len({a.incident for a in n1}) == 1
    assert {a.incident for a in n1} != {a.incident for a in out if a.node == "n2"}
    strag = next(a for a in n1 if a.kind is AlertKind.STRAGGLER)
    assert "incident chain: thermal (step 0) -> straggler (step" in strag.evidence.detail
    for i in range(8, 30):  # both recover: the incident and its chain are gone
        out += g.observe([], signals={"straggler", "thermal"}, step=i, ts=1000.0 + i)
    assert g._causes == {}
