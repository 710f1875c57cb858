"""The actuator, its executors and the command listener against a real broker."""

from __future__ import annotations

import getpass
import json
import logging
import os
import re
import stat
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.client.listener import CommandListener
from pipeline.io.kafka import (
    assigned_consumer,
    client_config,
    control_producer,
    create_topics,
    publish,
    read_back,
    registry_of,
)
from pipeline.io.trust import SigningKey, check_command, sign, signature_problem
from pipeline.services.actuator.executors import DryRunExecutor, ExecutorRunner, WebhookExecutor
from pipeline.services.actuator.service import Actuator
from pipeline.services.actuator.slurm import SlurmExecutor
from schemas import (
    TOPICS,
    ActionRecord,
    ActionState,
    ActuatorMode,
    Alert,
    AlertKind,
    AlertState,
    Command,
    CommandKind,
    CommandResult,
    CommandStatus,
    ControlMessage,
    Evidence,
    Grade,
    RecommendedAction,
    decode,
)
from tests.factories import (
    ACTUATOR_KEY,
    EXECUTOR_KEY,
    OPERATOR_KEY,
    WORKER_KEY,
    key_env,
    key_settings,
    test_key,
)

pytestmark = pytest.mark.integration

#: an attacker's key under the actuator's key id
FORGER = SigningKey(ACTUATOR_KEY.key_id, test_key("attacker").private)
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def act_settings(settings):
    s = settings.model_copy(
        update=key_settings() | {"actuator_mode": "auto",
                "spare_nodes": "spare-0,spare-1,spare-2", "guard_max_isolation_pct": 100.0}
    )  # fmt: skip
    create_topics(s)
    return s


def env_of(settings, **extra) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPGUARD_")}
    env |= {
        "STEPGUARD_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
        "STEPGUARD_BROKER_FLAVOR": settings.broker_flavor,
        "STEPGUARD_TOPIC_PREFIX": settings.topic_prefix,
        "STEPGUARD_CONSUMER_GROUP": settings.consumer_group,
        "STEPGUARD_ACTUATOR_MODE": settings.actuator_mode,
        "STEPGUARD_SPARE_NODES": settings.spare_nodes,
        "STEPGUARD_GUARD_MAX_ISOLATION_PCT": str(settings.guard_max_isolation_pct),
        # no fixed Prometheus port: another service on this host may hold the default
        "STEPGUARD_ACTUATOR_METRICS_PORT": "0",
        "STEPGUARD_EXECUTOR_METRICS_PORT": "0",
        "STEPGUARD_LISTENER_METRICS_PORT": "0",
    }
    return env | key_env() | extra


def alert(fp="fp-node3-0001", node="node-3", seq=0, action=RecommendedAction.ISOLATE) -> Alert:
    now = datetime.now(UTC)
    return Alert(
        fingerprint=fp, seq=seq, kind=AlertKind.HARDWARE, grade=Grade.CRITICAL,
        state=AlertState.FIRING, job_id="job-1", node=node, step=100 + seq, started_at=now,
        ts=now, evidence=Evidence(metric="ecc_uncorrected", value=1, deviation=1),
        recommended_action=action, summary=f"uncorrectable ECC on {node}",
        node_in_steps=True,
    )  # fmt: skip


def send(settings, logical, *messages, signed=True):
    """Publish and wait for the acks; unsigned alerts get the worker's signature unless
    ``signed`` is false."""
    if signed:
        messages = tuple(
            sign(m, WORKER_KEY) if isinstance(m, Alert) and m.signature is None else m
            for m in messages
        )
    producer = control_producer(settings)
    try:
        reg = registry_of(settings)
        return [publish(producer, reg, logical, m).get(timeout=30) for m in messages]
    finally:
        producer.close()


def poll_until(actuator: Actuator, consumed: int, max_polls: int = 100) -> None:
    """Poll the actuator until it consumed ``consumed`` inputs in total (bounded)."""
    for _ in range(max_polls):
        if actuator.stats.consumed >= consumed:
            return
        actuator.poll_once(timeout_ms=200)
    raise AssertionError(f"actuator consumed {actuator.stats.consumed} < {consumed}")


def invoke_while_polling(actuator: Actuator, args, env, max_polls=300):
    """Run a ``stepguard`` command (it waits for the actuator's answer) while the
    actuator polls in this thread; the command's result."""
    done: list = []
    cmd = threading.Thread(target=lambda: done.append(CliRunner().invoke(app, args, env=env)))
    cmd.start()
    for _ in range(max_polls):
        if not cmd.is_alive():
            break
        actuator.poll_once(timeout_ms=200)
    cmd.join(timeout=60)
    assert done, f"stepguard {' '.join(args)} did not end"
    return done[0]


def topic(settings, logical):
    return [r.message for r in read_back(settings, logical)]


def poll_until_topic(actuator: Actuator, settings, logical, done, max_polls=100):
    """Poll the actuator until ``done(records of logical)`` (bounded); the records."""
    for _ in range(max_polls):
        got = topic(settings, logical)
        if done(got):
            return got
        actuator.poll_once(timeout_ms=200)
    raise AssertionError(f"gave up waiting on {logical}: {topic(settings, logical)}")


