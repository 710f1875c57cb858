"""Calibration's pure parts: grids, the settings file, judging alerts against labels,
the Pareto front and the recommendation, and a replay through the detection core."""

from __future__ import annotations

import json

import pytest

from detectors.config import DetectorConfig
from pipeline.io.detector_config import (
    config_from_overrides,
    load_detector_config,
    overrides_of,
    write_detector_config,
)
from pipeline.io.errors import ConfigError
from pipeline.tools.calibrate.archive import ArchivedJob, Label
from pipeline.tools.calibrate.grid import (
    DEFAULT_GRID,
    PointResult,
    calibrate,
    diff_settings,
    expand_grid,
    load_grid,
    pareto_front,
    recommend,
)
from pipeline.tools.calibrate.replay import Update, replay, score_job
from pipeline.tools.simulator import Scenario, simulate


def _job(labels, full=False, frames=(), health=(), job_id="j"):
    return ArchivedJob(job_id, list(frames), list(health), [], [], [], list(labels), full)


def _point(index, p, r, delay, fp=0, overrides=None):
    f1 = 2 * p * r / (p + r) if p + r else 0.0
    return PointResult(index, overrides or {}, p, r, round(f1, 4), delay, 1, fp, 1, 1, 0,
                       {}, 100, 0.1)  # fmt: skip


# -- grid --------------------------------------------------------------------------------


def test_grid_is_the_product_of_its_axes_and_tied_settings_move_together():
    points = expand_grid(
        {
            "hang_factor": [2.0, 3.0],
            "straggler_warning,straggler_exit": [[0.03, 0.01], [0.06, 0.02]],
        }
    )
    assert len(points) == 4
    assert {"hang_factor": 3.0, "straggler_warning": 0.06, "straggler_exit": 0.02} in points
    assert len(expand_grid(DEFAULT_GRID)) == 54


@pytest.mark.parametrize(
    ("grid", "names"),
    [
        ({"hang_factr": [2.0]}, "hang_factr"),
        ({"hang_factor": []}, "hang_factor"),
        ({"hang_factor": 2.0}, "hang_factor"),
        ({"straggler_warning,straggler_exit": [[0.03]]}, "straggler_warning,straggler_exit"),
        ({n: list(range(1, 12)) for n in ("hold_steps", "warmup_steps", "nic_window",
                                          "missing_steps")}, "over the limit"),
    ],
)  # fmt: skip
def test_a_bad_grid_is_refused_naming_the_key(grid, names):
    with pytest.raises(ConfigError, match=names):
        expand_grid(grid)


def test_grid_files_are_json_or_toml(tmp_path):
    j = tmp_path / "g.json"
    j.write_text(json.dumps({"hang_factor": [2.0, 3.0]}))
    t = tmp_path / "g.toml"
    t.write_text('hang_factor = [2.0, 3.0]\n"straggler_warning,straggler_exit" = [[0.03, 0.01]]\n')
    assert load_grid(j) == {"hang_factor": [2.0, 3.0]}
    assert len(expand_grid(load_grid(t))) == 2
    assert load_grid(None) == DEFAULT_GRID
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match=r"bad\.json"):
        load_grid(bad)


# -- settings file -----------------------------------------------------------------------


def test_settings_file_round_trip_keeps_only_what_differs(tmp_path):
    cfg = config_from_overrides({"straggler_warning": 0.06, "hang_window": 40})
    path = write_detector_config(tmp_path / "d" / "detector.json", cfg)
    assert json.loads(path.read_text()) == {"hang_window": 40, "straggler_warning": 0.06}
    assert load_detector_config(path) == cfg
    assert load_detector_config(None) == DetectorConfig()
    assert overrides_of(DetectorConfig()) == {}


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ('{"hang_factor": "3"}', "hang_factor"),
        ('{"hang_window": 2.5}', "hang_window"),
        ('{"replica_correction": 1}', "replica_correction"),
        ('{"straggler_exit": 0.2}', "exit must be"),
        ("[1, 2]", "JSON object"),
        ("nope", "not JSON"),
    ],
)
def test_a_bad_settings_file_is_refused_naming_the_file_and_setting(tmp_path, text, match):
    path = tmp_path / "detector.json"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match) as info:
        load_detector_config(path)
    assert "detector.json" in str(info.value)


def test_diff_lists_changed_settings_only():
    run = DetectorConfig()
    new = config_from_overrides({"hang_factor": 3.0})
    assert diff_settings(run, new) == [("hang_factor", 2.5, 3.0)]
    assert diff_settings(run, run) == []


# -- judging -----------------------------------------------------------------------------

FAULT = Label("truth", "f1", "straggler", "node-0003", 60, None, True, 0.08)
FALSE = Label("label", "inc1", "straggler", "node-0005", 100, 110, False)
CRASH = Label("truth", "c1", "crash", "node-0007", 150, None, True)


def test_alerts_are_judged_by_the_labels_they_name():
    ups = [
        Update("a", "straggler", "node-0003", 55),  # before the onset: not this fault
        Update("a", "straggler", "node-0003", 64),  # detected 4 steps after onset
        Update("b", "degradation", "node-0005", 85),  # inside the false label's window
        Update("c", "thermal", "node-0001", 90),  # names nothing labelled
    ]
    s = score_job(_job([FAULT, FALSE]), ups)
    assert dict(s.tp) == {"straggler": 1} and dict(s.fp) == {"degradation": 1}
    assert s.unjudged == 1
    assert s.found == [("straggler", True, 4)]
    # with simulator truth the job is fully labelled: the unlabelled alert is false
    full = score_job(_job([FAULT, FALSE], full=True), ups)
    assert dict(full.fp) == {"degradation": 1, "thermal": 1} and full.unjudged == 0


