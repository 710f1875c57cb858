"""stepguard plan: an event-level Monte-Carlo of whole jobs under the compare policies."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.io.errors import ConfigError
from pipeline.tools.plan import (
    POLICIES,
    RULES,
    Rates,
    load_rates,
    plan_one,
    sweep,
    young_interval_s,
)

NO_FAULTS = {"crash_per_gpu_hour": 0.0, "straggler_per_gpu_hour": 0.0,
             "false_replace_per_node_day": 0.0}  # fmt: skip


def test_no_faults_and_free_checkpoints_lose_nothing():
    r = plan_one(1024, 21, 300, rates=Rates(**NO_FAULTS, save_s=0), replicates=50)
    for p in POLICIES:
        assert r.policies[p].lost_gpu_hours.mean == 0.0
        assert r.policies[p].goodput.mean == 1.0
        assert r.policies[p].spare_nodes_p95 == 0


def test_no_faults_lose_only_the_checkpoint_saves():
    rates = Rates(**NO_FAULTS, save_s=30)
    r = plan_one(64, 10, 270, rates=rates, replicates=20)
    for p in POLICIES:
        assert r.policies[p].goodput.mean == pytest.approx(1 - 30 / 300)


@pytest.mark.parametrize("gpus", [512, 4096])
def test_checkpoint_optimum_is_within_ten_percent_of_young_with_crashes_only(gpus):
    rates = Rates(straggler_per_gpu_hour=0.0, false_replace_per_node_day=0.0, save_s=30)
    r = plan_one(gpus, 21, 300, rates=rates, replicates=400, seed=3)
    mtbf_s = 3600 / (rates.crash_per_gpu_hour * gpus)
    assert r.young_s == pytest.approx(young_interval_s(30, mtbf_s))
    for p in POLICIES:
        assert r.policies[p].best_interval_s == pytest.approx(r.young_s, rel=0.10)
        assert r.policies[p].best_lost_gpu_hours <= r.policies[p].lost_gpu_hours.mean


def test_expected_crash_loss_matches_the_closed_form():
    """Passive, crashes only: n * (interval / 2 + timeout + restart) + save overhead."""
    rates = Rates(straggler_per_gpu_hour=0.0, false_replace_per_node_day=0.0, save_s=0)
    gpus, days, interval = 2048, 30, 1800.0
    r = plan_one(gpus, days, interval, rates=rates, replicates=2000, seed=5)
    n = rates.crash_per_gpu_hour * gpus * days * 24
    per_crash_s = interval / 2 + rates.comm_timeout_s + rates.restart_s
    expected = n * per_crash_s * gpus / 3600
    e = r.policies["passive"].lost_gpu_hours
    assert e.ci_low <= expected <= e.ci_high or e.mean == pytest.approx(expected, rel=0.02)
    # active acts after its detection delay instead of the collective timeout
    active = n * (interval / 2 + rates.detect_crash_s + rates.restart_s) * gpus / 3600
    assert r.policies["active"].lost_gpu_hours.mean == pytest.approx(active, rel=0.03)


def test_stragglers_cost_passive_most_and_active_replaces_them_with_spares():
    rates = Rates(crash_per_gpu_hour=0.0, false_replace_per_node_day=0.0)
    r = plan_one(4096, 21, 600, rates=rates, replicates=300, seed=2)
    passive, active, hybrid = (r.policies[p] for p in POLICIES)
    # the same traces under each policy (common random numbers): the means are paired
    assert active.lost_gpu_hours.mean < hybrid.lost_gpu_hours.mean
    assert hybrid.lost_gpu_hours.mean + 1000 < passive.lost_gpu_hours.mean
    assert passive.remedied_stragglers == 0 and passive.spare_nodes_p95 == 0
    assert active.remedied_stragglers > 0 and active.spare_nodes_p95 >= 1


def test_false_alarms_cost_active_and_not_hybrid():
    rates = Rates(**{**NO_FAULTS, "false_replace_per_node_day": 0.01}, save_s=0)
    r = plan_one(1024, 21, 600, rates=rates, replicates=100)
    assert r.policies["active"].lost_gpu_hours.mean > 0
    assert r.policies["active"].spare_nodes_p95 >= 1
    assert (
        r.policies["hybrid"].lost_gpu_hours.mean == r.policies["passive"].lost_gpu_hours.mean == 0
    )


def test_plan_uses_the_rules_compare_plays():
    from pipeline.tools import compare

    assert compare.POLICIES == POLICIES
    assert not RULES["passive"].detects and RULES["passive"].relaunch_on_timeout
    assert RULES["active"].detects and not RULES["active"].human_approval
    assert RULES["hybrid"].human_approval


def test_seeded_runs_repeat_and_sweep_reports_progress():
    a = plan_one(256, 7, 600, replicates=50, seed=9)
    b = plan_one(256, 7, 600, replicates=50, seed=9)
    assert a == b
    seen: list[tuple[int, int]] = []
    cells = sweep([64, 1024], [7.0, 21.0], 600, replicates=20,
                  progress=lambda done, total, _: seen.append((done, total)))  # fmt: skip
    assert [(c.gpus, c.days) for c in cells] == [(64, 7), (64, 21), (1024, 7), (1024, 21)]
    assert seen[0] == (0, 4) and seen[-1] == (4, 4)


def test_bad_arguments_and_rates_files_are_named(tmp_path):
    with pytest.raises(ValueError, match="gpus"):
        plan_one(0, 21, 300)
    bad = tmp_path / "r.json"
    bad.write_text(json.dumps({"crash_per_gpu_hour": -1}))
    with pytest.raises(ConfigError, match="crash_per_gpu_hour"):
        load_rates(bad)
    bad.write_text(json.dumps({"crashes": 1}))
    with pytest.raises(ConfigError, match="crashes"):
        load_rates(bad)
    toml = tmp_path / "r.toml"
    toml.write_text("restart_s = 120\n")
    assert load_rates(toml).restart_s == 120


def test_cli_prints_the_sweep_and_writes_json_and_a_plot(tmp_path):
    out, png = tmp_path / "p.json", tmp_path / "p.png"
    rates = tmp_path / "r.json"
    rates.write_text(json.dumps({"restart_s": 300}))
    result = CliRunner().invoke(
        app, ["plan", "--gpus", "512", "--days", "7", "--checkpoint-s", "600",
              "--replicates", "50", "--rates", str(rates), "--sweep-gpus", "64,4096",
              "--sweep-days", "7,21", "--out", str(out), "--plot", str(png)],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["gpus"] == 512 and data["rates"]["restart_s"] == 300
    for p in POLICIES:
        for key in ("lost_gpu_hours", "goodput", "best_interval_s", "spare_nodes_p95"):
            assert key in data["policies"][p]
    assert data["young_s"] > 0 and data["winner"] in POLICIES
    assert [(c["gpus"], c["days"]) for c in data["sweep"]] == [
        (64, 7),
        (64, 21),
        (4096, 7),
        (4096, 21),
    ]
    assert png.stat().st_size > 5000


def test_a_plan_too_big_to_draw_is_refused_by_name():
    with pytest.raises(ValueError, match="replicates"):
        plan_one(10_000_000, 365, 300, replicates=1000)
    result = CliRunner().invoke(app, ["plan", "--gpus", "10000000", "--days", "365"])
    assert result.exit_code == 2 and "lower replicates" in result.output


def test_cli_refuses_a_bad_sweep_list():
    result = CliRunner().invoke(app, ["plan", "--sweep-gpus", "64,lots"])
    assert result.exit_code != 0
    assert "comma-separated" in result.output
