"""RankIndex, and per-rank state sized by the ranks a job has, not by their ids."""

import dataclasses
import json
import re

import numpy as np
import pytest

from detectors.engine import DetectorSuite
from detectors.frame import StepFrame
from detectors.steps.ranks import RankIndex
from pipeline.io import statecodec
from schemas import AlertKind
from schemas.telemetry import MAX_RANKS_PER_JOB

#: 16 rank ids spread over the whole schema range, sorted (so nodes match 0..15's)
SPARSE = np.array(
    [
        *(7, 1000, 4097, 65_536, 65_537, 100_003, 200_000, 262_144),
        *(300_001, 500_000, 524_287, 700_000, 800_000, 999_999, 1_048_574, 1_048_575),
    ]
)
DENSE = np.arange(16)


def test_lookup_reads_only_and_assign_agrees():
    idx = RankIndex()
    ranks = np.array([40, 3, 1_000_000, 3, 9])
    assert idx.lookup(ranks).tolist() == [0, 1, 2, 1, 3]  # first-seen, repeats share
    assert idx.n_slots == 0 and idx.ids.tolist() == []
    assert idx.assign(ranks).tolist() == [0, 1, 2, 1, 3]
    assert idx.ids.tolist() == [40, 3, 1_000_000, 9]
    assert idx.assign(np.array([9, 5, 40])).tolist() == [3, 4, 0]
    assert idx.lookup(np.zeros(0, dtype=np.int64)).tolist() == []


@pytest.mark.parametrize("bad", [-1, MAX_RANKS_PER_JOB, 2**40])
def test_rank_ids_beyond_the_schema_cap_are_refused(bad):
    idx = RankIndex()
    idx.assign(np.array([0, 1]))
    with pytest.raises(ValueError, match="rank ids must be in"):
        idx.lookup(np.array([0, bad]))
    with pytest.raises(ValueError, match="rank ids must be in"):
        idx.assign(np.array([bad]))
    assert idx.ids.tolist() == [0, 1]


@pytest.mark.parametrize("max_ranks", [0, MAX_RANKS_PER_JOB + 1])
def test_max_ranks_is_checked(max_ranks):
    with pytest.raises(ValueError, match="max_ranks"):
        RankIndex(max_ranks)


def test_index_matches_a_dict_through_dense_and_sparse_ids():
    rng = np.random.default_rng(3)
    idx, ref = RankIndex(), {}
    modes = set()
    batches = [rng.integers(0, 3000, 50), rng.integers(0, MAX_RANKS_PER_JOB, 20)]
    batches += [np.arange(0, 4000, 2), rng.integers(0, 9000, 3000), np.arange(200)]
    batches += [rng.integers(0, MAX_RANKS_PER_JOB, 5000), np.array([5, 5, 5])]
    for batch in batches:
        want = dict(ref)
        for r in batch.tolist():
            want.setdefault(r, len(want))
        expect = [want[r] for r in batch.tolist()]
        assert idx.lookup(batch).tolist() == expect
        assert len(ref) == idx.n_slots  # lookup changed nothing
        assert idx.assign(batch).tolist() == expect
        ref = want
        assert idx.ids.tolist() == list(ref)
        modes.add(idx.table_size > 0)
        # the table, when kept, is linear in the slots
        assert idx.table_size <= max(4096, 4 * idx.n_slots)
    assert modes == {True, False}


def _steps(ids, steps=60, seed=0):
    """A 16-rank job (4 per node) with rank ids ``ids``; the 14th rank turns slow at
    step 20, the second node stops reporting at step 40 and the 3rd rank at step 50."""
    rng = np.random.default_rng(seed)
    ts = 1_000.0
    for step in range(steps):
        compute = 1.0 + 0.01 * rng.standard_normal(16)
        if step >= 20:
            compute[13] *= 1.15
        busy = compute + 0.01
        ts += busy.max() + 0.05
        f = StepFrame.from_arrays(
            "job",
            step,
            ts,
            compute,
            busy.max() + 0.05 - busy,
            np.full(16, 0.01),
            ranks_per_node=4,
            rank=ids,
            loss=np.full(16, 3.0 - 0.001 * step),
            grad_norm=np.ones(16),
        )
        keep = np.ones(16, dtype=bool)
        if step >= 40:
            keep[4:8] = False
        if step >= 50:
            keep[2] = False
        yield _rows(f, keep)