def test_a_missed_fault_counts_against_recall_and_a_job_hang_during_a_crash_is_neutral():
    ups = [Update("h", "hang", None, 151)]
    s = score_job(_job([FAULT, CRASH], full=True), ups)
    assert s.found == [("straggler", False, None), ("crash", False, None)]
    assert not s.tp and not s.fp and s.unjudged == 0


# -- front and recommendation ------------------------------------------------------------


def test_front_keeps_the_undominated_and_recommend_takes_best_f1_then_delay():
    pts = [
        _point(0, 0.5, 1.0, 6.0),  # running: dominated by 2 and 3
        _point(1, 1.0, 0.5, 2.0, overrides={"hang_factor": 3.0}),
        _point(2, 1.0, 1.0, 5.0, overrides={"straggler_warning": 0.06}),
        _point(3, 1.0, 1.0, 4.0, overrides={"straggler_warning": 0.07, "hang_factor": 3.0}),
        _point(4, 0.9, 0.9, 9.0),  # dominated
    ]
    assert pareto_front(pts) == [1, 3]
    assert recommend(pts, {}) == 3  # same F1 as 2, shorter delay


def test_recommend_prefers_fewer_changes_when_results_tie():
    pts = [
        _point(0, 1.0, 1.0, 2.0, overrides={"straggler_warning": 0.06, "hang_factor": 3.0}),
        _point(1, 1.0, 1.0, 2.0, overrides={"straggler_warning": 0.06}),
    ]
    assert recommend(pts, {"hang_factor": 3.0}) == 0  # no change at all
    assert recommend(pts, {}) == 1


# -- replay through the core -------------------------------------------------------------


@pytest.fixture(scope="module")
def slow_job():
    sc = Scenario.model_validate({
        "name": "cal", "nodes": 8, "steps": 120, "seed": 3,
        "faults": [{"kind": "straggler", "node": 3, "gpu": 2, "onset_step": 50,
                    "magnitude": 0.08}],
    })  # fmt: skip
    frames, health = [], []
    for ev in simulate(sc):
        health += ev.health
        if ev.frame is not None:
            frames.append(ev.frame)
    return _job([Label("truth", "s", "straggler", "node-0003", 50, None, True, 0.08)],
                full=True, frames=frames, health=health, job_id=sc.job)  # fmt: skip


def test_replay_finds_the_straggler_and_a_blind_setting_misses_it(slow_job):
    ups = replay(slow_job, DetectorConfig())
    assert {u.node for u in ups} == {"node-0003"}
    s = score_job(slow_job, ups)
    assert s.found[0][1] and s.found[0][2] is not None and s.found[0][2] <= 10
    blind = config_from_overrides({
        "straggler_warning": 0.5, "straggler_critical": 0.6,
        "degradation_warning": 0.5, "degradation_critical": 0.6,
        # the intermittent-straggler score names a straggler too (slow on a share of
        # its steps): blind it as well
        "intermittent_warning": 0.5, "intermittent_exit": 0.25,
    })  # fmt: skip
    assert score_job(slow_job, replay(slow_job, blind)).found == [("straggler", False, None)]


def test_calibrate_scores_the_running_settings_first_and_reports_refused_points(slow_job):
    grid = {"straggler_warning": [0.05, 0.09], "straggler_exit": [0.025, 0.2]}
    result = calibrate([slow_job], grid, running=config_from_overrides({"hang_factor": 3.0}))
    assert result.points[0].overrides == {} and result.running == {"hang_factor": 3.0}
    refused = [p for p in result.points if p.error]
    assert len(refused) == 2 and all("exit" in p.error for p in refused)
    best = result.best
    assert best.recall == 1.0 and best.precision == 1.0
    assert result.settings_of(result.recommended).hang_factor == 3.0
    assert result.rank_steps == sum(f.n_ranks for f in slow_job.frames)
    assert result.to_json()["recommended"] == result.recommended
    with pytest.raises(ConfigError, match="no archived job"):
        calibrate([], grid)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"jobs": ["a"], "since": "30d"}, "--job"),
        ({}, "--job"),
        ({"jobs": ["a"], "apply": True, "dry_run": True}, "--apply or --dry-run"),
        ({"since": "soon"}, "--since"),
    ],
)
def test_calibrate_command_refuses_contradictory_options_before_reading(kw, match):
    from rich.console import Console

    from pipeline.io.settings import Settings
    from pipeline.tools.calibrate.command import run_calibrate

    with pytest.raises(ConfigError, match=match):
        run_calibrate(Settings(), Console(quiet=True), **kw)


def test_confirmation_settings_share_one_replay_and_delay_the_actions(slow_job):
    grid = {"warning_confirm_steps": [2, 500], "warning_confirm_s": [1e6]}
    result = calibrate([slow_job], grid, running_actuator={"warning_confirm_steps": 20})
    assert result.replays == 1  # the detector settings are the same everywhere
    quick, never = result.points[1], result.points[2]
    assert quick.f1 == never.f1 == result.points[0].f1  # the alerts do not change
    assert quick.action_recall == 1.0 and quick.action_delay_median is not None
    # a WARNING that must persist 500 steps never becomes an action in a 120-step job,
    # unless it turned CRITICAL (which confirms at once)
    assert never.actions <= quick.actions
    assert never.action_delay_median is None or (
        never.action_delay_median >= quick.action_delay_median
    )
    assert result.recommended == 1 and result.actuator_of(1)["warning_confirm_steps"] == 2
    with pytest.raises(ConfigError, match="warning_confirm_steps"):
        calibrate([slow_job], {"hang_factor": [3.0]}, running_actuator={"warning_confirm_steps": 0})
