"""Issue 44 2(b): on a shared host a healthy rank's compute runs +20 to +40 % over its
peers for a few steps now and then; the compute rule names a straggler only once its run
is beyond the job's own noise runs (:mod:`detectors.steps.persistence`), while a gross
straggler is still named in ``straggler_min_steps`` steps and one like the noise once
it outlasts it."""

from __future__ import annotations

import numpy as np
import pytest

from detectors.config import DetectorConfig
from detectors.engine import DetectorSuite
from detectors.frame import StepFrame
from detectors.steps.persistence import KEEP, NoiseRuns
from schemas import AlertKind, Grade


def bursty_job(steps, *, slow=1.0, onset=10**9, bursts=(), seed=0):
    """4 ranks on 2 nodes of a shared host: each rank's compute spreads by 4 %, and now
    and then a healthy rank computes +20 to +40 % for two to four steps (another
    process took its core); ``bursts``: (rank, first step, steps, factor) placed on
    purpose; rank 3 computes ``slow`` times as much from ``onset`` (a straggler: its
    peers wait for it in the collectives)."""
    rng = np.random.default_rng(seed)
    left = np.zeros(4, dtype=int)
    factor = np.ones(4)
    for step in range(steps):
        start = (left == 0) & (rng.random(4) < 0.03)
        left[start] = rng.integers(2, 5, size=int(start.sum()))
        factor[start] = rng.uniform(1.2, 1.4, size=int(start.sum()))
        compute = 0.03 * (1.0 + 0.04 * rng.standard_normal(4))
        compute *= np.where(left > 0, factor, 1.0)
        left = np.maximum(left - 1, 0)
        for rank, first, n, f in bursts:
            if first <= step < first + n:
                compute[rank] *= f
        if step >= onset:
            compute[3] *= slow
        step_time = float(compute.max()) + 0.01 + 0.002 * rng.random()
        yield StepFrame.from_arrays(
            "job", step, 10.0 + 0.1 * step, compute, step_time - compute - 0.005,
            ranks_per_node=2, step_time=np.full(4, step_time),
        )  # fmt: skip


def warnings(frames, **cfg):
    suite = DetectorSuite("job", DetectorConfig(**cfg))
    return [
        a
        for f in frames
        for a in suite.process_step(f)
        if a.kind is AlertKind.STRAGGLER and a.grade is not Grade.INFO
    ]


def described(alerts):
    return [(a.node, a.rank, a.step, a.evidence.detail[:100]) for a in alerts]


def test_a_shared_hosts_compute_bursts_name_nobody():
    """300 steps of eight such jobs: none raises a WARNING; judged as before the noise
    runs (a run counts after ``straggler_min_steps`` whatever the noise did, here
    ``noise_run_cap`` 1 and ``noise_run_margin`` 1) most of them do."""
    raised = [bool(warnings(bursty_job(300, seed=s))) for s in range(8)]
    before = [
        bool(warnings(bursty_job(300, seed=s), noise_run_cap=1, noise_run_margin=1))
        for s in range(8)
    ]
    assert not any(raised), raised
    assert sum(before) >= 5, before


@pytest.mark.parametrize("seed", range(4))
def test_a_gross_straggler_is_named_within_a_few_steps_on_the_noisy_host(seed):
    """+80 %: beyond twice what the noise ever sustained, named in its first steps
    (measured: 2 to 8 steps after the onset over eight seeds; 2 to 6 before)."""
    found = warnings(bursty_job(120, slow=1.8, onset=60, seed=seed))
    assert {(a.node, a.rank) for a in found} == {("node-1", 3)}, described(found)
    assert 60 <= found[0].step <= 68, described(found)


@pytest.mark.parametrize("seed", range(4))
def test_a_straggler_like_the_noise_is_named_once_it_outlasts_it(seed):
    """+30 %, within what the noise sustains: named once its run outlasts the noise's
    (at most ``noise_run_cap`` steps) and the z of the rank's own baseline agrees."""
    found = warnings(bursty_job(140, slow=1.3, onset=60, seed=seed))
    assert found and {(a.node, a.rank) for a in found} == {("node-1", 3)}, described(found)
    assert found[0].step <= 80, described(found)


def test_a_run_that_outlasts_the_cap_or_was_named_is_not_noise():
    runs = NoiseRuns()
    slots = np.array([0, 1])
    for step in range(12):  # rank 0: 12 steps (beyond the cap), rank 1: 3 steps, named
        up = np.array([0.3, 0.3 if step < 3 else 0.0])
        runs.learn(slots, up, 0.05, named=np.array([False, True]), cap=9)
    runs.learn(slots, np.zeros(2), 0.05, named=np.zeros(2, bool), cap=9)
    assert runs.longest == 0 and runs.record == 0.0
    for _ in range(KEEP + 5):  # the remembered runs are the last KEEP
        runs.learn(slots, np.array([0.2, 0.0]), 0.05, named=np.zeros(2, bool), cap=9)
        runs.learn(slots, np.zeros(2), 0.05, named=np.zeros(2, bool), cap=9)
    assert runs.longest == 1 and runs.record == 0.0  # one-step runs set no record
    runs.forget(np.array([0]))
    assert runs.beyond(slots, np.array([0.2, 0.0]), 0.05, min_steps=3, cap=9,
                       margin=3.0).tolist() == [True, False]  # fmt: skip
