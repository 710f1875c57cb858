"""No single record moves a baseline (issue 39, finding 1).

One rank reporting a compute time of 50 s in a 0.2 s job (or any extreme the schema
allows) entered every other rank of its model replica through the replica correction's
plain mean, and from there their learned noise: a real 30 % straggler on another node was
never named afterwards. The detection core alone, driven as the worker drives it.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from detectors.frame import NodeStep
from pipeline.tools.simulator import Scenario
from schemas.telemetry import MAX_STEP_SECONDS
from tests.adversary import play

#: replicas span nodes (tp=2 of 2 GPUs, pp=4): the correction pools ranks across nodes
JOB = {
    "name": "glitch", "nodes": 8, "gpus_per_node": 2, "tp": 2, "pp": 4, "steps": 330,
    "seed": 3, "base_compute_s": 0.2,
    "faults": [{"kind": "straggler", "node": 3, "gpu": 1, "onset_step": 250, "magnitude": 0.3}],
}  # fmt: skip


def glitch(at_step: int, value: float, with_step_time: bool):
    def inject(step: int, msgs: Sequence[NodeStep]) -> list[NodeStep]:
        if step != at_step:
            return list(msgs)
        out = list(msgs)
        m = out[1]  # node-0001, rank 2: not the straggler's node
        update = {"compute_s": value} | ({"step_time_s": value} if with_step_time else {})
        first = m.samples[0].model_copy(update=update)  # type: ignore[attr-defined]
        out[1] = m.model_copy(update={"samples": (first, *m.samples[1:])})  # type: ignore[attr-defined]
        return out

    return inject


@pytest.fixture(scope="module")
def honest_first() -> int:
    first = play(Scenario.model_validate(JOB)).first_step("straggler", "node-0003")
    assert first is not None and 250 <= first <= 260
    return first


@pytest.mark.parametrize("value", [50.0, 1e6, MAX_STEP_SECONDS])
@pytest.mark.parametrize("at_step", [15, 60])
def test_one_glitched_rank_does_not_blind_straggler_detection(honest_first, value, at_step):
    out = play(Scenario.model_validate(JOB), glitch(at_step, value, with_step_time=False))
    assert out.first_step("straggler", "node-0003") == honest_first


def test_a_glitched_step_time_too(honest_first):
    out = play(Scenario.model_validate(JOB), glitch(60, 50.0, with_step_time=True))
    assert out.first_step("straggler", "node-0003") == honest_first
