"""The detection-quality benchmark's matching and scoring, with stand-in detection cores."""

from __future__ import annotations

import importlib.util
import sys
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from detectors.frame import StepFrame
from pipeline.tools.simulator import Scenario, load_suite, node_name
from schemas import (
    Alert,
    AlertKind,
    AlertState,
    Evidence,
    FaultKind,
    Grade,
    NodeHealth,
    episode_fingerprint,
)

ROOT = Path(__file__).resolve().parents[5]


@pytest.fixture(scope="module")
def dq() -> ModuleType:
    if str(ROOT / "benchmarks") not in sys.path:  # the script imports its sibling _common
        sys.path.insert(0, str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location(
        "detection_quality", ROOT / "benchmarks" / "detection_quality.py"
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["detection_quality"] = mod
    spec.loader.exec_module(mod)
    return mod


def scenario(faults: list[dict[str, Any]], **kw: Any) -> Scenario:
    base: dict[str, Any] = {"name": "b", "nodes": 4, "steps": 80, "warmup_steps": 5, "seed": 3}
    return Scenario.model_validate({**base, **kw, "faults": faults})


def alert(job: str, kind: str, node: str | None, step: int, ts: float, first: int) -> Alert:
    t = datetime.fromtimestamp(ts, UTC)
    return Alert(
        fingerprint=episode_fingerprint(job, kind, node, None, first),
        seq=0,
        kind=AlertKind(kind),
        grade=Grade.CRITICAL,
        state=AlertState.FIRING,
        job_id=job,
        node=node,
        step=step,
        started_at=t,
        ts=t,
        evidence=Evidence(metric="x", value=1.0, deviation=1.0),
    )


class Silent:
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id

    def process_step(self, frame: StepFrame) -> list[Alert]:
        return []

    def process_health(self, msg: NodeHealth) -> list[Alert]:
        return []

    def tick(self, now: float) -> list[Alert]:
        return []


class Oracle(Silent):
    """Knows the truth: names each fault's node once active; job-level hang on stalls."""

    def __init__(self, job_id: str, s: Scenario) -> None:
        super().__init__(job_id)
        self.s = s
        self.fired: set[str] = set()
        self.last_frame_ts: float | None = None
        self.step = -1

    def process_step(self, frame: StepFrame) -> list[Alert]:
        self.step, self.last_frame_ts = frame.step, frame.ts
        out = []
        for f in self.s.faults:
            if f.is_trap or f.node is None or not f.active(frame.step):
                continue
            if f.fault_id not in self.fired:
                self.fired.add(f.fault_id or "")
                node = node_name(f.node)
                out.append(alert(self.job_id, "straggler", node, frame.step, frame.ts, frame.step))
        return out

    def process_health(self, msg: NodeHealth) -> list[Alert]:
        if any(48 in g.xid_codes for g in msg.gpus) and "xid" not in self.fired:
            self.fired.add("xid")
            return [alert(self.job_id, "hardware", msg.node, self.step + 1, msg.ts.timestamp(), 0)]
        return []

    def tick(self, now: float) -> list[Alert]:
        if self.last_frame_ts is None or now - self.last_frame_ts < 2.0 or "hang" in self.fired:
            return []
        self.fired.add("hang")
        out = [alert(self.job_id, "hang", None, self.step + 1, now, self.step + 1)]
        for f in self.s.faults:
            if f.kind == FaultKind.CRASH and f.node is not None:
                out.append(alert(self.job_id, "missing", node_name(f.node), self.step + 1, now, 1))
        return out


class Noisy(Silent):
    """Fires one new episode on node-0000 every 10 steps."""

    def process_step(self, frame: StepFrame) -> list[Alert]:
        if frame.step % 10:
            return []
        return [alert(self.job_id, "straggler", "node-0000", frame.step, frame.ts, frame.step)]


FAULTS = [
    {"kind": "straggler", "node": 1, "gpu": 2, "onset_step": 20, "magnitude": 0.2},
    {"kind": "hang", "onset_step": 40, "duration_steps": 4},
    {"kind": "single_step_blip", "node": 3, "onset_step": 30, "magnitude": 0.5},
]


def test_oracle_scores_perfectly_and_silence_detects_nothing(dq: ModuleType) -> None:
    s = scenario(FAULTS)
    good = dq.evaluate([s], lambda job: Oracle(job, s))
    assert good["overall"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0}
    assert good["per_fault"]["straggler"]["delay_steps_median"] == 0
    hang = good["scenarios"][0]["faults"][1]
    assert hang["detected"] and 2.0 <= hang["delay_s"] < 3.0 and hang["hang_flag_s"] < 3.0
    quiet = dq.evaluate([s], Silent)
    assert quiet["overall"]["recall"] == 0.0 and quiet["false_positive_episodes"] == 0


def test_false_positives_count_episodes_and_trap_scenarios(dq: ModuleType) -> None:
    trap = scenario([{"kind": "diurnal_temperature", "magnitude": 3}], name="trap")
    res = dq.evaluate([trap, scenario(FAULTS)], Noisy)
    assert res["trap_alerts"] == 8  # steps 0, 10, ..., 70: one episode each
    assert res["false_positive_episodes"] == 16
    assert res["trap_window_alerts"] == 8  # the whole trap run is a (diurnal) trap window
    assert res["overall"]["precision"] == 0.0
    assert res["targets"]["trap_alerts"]["ok"] is False


def test_crash_needs_the_node_named_and_ecc_needs_the_fatal_report(dq: ModuleType) -> None:
    crash_s = scenario([{"kind": "crash", "node": 2, "onset_step": 50, "hang_steps": 10}])
    ecc_s = scenario(
        [{"kind": "ecc_storm", "node": 1, "gpu": 0, "onset_step": 10, "duration_steps": 40}],
        name="ecc",
    )
    for s in (crash_s, ecc_s):
        res = dq.evaluate([s], lambda job, s=s: Oracle(job, s))
        (fault,) = res["scenarios"][0]["faults"]
        assert fault["detected"] and fault["hang_flag_s"] is not None
        assert res["scenarios"][0]["fp_episodes"] == 0
        assert res["scenarios"][0]["neutral_episodes"] == 1  # the job-level hang alert
    assert fault["fatal_reports"] == 1


def test_static_threshold_names_an_arbitrary_rank(dq: ModuleType) -> None:
    s = scenario([{"kind": "straggler", "node": 2, "onset_step": 30, "magnitude": 0.8}])
    res = dq.evaluate([s], Silent)
    static = res["baselines"]["static_threshold"]
    rel = res["baselines"]["relative_score"]
    assert static["recall"] == 0.0 and static["precision"] == 0.0  # names rank 0 / node 0
    assert rel["recall"] == 1.0 and rel["precision"] == 1.0


def test_markdown_section_is_replaced_in_place(dq: ModuleType, tmp_path: Path) -> None:
    p = tmp_path / "B.md"
    p.write_text("# Benchmarks\n\nintro\n")
    dq.write_section("detection_quality", "first\n", p)
    dq.write_section("detection_quality", "second\n", p)
    text = p.read_text()
    assert text.count("<!-- detection_quality:start -->") == 1
    assert "second" in text and "first" not in text
    assert text.startswith("# Benchmarks\n\nintro")


def test_quick_subset_covers_every_fault_and_trap(dq: ModuleType) -> None:
    quick = load_suite(names=dq.QUICK)
    assert {t.kind for s in quick for t in s.truth()} == set(FaultKind)
