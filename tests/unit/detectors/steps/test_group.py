"""Nodes that began to slow together are one group finding."""

import pytest

from detectors.base import Finding
from detectors.steps.group import GroupFaults


def slow(node, s=0.2, rank=None, signal="straggler"):
    return Finding(signal, node, rank, s, "compute_s", 1.2, 9.0)


def play(g, plan, steps):
    """``plan(step)`` -> the findings of that step; returns every step's collapse."""
    outs = []
    for step in range(steps):
        found = plan(step)
        outs.append(g.collapse(found, step))
        g.learn(found, step)
    return outs


def test_nodes_starting_together_are_one_group_from_the_second_step():
    rack = [f"node-{i}" for i in range(8)]
    outs = play(GroupFaults(), lambda s: [slow(n) for n in rack] if s >= 10 else [], 30)
    assert [f.node for f in outs[10]] == rack  # one step: not yet a group
    assert all([(f.signal, f.node) for f in o] == [("group", None)] for o in outs[11:])
    assert outs[-1][0].value == 8 and "since step 10" in outs[-1][0].detail


def test_independent_faults_far_apart_stay_node_findings():
    def plan(s):
        return [slow(n) for n, start in (("a", 10), ("b", 30), ("c", 50)) if s >= start]

    outs = play(GroupFaults(), plan, 60)
    assert sorted(f.node for f in outs[-1]) == ["a", "b", "c"]


def test_rank_level_blips_and_other_signals_never_form_a_group():
    def plan(s):
        blips = [slow(f"n{s % 7}", rank=3), slow(f"n{(s + 1) % 7}", rank=1)]
        return blips + [slow(f"h{i}", signal="nic_flap") for i in range(5)]

    outs = play(GroupFaults(), plan, 40)
    assert all(all(f.signal != "group" for f in o) for o in outs)


def test_a_late_node_is_its_own_fault_and_the_group_outlives_a_missing_member():
    def plan(s):
        out = [slow(n) for n in ("a", "b", "c")] if s >= 5 and s != 20 else []
        if s == 20:
            out = [slow("a")]  # two members not found for one step
        return out + ([slow("late")] if s >= 30 else [])

    outs = play(GroupFaults(), plan, 40)
    assert [f.signal for f in outs[20]] == ["group"]
    assert sorted((f.signal, f.node) for f in outs[-1]) == [("group", None), ("straggler", "late")]


def test_a_node_slow_long_before_the_group_is_not_joined_to_it():
    def plan(s):
        early = [slow("old")] if s >= 2 else []
        return early + ([slow(n) for n in ("a", "b", "c")] if s >= 30 else [])

    outs = play(GroupFaults(), plan, 40)
    assert sorted((f.signal, f.node) for f in outs[-1]) == [("group", None), ("straggler", "old")]


def test_extra_findings_count_towards_a_group_and_are_never_returned():
    g = GroupFaults()
    extra = [slow(n) for n in ("x", "y", "z")]
    outs = []
    for step in range(5):
        outs.append(g.collapse([], step, extra))
        g.learn([], step, extra)
    assert outs[0] == [] and [f.signal for f in outs[-1]] == ["group"]


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="min_nodes"):
        GroupFaults(min_nodes=1)
    with pytest.raises(ValueError, match="window"):
        GroupFaults(window=0)
