"""The core's configuration groups: the flat keywords of before land in their group."""

from __future__ import annotations

import pytest

from pipeline.services.worker.options import Capacity, SnapshotPolicy, Timing
from pipeline.services.worker.state import CoreTopics, WorkerDetection

TOPICS = CoreTopics("s", "h", "j")


def test_a_flat_keyword_sets_its_field_in_the_group_given():
    core = WorkerDetection(
        TOPICS, 2, capacity=Capacity(max_jobs=3, max_ended=9), max_jobs=5, event_rate=2.0
    )
    config = core.config
    assert (config.capacity.max_jobs, config.capacity.max_ended) == (5, 9)
    assert config.timing == Timing(event_rate=2.0)
    assert config.snapshots == SnapshotPolicy()
    assert config.trust.command_keys == {}  # no key: no command obeyed


def test_an_unknown_keyword_is_named():
    with pytest.raises(TypeError, match="snapshot_stepz"):
        WorkerDetection(TOPICS, 2, snapshot_stepz=3)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("group", "kw"),
    [(SnapshotPolicy, {"snapshot_interval_s": 0}), (Capacity, {"job_idle_ttl_s": 0}),
     (Timing, {"event_rate": 2000})],
)  # fmt: skip
def test_each_group_checks_its_fields(group, kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        group(**kw)