def _rows(f, keep):
    """``f`` with only the rows ``keep`` (their nodes unchanged)."""
    arrays = {
        k.name: getattr(f, k.name)[keep]
        for k in dataclasses.fields(f)
        if isinstance(getattr(f, k.name), np.ndarray)
    }
    return dataclasses.replace(f, **arrays)


def _run(mon, frames):
    out = []
    for f in frames:
        out += mon.process_step(f)
    return out


def _as_sparse(alert):
    """The dense job's alert as the sparse job should say it: rank ``r`` is SPARSE[r]."""
    d = alert.model_dump(mode="json", exclude={"fingerprint"})
    if d["rank"] is not None:
        d["rank"] = int(SPARSE[d["rank"]])
    text = json.dumps(d, sort_keys=True)
    return re.sub(r"\brank (\d+)", lambda m: f"rank {SPARSE[int(m[1])]}", text)


def _arrays(obj, seen=None):
    """Sizes of every numpy array reachable from ``obj`` (its fields, recursively)."""
    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, np.ndarray):
        return [obj.size]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in _arrays(v, seen)]
    if isinstance(obj, list | tuple | set | frozenset):
        return [s for v in obj for s in _arrays(v, seen)]
    if hasattr(obj, "__dict__"):
        return _arrays(vars(obj), seen)
    return []


def test_sparse_rank_ids_are_scored_like_dense_ones():
    dense, sparse = DetectorSuite("job"), DetectorSuite("job")
    want = _run(dense, _steps(DENSE))
    got = _run(sparse, _steps(SPARSE))
    kinds = {(a.kind, a.rank) for a in got}
    assert (AlertKind.STRAGGLER, 999_999) in kinds  # the real rank id is reported
    assert (AlertKind.MISSING, 4097) in kinds
    assert (AlertKind.MISSING, None) in kinds  # the silent node
    assert [json.loads(_as_sparse(a)) for a in want] == [
        json.loads(json.dumps(a.model_dump(mode="json", exclude={"fingerprint"}), sort_keys=True))
        for a in got
    ]
    # per-rank state holds 16 entries (or a little room to grow), whatever the ids
    assert sparse.ranks.n_slots == 16 and sparse.ranks.table_size == 0
    assert sparse.baselines.n_slots <= 32
    assert sparse.nodes.rank_node.shape[0] <= 32
    assert max(_arrays(sparse)) == max(_arrays(dense)) < 1000


def test_a_rank_id_beyond_the_cap_leaves_the_monitor_unchanged():
    mon = DetectorSuite("job")
    frames = list(_steps(DENSE, steps=3))
    _run(mon, frames[:2])
    bad = dataclasses.replace(frames[2], rank=frames[2].rank + MAX_RANKS_PER_JOB - 15)
    with pytest.raises(ValueError, match="rank ids"):
        mon.process_step(bad)
    assert mon.steps_seen == 2 and mon.ranks.n_slots == 16


def test_monitor_with_sparse_ranks_survives_the_state_codec():
    frames = list(_steps(SPARSE))
    mon = DetectorSuite("job")
    _run(mon, frames[:45])
    blob = statecodec.dumps(mon, level=0)
    dense = DetectorSuite("job")
    _run(dense, list(_steps(DENSE))[:45])
    assert len(blob) <= len(statecodec.dumps(dense, level=0)) + 1024  # no id-sized state
    back = statecodec.loads(blob)
    assert back.ranks.ids.tolist() == SPARSE.tolist()
    assert _run(back, frames[45:]) == _run(mon, frames[45:])