def wait_topic(settings, logical, done, max_polls=300):
    """Records of a topic from the beginning, polled until ``done(records)`` (bounded)."""
    consumer = assigned_consumer(settings, [registry_of(settings).name(logical)], None)
    model, got = TOPICS[logical].model, []
    try:
        consumer.seek_to_beginning(*consumer.assignment())
        for _ in range(max_polls):
            for records in consumer.poll(timeout_ms=200).values():
                got += [decode(model, rec.value) for rec in records]
            if done(got):
                return got
    finally:
        consumer.close()
    raise AssertionError(f"gave up waiting on {logical}: {got}")


def signed_command(settings, kind, cid, *, ttl=300.0, targets=(), key=ACTUATOR_KEY) -> Command:
    now = datetime.now(UTC)
    cmd = Command(
        command_id=cid,
        kind=kind,
        job_id="job-1",
        targets=targets,
        reason=("fp",),
        mode=ActuatorMode.AUTO,
        issued_at=now,
        expires_at=now + timedelta(seconds=ttl),
    )
    return sign(cmd, key)


# -- the actuator ------------------------------------------------------------------------
def test_duplicate_decisions_produce_one_command_each_signed(act_settings):
    act = Actuator(act_settings)
    try:
        a = alert()
        send(act_settings, "decisions", a, a, a, a.model_copy(update={"seq": 1}))
        poll_until(act, 4)
    finally:
        act.close()
    cmds = topic(act_settings, "commands")
    assert [(c.kind, c.targets, c.replacements) for c in cmds] == [
        (CommandKind.CHECKPOINT, (), ()),
        (CommandKind.ISOLATE, ("node-3",), ("spare-0",)),
        (CommandKind.RESTART, ("node-3",), ("spare-0",)),
    ]
    now = datetime.now(UTC)
    assert all(check_command(c, ACTUATOR_KEY.verifier(), now) is None for c in cmds)


