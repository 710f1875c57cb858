"""Peer-relative scores on small hand-built frames."""

import numpy as np
import pytest

from detectors.frame import StepFrame
from detectors.steps.peer import PeerDetector


def sync_frame(compute, data=None, pp_stage=None, step=0):
    """Synchronous step: everyone's wall time is the slowest rank's."""
    compute = np.asarray(compute, dtype=float)
    data = np.zeros_like(compute) if data is None else np.asarray(data, dtype=float)
    busy = compute + data
    comm = busy.max() + 0.05 - busy
    return StepFrame.from_arrays(
        "j",
        step,
        ts=float(step),
        compute=compute,
        comm_wait=comm,
        data_wait=data,
        pp_stage=pp_stage,
    )


def test_culprit_has_high_compute_low_comm_and_peers_mirror_it():
    compute = np.full(32, 1.0)
    compute[7] = 1.15
    s = PeerDetector().score_frame(sync_frame(compute))
    assert np.argmax(s.z_compute) == 7
    assert s.slowdown[7] == pytest.approx(0.15)
    assert np.argmin(s.comm_excess) == 7 and s.comm_excess[7] < 0
    assert np.all(np.delete(s.slowdown, 7) == 0)


def test_step_time_alone_cannot_name_the_culprit():
    compute = np.full(16, 1.0)
    compute[3] = 1.3
    frame = sync_frame(compute)
    assert np.ptp(frame.step_time) == 0  # identical everywhere
    assert int(np.argmax(PeerDetector().score_frame(frame).z_compute)) == 3


def test_pipeline_stages_are_compared_within_their_stage():
    stage = np.repeat([0, 1], 16)
    compute = np.where(stage == 1, 1.3, 1.0)  # stage 1 always does more work
    s = PeerDetector(min_group_size=8).score_frame(sync_frame(compute, pp_stage=stage))
    assert s.groups.n_groups == 2
    assert np.allclose(s.slowdown, 0) and np.allclose(s.z_compute, 0)


def test_small_stages_fall_back_to_the_whole_job():
    stage = np.repeat([0, 1], 4)
    s = PeerDetector(min_group_size=8).score_frame(sync_frame(np.ones(8), pp_stage=stage))
    assert s.groups.n_groups == 1


def test_mad_floor_keeps_tiny_noise_from_exploding():
    compute = np.full(16, 1.0)
    compute[0] = 1.001  # 0.1 % with all other peers identical (MAD = 0)
    s = PeerDetector(mad_floor_rel=0.01).score_frame(sync_frame(compute))
    assert np.isfinite(s.z_compute).all()
    assert s.z_compute[0] == pytest.approx(0.1)


def test_data_loader_stall_is_high_data_wait_against_peers():
    data = np.full(16, 0.01)
    data[5] = 0.3
    s = PeerDetector().score_frame(sync_frame(np.ones(16), data=data))
    assert int(np.argmax(s.z_data)) == 5
    assert s.data_excess[5] > 0.2


def test_scaling_every_timing_changes_no_score():
    rng = np.random.default_rng(1)
    compute = 1 + 0.02 * rng.standard_normal(64)
    f = sync_frame(compute)
    g = StepFrame.from_arrays(
        "j", 0, 0.0, 3 * f.compute, comm_wait=3 * f.comm_wait, data_wait=3 * f.data_wait
    )
    a, b = PeerDetector().score_frame(f), PeerDetector().score_frame(g)
    for name in ("slowdown", "z_compute", "comm_excess", "z_comm", "data_excess"):
        assert np.allclose(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        ({"mad_floor_rel": -0.1}, "mad_floor_rel"),
        ({"mad_floor_abs": 0.0}, "mad_floor_abs"),
        ({"min_group_size": 0}, "min_group_size"),
    ],
)
def test_invalid_arguments_are_named(kwargs, name):
    with pytest.raises(ValueError, match=name):
        PeerDetector(**kwargs)


def test_learn_one_returns_none_and_args_are_stored():
    d = PeerDetector(mad_floor_rel=0.02, min_group_size=4)
    assert d.learn_one(sync_frame(np.ones(4))) is None
    assert (d.mad_floor_rel, d.min_group_size) == (0.02, 4)
