"""A played job is dated from the stack's clock (issue 41 item 4), against a real broker.

The job starts when it is played, never before, and faster than real time its events
lead the wall clock by at most the budget it is given: the player holds each back until
then, so no service refuses it as dated beyond its clock + STEPGUARD_MAX_CLOCK_SKEW_S.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pipeline.io.kafka import create_topics, read_back
from pipeline.tools.simulator import find_scenario, start_from_now
from pipeline.tools.simulator.player import play

pytestmark = pytest.mark.integration


def test_as_fast_as_possible_the_job_starts_now_and_leads_the_clock_by_its_budget(settings):
    create_topics(settings)
    played_at = datetime.now(UTC)
    sc = find_scenario("ci_smoke")
    sc = sc.model_copy(update={"steps": 6, "job_id": "clock-1",
                               "start_time": start_from_now(sc, None)})  # fmt: skip
    lead = 1.0
    stats = play(settings, sc, speed=None, truth=False, lifecycle=False, lead_s=lead)
    assert stats.steps >= 6
    records = list(read_back(settings, "steps"))
    assert records
    for rec in records:
        msg = rec.message
        # never before the stack's clock (when it was played) ...
        assert msg.ts_start >= played_at, (msg.step, msg.ts_start, played_at)
        # ... and sent no earlier than its date less the budget (broker time, ms)
        assert rec.timestamp_ms / 1000 >= msg.ts_end.timestamp() - lead - 0.001, msg.step
    # and the job did run ahead of the wall clock, by up to its budget
    last = max(r.message.ts_end.timestamp() - r.timestamp_ms / 1000 for r in records)
    assert 0 < last <= lead + 0.001
