"""stepguard compare: the same fault trace under passive, active and hybrid policies."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.tools.compare import POLICIES, compare, run_policy
from pipeline.tools.simulator import Scenario


def _scenario(faults, **kw) -> Scenario:
    base = {"name": "cmp", "nodes": 16, "pp": 2, "steps": 400, "warmup_steps": 10, "seed": 11,
            "checkpoint_every": 100, "faults": faults}  # fmt: skip
    base.update(kw)
    return Scenario.model_validate(base)


@pytest.mark.parametrize(
    "fault",
    [
        {"kind": "straggler", "node": 5, "gpu": 3, "onset_step": 60, "magnitude": 0.3},
        {"kind": "degradation", "node": 9, "onset_step": 40, "ramp_steps": 150,
         "magnitude": 0.4, "shape": "linear"},
    ],
    ids=["straggler", "degradation"],
)  # fmt: skip
def test_active_loses_fewer_gpu_hours_than_passive_on_slow_nodes(fault):
    results = compare(_scenario([fault]))
    passive, active = results["passive"], results["active"]
    assert active.lost_gpu_hours < passive.lost_gpu_hours
    assert active.goodput > passive.goodput
    assert active.isolations >= 1 and active.false_isolations == 0
    assert passive.isolations == 0 and passive.unremedied_faults == 1


def test_no_fault_costs_the_same_under_every_policy():
    results = compare(_scenario([]))
    lost = [results[p].lost_gpu_hours for p in POLICIES]
    assert max(lost) - min(lost) <= 0.02 * max(lost) + 1e-9
    assert all(results[p].restarts == 0 and results[p].isolations == 0 for p in POLICIES)


def test_passive_relaunches_a_crashed_job_only_after_the_collective_timeout():
    crash = _scenario([{"kind": "crash", "node": 3, "onset_step": 150}])
    slow = run_policy(crash, "passive", comm_timeout_steps=40)
    fast = run_policy(crash, "passive", comm_timeout_steps=10)
    assert slow.restarts == fast.restarts == 1
    assert slow.mttr_s > fast.mttr_s and slow.lost_gpu_hours > fast.lost_gpu_hours


def test_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="policy"):
        run_policy(_scenario([]), "optimistic")


def test_cli_writes_json_per_policy_and_a_plot(tmp_path):
    out, png = tmp_path / "c.json", tmp_path / "c.png"
    result = CliRunner().invoke(
        app, ["compare", "--scenario", "ci_smoke", "--out", str(out), "--plot", str(png),
              "--sweep-checkpoint", "40,80"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    for policy in POLICIES:
        for key in ("lost_gpu_hours", "goodput", "mttr_s", "restarts", "false_isolations"):
            assert key in data[policy]
    assert len(data["sweep"]) == 2
    assert png.stat().st_size > 5000
