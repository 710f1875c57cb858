"""Signed detector settings on the control topic (pipeline/services/worker/control.py): what a
worker applies to new jobs and what it refuses (signature, replay, future, invalid)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from detectors.config import DetectorConfig
from pipeline.io.trust import SigningKey, canonical, sign, signature_problem
from pipeline.services.worker.control import DetectorControl
from schemas import ActuatorMode, ControlMessage, encode
from tests.clock import day_start
from tests.factories import OPERATOR_KEY

T0 = day_start(hour=12)
NOW = (T0 + timedelta(hours=1)).timestamp()


def change(cid: str, settings: dict, *, at: datetime = T0, key=OPERATOR_KEY) -> ControlMessage:
    msg = ControlMessage(change_id=cid, scope="detector", by="stepguard calibrate", ts=at,
                         detector_settings=settings)  # fmt: skip
    return sign(msg, key) if key is not None else msg


def control() -> DetectorControl:
    return DetectorControl(OPERATOR_KEY.verifier(), DetectorConfig(), max_clock_skew_s=300.0)


def test_a_signed_change_sets_new_jobs_thresholds_and_replaces_the_previous_one():
    ctl = control()
    assert ctl.on_message(change("c1", {"hang_factor": 6.0, "straggler_warning": 0.07}),
                          now=NOW) is None  # fmt: skip
    assert (ctl.config.hang_factor, ctl.config.straggler_warning) == (6.0, 0.07)
    # the next change is the whole set: what it does not name is back to the default
    later = change("c2", {"hang_factor": 4.0}, at=T0 + timedelta(minutes=1))
    assert ctl.on_message(later, now=NOW) is None
    assert ctl.config.hang_factor == 4.0
    assert ctl.config.straggler_warning == DetectorConfig().straggler_warning
    assert ctl.counts() == {"detector_settings_applied": 2, "refused_detector_settings": 0,
                            "unreadable_control": 0}  # fmt: skip


@pytest.mark.parametrize(
    ("msg", "reason"),
    [
        (change("c1", {"hang_factor": 9.0}, key=None), "unsigned"),
        (change("c1", {"hang_factor": 9.0}, key=SigningKey.generate(OPERATOR_KEY.key_id)),
         "bad signature"),
        (change("c1", {"hang_factor": 9.0}, key=SigningKey.generate("stranger")),
         "unknown key id"),
        (change("c1", {"hang_factor": 9.0}, at=T0 + timedelta(hours=2)), "ahead of"),
        (change("c1", {"hang_factr": 9.0}), "'hang_factr' does not exist"),
        (change("c1", {"warmup_steps": 2.5}), "'warmup_steps': expected an integer"),
        (change("c1", {"straggler_exit": 0.5}), "exit must be <="),
    ],
)  # fmt: skip
def test_unsigned_forged_future_and_invalid_changes_are_refused_and_counted(msg, reason):
    ctl = control()
    before = ctl.config
    problem = ctl.on_message(msg, now=NOW)
    assert problem is not None and reason in problem
    assert ctl.config is before
    assert (ctl.applied, ctl.refused) == (0, 1)


def test_a_replayed_or_older_change_is_not_applied_again():
    ctl = control()
    first = change("c1", {"hang_factor": 6.0})
    second = change("c2", {"hang_factor": 4.0}, at=T0 + timedelta(minutes=5))
    assert ctl.on_message(first, now=NOW) is None
    assert ctl.on_message(second, now=NOW) is None
    # the old signed change published again: its id is known and it is older
    assert "already applied" in (ctl.on_message(first, now=NOW) or "")
    # an old change under a new id (signed long ago, kept by someone) is not newer
    old = change("c0", {"hang_factor": 9.0}, at=T0 + timedelta(minutes=1))
    assert "not newer" in (ctl.on_message(old, now=NOW) or "")
    assert ctl.config.hang_factor == 4.0 and (ctl.applied, ctl.refused) == (2, 2)


def test_a_change_written_ahead_of_its_broker_time_stays_refused_when_its_time_comes():
    """Read back at a worker's start: judged against the record's broker time, so a
    change refused when it was written is not applied later."""
    ahead = change("c1", {"hang_factor": 6.0}, at=T0 + timedelta(hours=2))
    ctl = control()
    written = T0.timestamp()
    assert "ahead of" in (ctl.on_message(ahead, now=NOW + 3 * 3600, written=written) or "")
    assert ctl.applied == 0


def test_actuator_changes_are_ignored_and_bad_bytes_counted():
    ctl = control()
    actuator = sign(ControlMessage(change_id="a1", mode=ActuatorMode.AUTO, by="sre", ts=T0),
                    OPERATOR_KEY)  # fmt: skip
    assert ctl.on_message(actuator, now=NOW) is None
    assert (ctl.applied, ctl.refused) == (0, 0)
    assert ctl.on_record(b"{not json", now=NOW) is not None
    assert ctl.on_record(encode(change("c1", {"hang_factor": 5.0})), now=NOW) is None
    assert ctl.counts() == {"detector_settings_applied": 1, "refused_detector_settings": 0,
                            "unreadable_control": 1}  # fmt: skip


def test_the_change_ids_remembered_are_bounded():
    ctl = DetectorControl(OPERATOR_KEY.verifier(), DetectorConfig(), max_tracked=3)
    for i in range(10):
        ctl.on_message(change(f"c{i}", {}, at=T0 + timedelta(seconds=i)), now=NOW)
    assert ctl.applied == 10 and len(ctl._seen) == 3
    assert ctl.config == DetectorConfig()  # {}: the defaults
    with pytest.raises(ValueError, match="max_tracked"):
        DetectorControl({}, DetectorConfig(), max_tracked=0)


def test_without_operator_keys_every_change_is_refused():
    ctl = DetectorControl({}, DetectorConfig())
    assert "unknown key id" in (ctl.on_message(change("c1", {"hang_factor": 6.0}), now=NOW) or "")


def test_a_control_message_signed_before_detector_settings_existed_still_verifies():
    """The field is signed only when set, so the actuator's older signed changes (read
    back at every start) keep verifying."""
    msg = sign(ControlMessage(change_id="a1", mode=ActuatorMode.AUTO, by="sre", ts=T0),
               OPERATOR_KEY)  # fmt: skip
    assert b"detector_settings" not in canonical(msg)
    assert signature_problem(msg, OPERATOR_KEY.verifier()) is None
    assert b"detector_settings" in canonical(change("c1", {"hang_factor": 6.0}))


def test_calibrate_apply_needs_a_broker_and_the_operator_key_before_it_replays():
    from rich.console import Console

    from pipeline.io.errors import ConfigError
    from pipeline.io.settings import load_settings
    from pipeline.tools.calibrate.command import run_calibrate

    with pytest.raises(ConfigError, match="STEPGUARD_KAFKA_BOOTSTRAP"):
        run_calibrate(load_settings({}), Console(quiet=True), jobs=["a"], apply=True)
    with pytest.raises(ConfigError, match="STEPGUARD_OPERATOR_PRIVATE_KEY"):
        run_calibrate(load_settings({}, kafka_bootstrap="127.0.0.1:1"), Console(quiet=True),
                      jobs=["a"], apply=True)  # fmt: skip


def test_an_old_change_published_again_is_refused_once_newer_ones_aged_out():
    """Issue 22 item 13: a 30-day-old operator-signed change was applied once the newer
    ones had aged out of the topic (the replay defence is rebuilt only from what the
    topic still holds). A change older than the maximum age when it reached the topic
    is refused; one that was fresh when written is still applied on a later read-back."""
    old = change("c-old", {"hang_factor": 9.0}, at=T0 - timedelta(days=30))
    ctl = DetectorControl(OPERATOR_KEY.verifier(), DetectorConfig(), max_clock_skew_s=300.0,
                          max_age_s=3600.0)  # fmt: skip
    assert "old when it reached the topic" in (ctl.on_message(old, now=NOW, written=NOW) or "")
    assert ctl.applied == 0 and ctl.config.hang_factor == DetectorConfig().hang_factor
    fresh = change("c-new", {"hang_factor": 6.0}, at=T0)
    later = NOW + 30 * 86400  # read back a month later: fresh when it was written
    assert ctl.on_message(fresh, now=later, written=T0.timestamp() + 1) is None
