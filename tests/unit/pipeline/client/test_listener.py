"""The command listener's own bookkeeping, without a broker: refusals never block or
raise in the training loop, and what it remembers is bounded and expires."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from kafka.errors import KafkaTimeoutError

import pipeline.client.listener as listener_module
from pipeline.client.listener import CommandListener
from pipeline.io.settings import load_settings
from pipeline.io.trust import FinishedCommands, sign
from schemas import ActuatorMode, Command, CommandKind
from tests.clock import day_start
from tests.factories import ACTUATOR_KEY, EXECUTOR_KEY, key_settings


class _Never:
    """A send future the broker never answers."""

    def __init__(self) -> None:
        self.errbacks: list = []

    def add_errback(self, fn, *args):
        self.errbacks.append((fn, args))
        return self

    def get(self, timeout: float | None = None):
        raise KafkaTimeoutError("no ack")


class _Producer:
    def __init__(self, fail: bool) -> None:
        self.fail, self.sent = fail, []

    def send(self, topic, key=None, value=None):
        if self.fail:
            raise KafkaTimeoutError("Failed to update metadata after 60.0 secs.")
        self.sent.append(topic)
        return _Never()

    def flush(self):
        pass

    def close(self):
        pass


@pytest.fixture
def make(monkeypatch):
    def build(fail: bool) -> tuple[CommandListener, _Producer]:
        producer = _Producer(fail)
        monkeypatch.setattr(listener_module, "control_producer", lambda s: producer)
        s = load_settings({}, kafka_bootstrap="127.0.0.1:1", **key_settings())
        return CommandListener(s, "job-1"), producer

    return build


def _cmd(cid: str, key=ACTUATOR_KEY, job: str = "job-1", ttl_s: float = 60) -> Command:
    now = datetime.now(UTC)
    cmd = Command(command_id=cid, kind=CommandKind.CHECKPOINT, job_id=job, reason=("fp",),
                  mode=ActuatorMode.AUTO, issued_at=now,
                  expires_at=now + timedelta(seconds=ttl_s))  # fmt: skip
    return sign(cmd, key)


@pytest.mark.parametrize("fail", [False, True])
def test_a_refusal_is_sent_without_waiting_and_a_kafka_error_never_reaches_training(make, fail):
    """Issue 22: the listener sent refusals synchronously (waiting up to 30 s for the
    broker) and a Kafka error there stopped its thread, so the training loop's next
    poll_step_boundary raised."""
    lis, producer = make(fail)
    lis._offer(_cmd("cmd-forged", key=EXECUTOR_KEY))  # returns at once: no ack awaited
    lis._offer(_cmd("cmd-real"))  # ACCEPTED, queued
    assert [c.command_id for c in lis.poll_step_boundary(5)] == ["cmd-real"]
    assert lis.send_failures == (2 if fail else 0)
    lis.report(_cmd("cmd-real"), listener_module.CommandStatus.SUCCEEDED, "saved")
    assert lis.send_failures == (3 if fail else 1)  # the ack that never came: logged
    assert len(producer.sent) == (0 if fail else 3)


def test_finished_commands_are_bounded_and_expire():
    """Issue 22: the executors' and listener's sets of finished commands grew forever."""
    t = day_start()
    done = FinishedCommands(max_size=3)
    for i in range(5):
        done.add(f"cmd-{i}", t + timedelta(seconds=60 + i))
    assert len(done) == 3 and done.evicted == 2 and "cmd-0" not in done
    done.expire(t + timedelta(seconds=63))
    assert [c for c in ("cmd-2", "cmd-3", "cmd-4") if c in done] == ["cmd-4"]


def test_the_listener_forgets_a_command_once_it_has_expired(make):
    lis, _ = make(False)
    lis._offer(_cmd("cmd-a", ttl_s=30))
    assert "cmd-a" in lis._done
    lis._done.expire(datetime.now(UTC) + timedelta(seconds=30 + 301))  # ttl + skew
    assert "cmd-a" not in lis._done


def test_a_missing_job_key_points_to_the_key_up_wrote_not_to_a_new_one(tmp_path):
    """Sourcing only up.env (issue 41 item 7): the advice is the job-controller.env that
    `up --job` wrote, which the running actuator trusts, not `keys generate`."""
    from pipeline.io.errors import ConfigError

    s = load_settings({}, kafka_bootstrap="127.0.0.1:1", state_dir=tmp_path / "st",
                      **key_settings(("actuator",)))  # fmt: skip
    with pytest.raises(ConfigError) as info:
        CommandListener(s, "job-1")
    text = str(info.value)
    assert str(tmp_path / "st" / "job-controller.env") in text and "up.env" in text
    assert "keys generate" not in text
