"""Work per rank per step in the simulator (issue 43): the work_imbalance traps."""

import numpy as np
import pytest

from pipeline.tools.simulator import Scenario, simulate
from schemas import FaultKind


def sc(**kw):
    base = {"name": "work", "nodes": 4, "tp": 1, "steps": 60, "warmup_steps": 0, "seed": 3}
    return Scenario.model_validate({**base, **kw})


def frames(s):
    return [ev.frame for ev in simulate(s) if ev.frame is not None]


def test_a_job_reports_work_only_when_asked():
    assert all(f.tokens is None and f.flops is None for f in frames(sc()))
    fs = frames(sc(tokens_per_rank=2048))
    assert all((f.tokens == 2048).all() and (f.flops == 2048 * 6e9).all() for f in fs)


def test_sequence_length_work_moves_every_step_and_time_follows_it():
    s = sc(faults=[{"kind": "work_imbalance", "magnitude": 0.3}])
    assert s.faults[0].kind is FaultKind.WORK_IMBALANCE and s.faults[0].is_trap
    fs = frames(s)
    busiest = [int(np.argmax(f.tokens)) for f in fs]
    assert len(set(busiest)) > 10  # the heaviest rank changes
    per_token = np.concatenate([f.compute / f.tokens for f in fs])
    tokens = np.concatenate([f.tokens for f in fs])
    assert np.corrcoef(np.concatenate([f.compute for f in fs]), tokens)[0, 1] > 0.9
    assert per_token.std() / per_token.mean() < 0.05  # time per token stays put


def test_moe_hot_ranks_stay_for_a_window_then_move():
    s = sc(nodes=8, faults=[{"kind": "work_imbalance", "variant": "moe", "magnitude": 0.5,
                             "probability": 0.2, "every_steps": 20}])  # fmt: skip
    hot = [frozenset(np.flatnonzero(f.tokens > 4096).tolist()) for f in frames(s)]
    assert all(h == hot[0] for h in hot[:20]) and hot[20] != hot[0] and hot[0]


def test_stage_work_is_more_flops_per_token_on_its_stage():
    s = sc(tp=2, pp=2, faults=[{"kind": "work_imbalance", "variant": "stage", "stage": 1,
                                "magnitude": 0.2}])  # fmt: skip
    f = frames(s)[-1]
    assert (f.tokens == 4096).all()
    ratio = f.flops[f.pp_stage == 1].mean() / f.flops[f.pp_stage == 0].mean()
    assert ratio == pytest.approx(1.2)
    with pytest.raises(ValueError, match="stage"):
        sc(faults=[{"kind": "work_imbalance", "variant": "stage", "magnitude": 0.2}])
