"""The worker's recovery watchdog: a stalled Faust recovery ends the process."""

from __future__ import annotations

import pytest

from pipeline.services.worker.streams import RecoveryWatchdog


def test_reports_only_an_unbroken_stall_over_the_timeout():
    t = [0.0]
    w = RecoveryWatchdog(10.0, clock=lambda: t[0])
    assert w.check(True) is None
    t[0] = 9.0
    assert w.check(True) is None
    t[0] = 10.5
    assert w.check(True) == 10.5
    assert w.check(False) is None  # recovery completed: the clock starts again
    t[0] = 15.0
    assert w.check(True) is None
    t[0] = 26.0
    assert w.check(True) == 11.0


def test_timeout_must_be_positive():
    with pytest.raises(ValueError, match="timeout_s"):
        RecoveryWatchdog(0)
