"""Threat: the job controller (``CommandListener`` in the training process) published
its results unsigned, and whatever read them trusted them: a forged SUCCEEDED for a
real command id closed the episodes of the nodes a relaunch names (the worker) or made
a restarted listener skip the command as done.

Then every training process held the executor private key, so it could sign results
for any job under any executor name.

Control: the listener signs its results with its own job's controller key (never the
executors' key) and, at start, counts as done only what that key signed; the worker's
side is in ``test_worker_inputs.py``. Run on a real broker.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pipeline.client.listener import CommandListener
from pipeline.io.errors import ConfigError
from pipeline.io.kafka import control_producer, create_topics, publish, read_back, registry_of
from pipeline.io.trust import sign, signature_problem
from schemas import ActuatorMode, Command, CommandKind, CommandResult, CommandStatus
from tests.factories import (
    ACTUATOR_KEY,
    EXECUTOR_KEY,
    JOB_CONTROLLER_KEY,
    job_controller_key,
    key_settings,
)
from tests.security._helpers import impostor

pytestmark = pytest.mark.integration


def test_the_listener_signs_its_results_and_forged_ones_do_not_pre_empt_a_command(settings):
    s = settings.model_copy(update=key_settings())
    create_topics(s)
    now = datetime.now(UTC)
    cmd = sign(Command(command_id="cmd-ckpt", kind=CommandKind.CHECKPOINT, job_id="job-1",
                       reason=("fp",), mode=ActuatorMode.AUTO, issued_at=now,
                       expires_at=now + timedelta(minutes=5)), ACTUATOR_KEY)  # fmt: skip
    done = CommandResult(command_id=cmd.command_id, job_id="job-1", executor="job-controller",
                         status=CommandStatus.SUCCEEDED, ts=now)  # fmt: skip
    producer = control_producer(s)
    try:
        for forged in (
            done,
            sign(done, impostor(JOB_CONTROLLER_KEY)),
            sign(done, ACTUATOR_KEY),
            sign(done, EXECUTOR_KEY),  # the key every training process used to hold
            sign(done, job_controller_key("job-2")),  # another job's controller
        ):
            publish(producer, registry_of(s), "results", forged).get(30)
        publish(producer, registry_of(s), "commands", cmd).get(30)
    finally:
        producer.close()
    saved = []
    with CommandListener(
        s, "job-1", on_checkpoint=lambda c, step: saved.append(step) or "ok"
    ) as lis:
        assert lis.unsigned_results == 5
        applied = lis.poll_step_boundary(7, wait_s=30)
    assert [c.command_id for c in applied] == [cmd.command_id] and saved == [7]
    ours = [
        r.message
        for r in read_back(s, "results")
        if r.message.executor == "job-controller" and r.message.key_id == JOB_CONTROLLER_KEY.key_id
    ]
    real = [r for r in ours if signature_problem(r, JOB_CONTROLLER_KEY.verifier()) is None]
    assert [r.status for r in real] == [CommandStatus.ACCEPTED, CommandStatus.SUCCEEDED]
    with pytest.raises(ConfigError, match="STEPGUARD_JOB_CONTROLLER_PRIVATE_KEY"):
        CommandListener(s.model_copy(update={"job_controller_private_key": None}), "job-1")
    with pytest.raises(ConfigError, match="not job 'job-2'"):  # the key signs for job-1
        CommandListener(s, "job-2")


def test_a_refusal_never_blocks_or_raises_in_the_training_loop(monkeypatch):
    """Threat (issue 22): anyone who can write commands made the listener send a REFUSED
    result synchronously (waiting up to 30 s for the broker each time), and a Kafka
    error there stopped its thread, so the training loop's next poll_step_boundary
    raised: forged commands (or a broker fault) stopped training."""
    from kafka.errors import KafkaTimeoutError

    import pipeline.client.listener as listener_module
    from pipeline.io.settings import load_settings

    class Failing:
        def send(self, *args, **kwargs):
            raise KafkaTimeoutError("Failed to update metadata after 60.0 secs.")

        def flush(self):
            pass

        def close(self):
            pass

    monkeypatch.setattr(listener_module, "control_producer", lambda s: Failing())
    s = load_settings({}, kafka_bootstrap="127.0.0.1:1", **key_settings())
    lis = CommandListener(s, "job-1")
    now = datetime.now(UTC)
    forged = sign(Command(command_id="cmd-forged", kind=CommandKind.STOP, job_id="job-1",
                          reason=("fp",), mode=ActuatorMode.AUTO, issued_at=now,
                          expires_at=now + timedelta(minutes=5)), EXECUTOR_KEY)  # fmt: skip
    for _ in range(100):  # a flood of forgeries, each refused at once
        lis._offer(forged)
    assert lis.poll_step_boundary(1) == [] and lis.send_failures == 100