def test_killed_between_publish_and_commit_neither_duplicates_nor_loses(act_settings):
    proc = subprocess.Popen(
        [sys.executable, "-c", "from pipeline.cli.app import main; main()", "actuator",
         "--crash-after-publish"],
        env=env_of(act_settings), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    [meta] = send(act_settings, "decisions", alert())
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == -9, stderr.decode()[-2000:]
    assert len(topic(act_settings, "commands")) == 3  # acknowledged before the kill ...
    tp = TopicPartition(meta.topic, meta.partition)
    probe = KafkaConsumer(group_id=f"{act_settings.consumer_group}.actuator",
                          **client_config(act_settings))  # fmt: skip
    try:
        committed = probe.committed(tp)
    finally:
        probe.close()
    assert committed is None or committed <= meta.offset  # ... and never committed

    act = Actuator(act_settings)  # a restart replays the decision
    try:
        assert len(act.policy.issued) == 3
        send(act_settings, "decisions", alert("fp-node5-0001", node="node-5"))
        poll_until(act, 2)
    finally:
        act.close()
    cmds = topic(act_settings, "commands")
    ids = [c.command_id for c in cmds]
    assert len(ids) == 6 == len(set(ids))
    assert [c.replacements for c in cmds if c.kind is CommandKind.ISOLATE] == [
        ("spare-0",), ("spare-1",)
    ]  # fmt: skip


def test_circuit_breaker_refuses_the_isolation_over_its_limit(act_settings):
    s = act_settings.model_copy(update={"guard_max_isolations": 1})
    act = Actuator(s)
    try:
        send(s, "decisions", alert(), alert("fp-node5-0001", node="node-5"))
        poll_until(act, 2)
        poll_until(act, 3)  # its own guardrail alert comes back and is ignored
    finally:
        act.close()
    cmds = topic(s, "commands")
    assert {c.targets for c in cmds if c.kind is CommandKind.ISOLATE} == {("node-3",)}
    guard = [a for a in topic(s, "decisions") if a.kind is AlertKind.GUARDRAIL]
    assert [(g.grade, g.state, g.node) for g in guard] == [
        (Grade.CRITICAL, AlertState.FIRING, "node-5")
    ]
    [refused] = topic(s, "actions")
    assert refused.state is ActionState.REFUSED and "circuit breaker" in refused.detail


def test_approval_flow_end_to_end_with_pending_rebuilt_after_restart(act_settings):
    s = act_settings.model_copy(update={"actuator_mode": "approve"})
    cli, env = CliRunner(), env_of(s)
    act = Actuator(s)
    try:
        send(s, "decisions", alert(), alert("fp-node5-0001", node="node-5"))
        poll_until(act, 2)
    finally:
        act.close()
    notices = topic(s, "commands")  # a hold is announced (the webhook posts it) ...
    assert [(c.kind, c.summary.split(":")[0]) for c in notices] == [
        (CommandKind.NOTIFY, "waiting for approval")
    ] * 2
    announced = [a for a in topic(s, "decisions") if a.kind is AlertKind.GUARDRAIL]
    assert {(a.node, a.state) for a in announced} == {  # ... and on the decisions topic
        ("node-3", AlertState.FIRING), ("node-5", AlertState.FIRING)
    }  # fmt: skip
    listed = cli.invoke(app, ["pending"], env=env)
    assert listed.exit_code == 0, listed.output
    held = {r.alert.node: r.action_id for r in topic(s, "actions")}
    assert set(held) == {"node-3", "node-5"}
    assert held["node-3"] in listed.output and "2 action(s)" in listed.output

    act = Actuator(s)  # restarted: the held actions come back from the actions topic
    try:
        assert {r.action_id for r in act.policy.held} == set(held.values())
        ok = invoke_while_polling(act, ["approve", held["node-3"], "--by", "sre"], env)
        no = invoke_while_polling(act, ["reject", held["node-5"], "--reason", "known slow"], env)
        assert ok.exit_code == 0 and no.exit_code == 0, ok.output + no.output
        # resumes after the committed decisions: the two approvals (and the notices)
        poll_until_topic(act, s, "actions", lambda got: len(got) >= 4)
    finally:
        act.close()
    cmds = topic(s, "commands")[2:]
    # each command tells what the actuator did: the ids it issued, and who decided
    issued = ", ".join(c.command_id for c in cmds)
    assert f"approved {held['node-3']} by sre: issued {issued}" in " ".join(ok.output.split())
    assert f"rejected {held['node-5']} by {getpass.getuser()}" in no.output
    assert [(c.kind, c.mode) for c in cmds] == [
        (CommandKind.CHECKPOINT, ActuatorMode.APPROVE),
        (CommandKind.ISOLATE, ActuatorMode.APPROVE),
        (CommandKind.RESTART, ActuatorMode.APPROVE),
    ]
    states = [(r.alert.node, r.state, r.by) for r in topic(s, "actions")[2:]]
    assert states == [("node-3", ActionState.APPROVED, "sre"),
                      ("node-5", ActionState.REJECTED, getpass.getuser())]  # fmt: skip
    after = cli.invoke(app, ["pending"], env=env)
    assert "0 action(s)" in after.output


def test_mode_changes_at_runtime_and_forged_control_is_ignored(act_settings):
    s = act_settings.model_copy(update={"actuator_mode": "observe"})
    act = Actuator(s)
    try:
        send(s, "decisions", alert())
        poll_until(act, 1)
        assert topic(s, "commands") == []
        forged = ControlMessage(change_id="evil", mode=ActuatorMode.AUTO, by="x",
                                ts=datetime.now(UTC))  # fmt: skip
        send(s, "control", forged)
        res = invoke_while_polling(act, ["control", "--mode", "auto", "--reason", "go"], env_of(s))
        assert res.exit_code == 0, res.output
        assert "applied by the actuator: actuator mode auto" in " ".join(res.output.split())
        poll_until(act, 3)
        assert act.policy.params.mode is ActuatorMode.AUTO
        send(s, "decisions", alert(seq=1))
        poll_until(act, 4)
    finally:
        act.close()
    [observed] = topic(s, "actions")
    assert observed.state is ActionState.OBSERVED
    assert len(topic(s, "commands")) == 3
    changes = topic(s, "control")  # every change is archived, the forged one too
    assert [(c.by, c.signature is not None) for c in changes] == [
        ("x", False), (getpass.getuser(), True)
    ]  # fmt: skip
    # a restarted actuator comes back in the mode the control topic says
    act = Actuator(s)
    try:
        assert act.policy.params.mode is ActuatorMode.AUTO
    finally:
        act.close()


# -- executors -------------------------------------------------------------------------
def test_slurm_runner_refuses_malicious_names_and_forgeries(act_settings, tmp_path):
    log = tmp_path / "argv.jsonl"
    exe = tmp_path / "scontrol"
    record = f"open({str(log)!r}, 'a').write(json.dumps(sys.argv[1:]) + '\\n')\n"
    # `show node X`: idle until it was drained, then drained by stepguard
    show = (
        "if sys.argv[1] == 'show':\n"
        f"    drained = 'State=DRAIN' in open({str(log)!r}).read()\n"
        "    state = 'IDLE+DRAIN\\n   Reason=stepguard: x' if drained else 'IDLE'\n"
        "    print(f'NodeName={sys.argv[3]}\\n   State={state}')\n"
    )
    exe.write_text("#!/usr/bin/env python3\nimport json, sys\n" + record + show)
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    evil = signed_command(
        act_settings, CommandKind.ISOLATE, "cmd-evil", targets=("node1; rm -rf /",)
    )
    forged = signed_command(act_settings, CommandKind.ISOLATE, "cmd-forged", targets=("node-9",),
                            key=FORGER)  # fmt: skip
    good = signed_command(act_settings, CommandKind.ISOLATE, "cmd-good", targets=("node-3",))
    send(act_settings, "commands", evil, forged, good)
    runner = ExecutorRunner(act_settings, SlurmExecutor(str(exe)))
    try:
        for _ in range(50):
            runner.poll_once(timeout_ms=200)
            if len(runner.done) >= 2:
                break
    finally:
        runner.close()
    results = {r.command_id: r for r in topic(act_settings, "results")}
    assert results["cmd-evil"].status is CommandStatus.REFUSED
    assert "invalid node name" in results["cmd-evil"].detail
    assert (results["cmd-forged"].status, results["cmd-forged"].detail) == (
        CommandStatus.REFUSED, "bad signature",
    )  # fmt: skip
    assert results["cmd-good"].status is CommandStatus.SUCCEEDED
    argv = [json.loads(x) for x in log.read_text().splitlines()]
    writes = [a[:3] for a in argv if a[0] != "show"]  # it reads the node before and after
    assert writes == [["update", "NodeName=node-3", "State=DRAIN"]]


# -- the job controller (CommandListener) ----------------------------------------------------
def test_listener_refuses_forged_unsigned_and_expired_commands(act_settings):
    forged = signed_command(act_settings, CommandKind.STOP, "cmd-forged",
                            key=FORGER)  # fmt: skip
    unsigned = forged.model_copy(update={"command_id": "cmd-unsigned", "signature": None,
                                         "key_id": None})  # fmt: skip
    expired = signed_command(act_settings, CommandKind.STOP, "cmd-expired", ttl=0.001)
    good = signed_command(act_settings, CommandKind.CHECKPOINT, "cmd-good")
    send(act_settings, "commands", forged, unsigned, expired, good)
    saved = []
    listener = CommandListener(
        act_settings,
        "job-1",
        on_checkpoint=lambda c, step: saved.append(step) or "saved",
        on_stop=lambda c, step: pytest.fail("STOP must be refused"),
    )
    with listener:
        applied = listener.poll_step_boundary(7, wait_s=30)
    assert [c.command_id for c in applied] == ["cmd-good"] and saved == [7]
    wait_topic(act_settings, "results", lambda got: len(got) >= 5)
    results = {(r.command_id, r.status): r.detail for r in topic(act_settings, "results")}
    assert results[("cmd-forged", CommandStatus.REFUSED)] == "bad signature"
    assert results[("cmd-unsigned", CommandStatus.REFUSED)] == "unsigned"
    assert results[("cmd-expired", CommandStatus.REFUSED)].startswith("expired")
    assert results[("cmd-good", CommandStatus.SUCCEEDED)] == "saved"


TRAINER = """
import json, os, sys, time
import numpy as np
from pipeline.client.listener import CommandListener
from pipeline.io.settings import load_settings

ckpt, job, max_steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(0)
X = rng.normal(size=(256, 4))
y = X @ np.array([1.0, -2.0, 0.5, 3.0])
state = {"w": np.zeros(4), "step": 0, "restart": False}
if os.path.exists(ckpt):
    with np.load(ckpt) as saved:
        state["w"], state["step"] = saved["w"], int(saved["step"])
    print(json.dumps({"resumed": state["step"], "w": state["w"].tolist()}), flush=True)

def loss():
    return float(np.mean((X @ state["w"] - y) ** 2))

def on_checkpoint(cmd, step):
    tmp = ckpt + ".tmp.npz"
    np.savez(tmp, w=state["w"], step=step)
    os.replace(tmp, ckpt)
    return json.dumps({"step": step, "w": state["w"].tolist(), "loss": loss()})

def on_restart(cmd, step):
    state["restart"] = True
    return "restarting from the last checkpoint"

listener = CommandListener(load_settings(), job, on_checkpoint=on_checkpoint,
                           on_restart=on_restart).start()
print(json.dumps({"ready": state["step"], "loss": loss()}), flush=True)
while state["step"] < max_steps:
    grad = 2 * X.T @ (X @ state["w"] - y) / len(X)
    state["w"] = state["w"] - 0.001 * grad
    state["step"] += 1
    listener.poll_step_boundary(state["step"])
    if state["restart"]:
        print(json.dumps({"restart_at": state["step"]}), flush=True)
        listener.close()
        sys.exit(3)
    time.sleep(0.001)
listener.close()
print(json.dumps({"done": state["step"], "loss": loss()}), flush=True)
"""


def _lines(proc):
    for line in proc.stdout:
        yield json.loads(line)


def test_training_process_checkpoints_and_resumes_after_restart(act_settings, tmp_path):
    script, ckpt = tmp_path / "train.py", tmp_path / "ckpt.npz"
    script.write_text(TRAINER)
    env = env_of(act_settings)

    def launch(max_steps):
        return subprocess.Popen([sys.executable, str(script), str(ckpt), "job-1", str(max_steps)],
                                env=env, cwd=REPO, stdout=subprocess.PIPE, text=True)  # fmt: skip

    first = launch(1_000_000)
    try:
        out = _lines(first)
        start = next(out)
        assert start["ready"] == 0
        send(
            act_settings,
            "commands",
            signed_command(act_settings, CommandKind.CHECKPOINT, "cmd-ckpt"),
        )
        [saved] = [
            r for r in wait_topic(act_settings, "results", lambda got: any(
                r.command_id == "cmd-ckpt" and r.status is CommandStatus.SUCCEEDED for r in got))
            if r.command_id == "cmd-ckpt" and r.status is CommandStatus.SUCCEEDED
        ]  # fmt: skip
        at = json.loads(saved.detail)
        assert at["step"] > 0 and at["loss"] < start["loss"]
        send(
            act_settings,
            "commands",
            signed_command(act_settings, CommandKind.RESTART, "cmd-restart"),
        )
        restart_at = next(out)["restart_at"]
        assert first.wait(timeout=60) == 3
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
        first.stdout.close()
    assert restart_at >= at["step"]

    with launch(at["step"] + 50) as second:  # the launcher restarts the job
        lines = list(_lines(second))
        assert second.wait(timeout=60) == 0
    resumed, ready, done = lines
    # resumed exactly from the checkpoint: lost only the steps taken since it was saved
    assert resumed == {"resumed": at["step"], "w": at["w"]}
    assert ready["ready"] == at["step"] and ready["loss"] == pytest.approx(at["loss"])
    assert done["done"] == at["step"] + 50 and done["loss"] < at["loss"]  # neither restarted
    # nor checkpointed again: those commands were already carried out
    finals = [r for r in topic(act_settings, "results") if r.status is CommandStatus.SUCCEEDED]
    assert sorted(r.command_id for r in finals) == ["cmd-ckpt", "cmd-restart"]


# -- start-up rebuild, held actions expiring, approve/reject of what is not held ----------
def test_rebuild_reads_to_the_end_past_the_old_poll_cap_and_logs_progress(act_settings, caplog):
    s = act_settings.model_copy(update={"actuator_max_tracked": 20_000})
    n, now = 10_050, datetime.now(UTC)
    notify = Command(command_id="cmd-00000000", kind=CommandKind.NOTIFY, job_id="job-0",
                     reason=("fp",), mode=ActuatorMode.AUTO, issued_at=now,
                     expires_at=now + timedelta(seconds=300))  # fmt: skip
    copies = [{"command_id": f"cmd-{i:08d}", "job_id": f"job-{i % 7}"} for i in range(n)]
    producer, reg = control_producer(s), registry_of(s)
    try:
        signed = [sign(notify.model_copy(update=c), ACTUATOR_KEY) for c in copies]
        futures = [publish(producer, reg, "commands", c) for c in signed]
        for fut in futures:
            fut.get(timeout=60)
    finally:
        producer.close()
    with caplog.at_level(logging.INFO, logger="pipeline.io.kafka"):
        act = Actuator(s, rebuild_batch=1)  # one record per poll: > 10,000 polls
        act.close()
    assert act.rebuilt["commands"] == n and len(act.policy.issued) == n
    [done] = [r.getMessage() for r in caplog.records if r.getMessage().startswith(
        f"read {registry_of(s).name('commands')} back")]  # fmt: skip
    assert f"{n}/{n} records" in done
    assert int(re.search(r"in (\d+) polls", done)[1]) > 10_000


def test_a_hold_expires_in_the_running_actuator_and_is_no_longer_approvable(act_settings):
    s = act_settings.model_copy(update={"actuator_mode": "approve", "hold_ttl_s": 600.0})
    clock = [datetime.now(UTC)]
    act = Actuator(s, clock=lambda: clock[0])
    try:
        send(s, "decisions", alert())
        [held] = poll_until_topic(act, s, "actions", lambda got: len(got) >= 1)
        clock[0] += timedelta(seconds=601)  # nothing arrives; time passes
        actions = poll_until_topic(act, s, "actions", lambda got: len(got) >= 2)
    finally:
        act.close()
    assert held.state is ActionState.HELD
    assert actions[1].action_id == held.action_id
    assert actions[1].state is ActionState.CANCELLED and actions[1].detail.startswith("expired")
    notices = [a for a in topic(s, "decisions") if a.kind is AlertKind.GUARDRAIL]
    assert [(a.state, a.node) for a in notices] == [
        (AlertState.FIRING, "node-3"), (AlertState.RESOLVED, "node-3")
    ]  # fmt: skip
    res = CliRunner().invoke(app, ["approve", held.action_id], env=env_of(s))
    assert res.exit_code == 1 and "expired" in res.output, res.output
    assert topic(s, "approvals") == []


def test_approve_and_reject_refuse_unknown_expired_and_decided_actions(act_settings):
    s, now = act_settings, datetime.now(UTC)

    def record(aid, state, *, ts=now, detail="", by=None) -> ActionRecord:
        return ActionRecord(action_id=aid, state=state, job_id="job-1",
                            mode=ActuatorMode.APPROVE, reason=("fp-node3-0001",),
                            summary="replace node-3", detail=detail, by=by, ts=ts)  # fmt: skip

    send(
        s, "actions",
        record("act-fresh", ActionState.HELD),
        record("act-decided", ActionState.HELD),
        record("act-decided", ActionState.REJECTED, detail="known slow", by="sre"),
        record("act-expired", ActionState.HELD),
        record("act-expired", ActionState.CANCELLED, detail="expired: not decided in 1800s"),
        record("act-overdue", ActionState.HELD, ts=now - timedelta(hours=2)),  # actuator down
    )  # fmt: skip
    refusals = {
        ("approve", "act-unknown"): "no action act-unknown",
        ("reject", "act-unknown"): "no action act-unknown",
        ("approve", "act-decided"): "already rejected by sre",
        ("reject", "act-decided"): "already rejected by sre",
        ("approve", "act-expired"): "expired",
        ("reject", "act-expired"): "expired",
        ("approve", "act-overdue"): "expired",
    }
    cli = CliRunner()
    for (verb, aid), why in refusals.items():
        extra = ["--reason", "no"] if verb == "reject" else []
        res = cli.invoke(app, [verb, aid, *extra], env=env_of(s))
        said = " ".join(res.output.split())
        assert res.exit_code == 1 and why in said and "nothing was sent" in said, (verb, said)
    # no actuator runs here: sent, no answer, exit 3 (it may still take effect)
    sent = cli.invoke(app, ["approve", "act-fresh", "--timeout", "1"], env=env_of(s))
    said = " ".join(sent.output.split())
    assert sent.exit_code == 3 and "no answer from the actuator within 1s" in said, said
    assert [a.action_id for a in topic(s, "approvals")] == ["act-fresh"]
    listed = " ".join(cli.invoke(app, ["pending", "--all"], env=env_of(s)).output.split())
    assert "expired" in listed


# -- trust: only what its writer signed is acted on -------------------------------------
def test_an_unsigned_or_wrongly_signed_alert_is_not_acted_on(act_settings):
    act = Actuator(act_settings)
    try:
        unsigned = alert("fp-node5-0001", node="node-5")
        not_a_worker = sign(alert("fp-node6-0001", node="node-6"), ACTUATOR_KEY)
        send(act_settings, "decisions", unsigned, not_a_worker, signed=False)
        poll_until(act, 2)
        assert (act.stats.unsigned_alerts, act.stats.commands) == (2, 0)
        send(act_settings, "decisions", alert())  # signed by the worker's key
        poll_until(act, 3)
    finally:
        act.close()
    cmds = topic(act_settings, "commands")
    assert {t for c in cmds for t in c.targets} == {"node-3"} and len(cmds) == 3


def test_a_garbage_signature_is_a_dead_letter_and_executor_and_listener_go_on(act_settings):
    """A non-ASCII signature made hmac.compare_digest raise: executors crash-looped and
    the listener's thread died. Now it does not decode (the schema's pattern): the
    executor dead-letters it, the listener skips it, and both handle the next one."""
    good = signed_command(act_settings, CommandKind.CHECKPOINT, "cmd-good")
    garbage = good.model_copy(update={"command_id": "cmd-garbage", "signature": "é" * 128})
    short = good.model_copy(update={"command_id": "cmd-short", "signature": "ab" * 32})
    send(act_settings, "commands", garbage, short)
    runner = ExecutorRunner(act_settings, DryRunExecutor())
    saved = []
    listener = CommandListener(
        act_settings, "job-1", on_checkpoint=lambda c, step: saved.append(step) or "saved"
    )
    try:
        with listener:
            for _ in range(5):  # the bad ones: dead letters, no exception
                runner.poll_once(timeout_ms=200)
            send(act_settings, "commands", good)
            applied = listener.poll_step_boundary(3, wait_s=30)
            for _ in range(50):
                runner.poll_once(timeout_ms=200)
                if "cmd-good" in runner.done:
                    break
    finally:
        runner.close()
    assert [c.command_id for c in applied] == ["cmd-good"] and saved == [3]
    letters = wait_topic(act_settings, "deadletter", lambda got: len(got) >= 2)
    assert len(letters) == 2 and all("signature" in d.error for d in letters)
    results = {(r.command_id, r.executor, r.status) for r in topic(act_settings, "results")}
    assert ("cmd-good", "dry-run", CommandStatus.SUCCEEDED) in results
    assert ("cmd-good", "job-controller", CommandStatus.SUCCEEDED) in results
    assert not {cid for cid, _, _ in results} & {"cmd-garbage", "cmd-short"}


def test_a_replayed_control_message_is_not_applied_again(act_settings):
    s = act_settings.model_copy(update={"actuator_mode": "observe"})
    act = Actuator(s)
    try:
        for args, n in ((["--mode", "auto", "--reset-breaker"], 1), (["--mode", "observe"], 2)):
            res = invoke_while_polling(act, ["control", *args], env_of(s))
            assert res.exit_code == 0, res.output
            poll_until(act, n)
        assert act.policy.params.mode is ActuatorMode.OBSERVE
        auto = topic(s, "control")[0]
        assert auto.mode is ActuatorMode.AUTO and auto.signature is not None
        send(s, "control", auto)  # an attacker re-publishes the old signed change
        poll_until(act, 3)
        assert act.policy.params.mode is ActuatorMode.OBSERVE and act.stats.refused == 1
    finally:
        act.close()
    # a restarted actuator reads the control topic back: the replay is skipped there too
    act = Actuator(s)
    try:
        assert act.policy.params.mode is ActuatorMode.OBSERVE and act.stats.refused == 1
    finally:
        act.close()


# -- the rebuild verifies what it reads back (issue 14 item 5) ------------------------------
def test_a_reset_breaker_sent_before_a_trip_does_not_close_it_at_restart(act_settings):
    s = act_settings.model_copy(update={"guard_max_isolations": 1})
    act = Actuator(s)
    try:
        res = invoke_while_polling(act, ["control", "--reset-breaker"], env_of(s))
        assert res.exit_code == 0, res.output
        poll_until(act, 1)
        send(s, "decisions", alert(), alert("fp-node5-0001", node="node-5"))
        poll_until(act, 3)
        assert act.policy.breaker_open("job-1")
    finally:
        act.close()
    act = Actuator(s)  # yesterday's reset is not replayed over today's trip
    try:
        assert act.policy.breaker_open("job-1")
        res = invoke_while_polling(act, ["control", "--reset-breaker"], env_of(s))
        assert res.exit_code == 0, res.output
        poll_until_topic(
            act,
            s,
            "decisions",
            lambda got: any(
                a.kind is AlertKind.GUARDRAIL and a.state is AlertState.RESOLVED for a in got
            ),
        )
        assert not act.policy.breaker_open("job-1")
    finally:
        act.close()
    act = Actuator(s)  # a reset sent after the trip still holds after a restart
    try:
        assert not act.policy.breaker_open("job-1")
    finally:
        act.close()
    assert all(r.signature is not None for r in topic(s, "actions"))


def test_the_rebuild_ignores_unsigned_and_forged_action_records(act_settings):
    now = datetime.now(UTC)
    held = ActionRecord(
        action_id="act-forged-hold", state=ActionState.HELD, job_id="job-1",
        mode=ActuatorMode.APPROVE, reason=("fp-node3-0001",), alert=alert(), ts=now,
    )  # fmt: skip
    send(act_settings, "actions", held, sign(held, FORGER))
    act = Actuator(act_settings)
    try:
        assert act.policy.held == [] and act.stats.unsigned_records == 2
        assert act.rebuilt["actions"] == 2
    finally:
        act.close()


def test_an_executor_ignores_forged_results_and_signs_its_own(act_settings):
    cmd = signed_command(act_settings, CommandKind.CHECKPOINT, "cmd-pre-empted")
    forged = CommandResult(
        command_id=cmd.command_id, job_id="job-1", executor="dry-run",
        status=CommandStatus.SUCCEEDED, ts=datetime.now(UTC),
    )  # fmt: skip
    impostor = SigningKey(EXECUTOR_KEY.key_id, test_key("attacker").private)
    send(act_settings, "results", forged, sign(forged, impostor))
    send(act_settings, "commands", cmd)
    runner = ExecutorRunner(act_settings, DryRunExecutor())
    try:
        assert cmd.command_id not in runner.done and runner.unsigned_results == 2
        for _ in range(50):
            runner.poll_once(timeout_ms=200)
            if cmd.command_id in runner.done:
                break
    finally:
        runner.close()
    mine = [r for r in topic(act_settings, "results") if r.key_id == EXECUTOR_KEY.key_id]
    ours = [r for r in mine if signature_problem(r, EXECUTOR_KEY.verifier()) is None]
    assert [(r.command_id, r.status) for r in ours] == [(cmd.command_id, CommandStatus.SUCCEEDED)]
    runner = ExecutorRunner(act_settings, DryRunExecutor())  # its own result counts
    try:
        assert cmd.command_id in runner.done and runner.unsigned_results == 2
    finally:
        runner.close()


def test_an_executor_refuses_a_target_outside_the_jobs_known_nodes(act_settings):
    now = datetime.now(UTC)
    base = dict(kind=CommandKind.ISOLATE, job_id="job-1", reason=("fp",), mode=ActuatorMode.AUTO,
                issued_at=now, expires_at=now + timedelta(minutes=5))  # fmt: skip
    outside = sign(Command(command_id="cmd-outside", targets=("prod-7",),
                           job_nodes=("node-1", "node-3"), **base), ACTUATOR_KEY)  # fmt: skip
    inside = sign(Command(command_id="cmd-inside", targets=("node-3",),
                          job_nodes=("node-1", "node-3"), **base), ACTUATOR_KEY)  # fmt: skip
    send(act_settings, "commands", outside, inside)
    runner = ExecutorRunner(act_settings, DryRunExecutor())
    try:
        for _ in range(50):
            runner.poll_once(timeout_ms=200)
            if "cmd-inside" in runner.done:
                break
    finally:
        runner.close()
    results = {r.command_id: r for r in topic(act_settings, "results")}
    assert results["cmd-outside"].status is CommandStatus.REFUSED
    assert "not nodes of job job-1" in results["cmd-outside"].detail
    assert results["cmd-inside"].status is CommandStatus.SUCCEEDED


def test_a_webhook_receiver_answering_garbage_is_a_failed_result_and_the_executor_goes_on(
    act_settings,
):
    """Issue 22 item 10: whatever the receiver makes the HTTP client raise
    (BadStatusLine here) is a FAILED result with the error, and the consumer goes on."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 31511))
    server.settimeout(30)

    def serve():
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"garbage\r\n\r\n")

    threading.Thread(target=serve, daemon=True).start()
    hook = WebhookExecutor(["http://127.0.0.1:31511/hook"], timeout_s=5, retries=0)
    first = signed_command(act_settings, CommandKind.CHECKPOINT, "cmd-hook-1")
    second = signed_command(act_settings, CommandKind.CHECKPOINT, "cmd-hook-2")
    send(act_settings, "commands", first, second)
    runner = ExecutorRunner(act_settings, hook)
    try:
        for _ in range(50):
            runner.poll_once(timeout_ms=200)
            if "cmd-hook-2" in runner.done:
                break
    finally:
        runner.close()
        server.close()
    got = wait_topic(act_settings, "results", lambda rs: len(rs) >= 2)
    assert {(r.command_id, r.status) for r in got} == {
        ("cmd-hook-1", CommandStatus.FAILED),
        ("cmd-hook-2", CommandStatus.FAILED),
    }
    assert all("BadStatusLine" in r.detail for r in got)


# -- issue 22 items 9 and 13 -----------------------------------------------------------------
def test_an_old_signed_control_change_is_refused_even_with_no_newer_one_on_the_topic(
    act_settings,
):
    """Issue 22 item 13: a 30-day-old operator-signed change was applied once the newer
    ones had aged out of the topic (here none is left): changes have a maximum age."""
    s = act_settings.model_copy(update={"actuator_mode": "observe"})
    old = sign(ControlMessage(change_id="chg-old-auto", mode=ActuatorMode.AUTO, by="sre",
                              ts=datetime.now(UTC) - timedelta(days=30)), OPERATOR_KEY)  # fmt: skip
    act = Actuator(s)
    try:
        send(s, "control", old)
        poll_until(act, 1)
        assert act.policy.params.mode is ActuatorMode.OBSERVE and act.stats.refused == 1
    finally:
        act.close()
    act = Actuator(s)  # read back at start: it reached the topic 30 days after its date
    try:
        assert act.policy.params.mode is ActuatorMode.OBSERVE and act.stats.refused == 1
    finally:
        act.close()


def test_a_warning_firing_before_a_restart_confirms_after_it(act_settings):
    """Issue 22 item 9: the actuator did not rebuild episodes when it restarted; alerts
    are sent on transitions only, so a WARNING firing before the restart never
    confirmed afterwards. The restarted actuator rebuilds it from the decisions topic
    and confirms it from the job's progress."""
    s = act_settings.model_copy(
        update={
            "actuator_mode": "auto",
            "warning_confirm_steps": 20,
            "warning_confirm_s": 10_000,
            "spare_nodes": "spare-0",
        }
    )
    now = datetime.now(UTC)
    warning = alert("fp-warn-0001").model_copy(
        update={
            "grade": Grade.WARNING,
            "step": 100,
            "started_at": now,
            "ts": now,
            "kind": AlertKind.STRAGGLER,
        }
    )
    act = Actuator(s)
    try:
        send(s, "decisions", warning)
        poll_until(act, 1)
        assert act.stats.commands == 0  # 0 steps: not confirmed
    finally:
        act.close()
    act = Actuator(s)
    try:
        # the job goes on: another episode's update shows its progress (25 steps later)
        progress = alert("fp-info-0001", node="node-4").model_copy(
            update={
                "grade": Grade.INFO,
                "step": 125,
                "recommended_action": RecommendedAction.NONE,
                "ts": now + timedelta(seconds=30),
            }
        )
        send(s, "decisions", progress)
        poll_until(act, 1)
        kinds = {c.kind for c in topic(s, "commands") if "fp-warn-0001" in c.reason}
        assert CommandKind.ISOLATE in kinds, act.policy.memory()
    finally:
        act.close()


# -- operator actions are acknowledged (issue 41 item 1) --------------------------------
def test_an_operator_key_the_actuator_does_not_trust_is_refused_and_said_so(act_settings):
    """`approve` used to print `approved act-...` and exit 0 while the actuator ignored
    the approval (`unknown key id`). Now: a key this shell's STEPGUARD_OPERATOR_PUBLIC_KEYS
    does not list is refused before anything is sent; where the shell lists none, the
    actuator's own answer says the approval was refused and why (exit 1 both ways)."""
    s = act_settings.model_copy(update={"actuator_mode": "approve"})
    act = Actuator(s)
    stranger = test_key("op-stranger")
    try:
        send(s, "decisions", alert())
        [held] = poll_until_topic(act, s, "actions", lambda got: len(got) >= 1)
        env = env_of(s, STEPGUARD_OPERATOR_PRIVATE_KEY=stranger.private_text())
        before = invoke_while_polling(act, ["approve", held.action_id], env)
        said = " ".join(before.output.split())
        assert before.exit_code == 1 and "refused before sending" in said, said
        assert "'op-stranger'" in said and "nothing was sent" in said
        assert topic(s, "approvals") == []

        # a shell without the services' operator public keys cannot check: it sends,
        # and the actuator answers
        blind = env | {"STEPGUARD_OPERATOR_PUBLIC_KEYS": ""}
        refused = invoke_while_polling(act, ["approve", held.action_id], blind)
        said = " ".join(refused.output.split())
        assert refused.exit_code == 1, said
        assert "refused by the actuator" in said and "unknown key id 'op-stranger'" in said
        assert "approved" not in said.replace("approve ", "")
    finally:
        act.close()
    assert [r.state for r in topic(s, "actions")] == [ActionState.HELD]  # still held
    [ack] = [a for a in topic(s, "acks") if a.request == "approval"]
    assert (ack.outcome.value, ack.subject, ack.by) == (
        "refused",
        held.action_id,
        getpass.getuser(),
    )
    assert signature_problem(ack, ACTUATOR_KEY.verifier()) is None


def test_pending_shows_the_running_actuators_mode_not_this_shells(act_settings):
    """`pending` against `up --mode approve` printed `actuator mode observe` (the shell's
    default): the mode now comes from what the running actuator published."""
    s = act_settings.model_copy(update={"actuator_mode": "approve"})
    act = Actuator(s)
    try:
        act.announce()
        send(s, "decisions", alert())
        poll_until_topic(act, s, "actions", lambda got: len(got) >= 1)
    finally:
        act.close()
    shell = env_of(s, STEPGUARD_ACTUATOR_MODE="observe")  # the operator's shell: no mode
    listed = CliRunner().invoke(app, ["pending"], env=shell)
    said = " ".join(listed.output.split())
    assert listed.exit_code == 0, said
    assert "actuator mode approve" in said and "reported by the actuator" in said
    assert "1 action(s)" in said
