"""The Slurm executor against a fake ``scontrol``/``squeue`` (a unit test; the real
slurmctld is tests/integration/test_slurm.py)."""

from __future__ import annotations

import doctest
import json
import logging
import stat
import sys
from datetime import UTC, datetime, timedelta

import pytest

import pipeline.services.actuator.slurm as slurm_module
from pipeline.io.errors import ConfigError
from pipeline.io.settings import load_settings
from pipeline.io.trust import sign, signature_problem
from pipeline.policy import Policy, PolicyParams
from pipeline.services.actuator.executors import (
    ExecutionError,
    InvalidNodeName,
    make_executor,
    validate_node_name,
)
from pipeline.services.actuator.slurm import (
    REASON_MAX_BYTES,
    IsolateOutcome,
    NodeNotInJob,
    ResumeOutcome,
    ResumeRefused,
    SlurmExecutor,
    SlurmJobs,
    drain_reason,
)
from schemas import (
    ActuatorMode,
    Alert,
    AlertKind,
    AlertState,
    Command,
    CommandKind,
    Evidence,
    Grade,
    RecommendedAction,
    decode,
    encode,
)
from tests.factories import ACTUATOR_KEY

# A fake Slurm: the nodes and jobs live in a JSON file; every call is logged.
FAKE = r"""#!{python} -SI
import json, os, sys
STATE, LOG = {state!r}, {log!r}
tool, args = os.path.basename(sys.argv[0]), sys.argv[1:]
open(LOG, "a").write(json.dumps([tool, *args]) + "\n")
db = json.load(open(STATE))
def save():
    json.dump(db, open(STATE, "w"))
if any("fail" in a for a in args):
    sys.exit(3)
if tool == "squeue":
    job = db["jobs"].get(args[args.index("-j") + 1])
    if job is None:
        print("slurm_load_jobs error: Invalid job id specified", file=sys.stderr)
        sys.exit(1)
    print("|".join([args[args.index("-j") + 1], job["state"], job["nodes"], job["exc"]]))
elif args[:2] == ["show", "node"]:
    node = db["nodes"].get(args[2])
    if node is None:
        print(f"Node {{args[2]}} not found", file=sys.stderr)
        sys.exit(1)
    print(f"NodeName={{args[2]}} Arch=x86_64 CoresPerSocket=1")
    print(f"   State={{node['state']}} ThreadsPerCore=1 TmpDisk=0 Weight=1")
    if node["reason"]:
        print(f"   Reason={{node['reason']}} [root@2026-12-01T21:29:05]")
elif args[:2] == ["show", "hostnames"]:
    print("\n".join(args[2].split(",")))
elif args[0] == "update" and args[1].startswith("NodeName="):
    node = db["nodes"][args[1].split("=", 1)[1]]
    kv = dict(a.split("=", 1) for a in args[1:])
    if kv["State"] == "DRAIN":
        node["state"], node["reason"] = "IDLE+DRAIN", kv["Reason"]
    elif kv["State"] == "RESUME" and not db.get("resume_ignored"):
        node["state"], node["reason"] = "IDLE", None
    save()
elif args[0] == "update" and args[1].startswith("JobId="):
    if db.get("refuse_job_updates"):
        print("Job is no longer pending execution", file=sys.stderr)
        sys.exit(1)
    db["jobs"][args[1].split("=", 1)[1]]["exc"] = args[2].split("=", 1)[1]
    save()
elif args[0] in ("requeuehold", "release"):
    job = db["jobs"][args[1]]
    job["state"], job["nodes"] = "PENDING", ""
    save()
"""


class FakeSlurm:
    def __init__(self, tmp_path):
        self.state = tmp_path / "slurm.json"
        self.log = tmp_path / "calls.jsonl"
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        self.db = {
            "nodes": {f"node-{i}": {"state": "IDLE", "reason": None} for i in range(8)},
            "jobs": {},
        }
        self.save()
        for tool in ("scontrol", "squeue"):
            exe = self.bin / tool
            exe.write_text(
                FAKE.format(python=sys.executable, state=str(self.state), log=str(self.log))
            )
            exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
        self.scontrol = str(self.bin / "scontrol")

    def save(self):
        self.state.write_text(json.dumps(self.db))

    def set_node(self, name, state, reason=None):
        self.db = json.loads(self.state.read_text())
        self.db["nodes"][name] = {"state": state, "reason": reason}
        self.save()

    def node(self, name):
        return json.loads(self.state.read_text())["nodes"][name]

    def add_job(self, slurm_id, state, nodes, exc=""):
        self.db = json.loads(self.state.read_text())
        self.db["jobs"][slurm_id] = {"state": state, "nodes": nodes, "exc": exc}
        self.save()

    def job(self, slurm_id):
        return json.loads(self.state.read_text())["jobs"][slurm_id]

    def calls(self):
        if not self.log.exists():
            return []
        return [json.loads(x) for x in self.log.read_text().splitlines()]

    def writes(self):
        return [c for c in self.calls() if c[0] == "scontrol" and c[1] != "show"]

    def executor(self, **jobs):
        return SlurmExecutor(self.scontrol, jobs=SlurmJobs(jobs))


@pytest.fixture
def fake(tmp_path):
    return FakeSlurm(tmp_path)


NOW = datetime.now(UTC)


def command(kind=CommandKind.ISOLATE, targets=("node-3",), **kw) -> Command:
    base = dict(
        command_id="cmd-abc123", kind=kind, job_id="job-1", targets=targets,
        replacements=("spare-000",), reason=("0123456789abcdef0123",), mode=ActuatorMode.AUTO,
        issued_at=NOW, expires_at=NOW + timedelta(seconds=300),
        summary="replace node-3 with spare-000 at the next checkpoint boundary",
        cause="hardware: GPU 2: fatal XID 79", incident="1a2b3c4d5e6f7a8b9c0d1e2f",
    )  # fmt: skip
    base.update(kw)
    return Command(**base)


def test_the_module_examples_hold():
    assert doctest.testmod(slurm_module, optionflags=doctest.ELLIPSIS).failed == 0


# -- ISOLATE -----------------------------------------------------------------------------
def test_isolate_reads_the_node_then_drains_it_with_the_cause_and_incident(fake):
    slurm = fake.executor()
    [done] = slurm.isolate(command())
    assert done.outcome is IsolateOutcome.DRAINED
    reason = "stepguard: hardware: GPU 2: fatal XID 79 (incident 1a2b3c4d5e6f)"
    assert fake.calls() == [
        ["scontrol", "show", "node", "node-3"],
        ["scontrol", "update", "NodeName=node-3", "State=DRAIN", f"Reason={reason}"],
        ["scontrol", "show", "node", "node-3"],  # read back
    ]
    assert fake.node("node-3") == {"state": "IDLE+DRAIN", "reason": reason}
    assert "replace" not in reason  # the cause, not the remedy
    assert fake.node("node-2")["state"] == "IDLE"  # no other node touched


def test_the_result_detail_says_what_happened_to_each_node(fake):
    fake.set_node("node-4", "IDLE+DRAIN", "admin: bad fan, ticket 42")
    detail = fake.executor().execute(command(targets=("node-3", "node-4")))
    assert detail == (
        "node-3: drained (stepguard: hardware: GPU 2: fatal XID 79 (incident 1a2b3c4d5e6f)); "
        "node-4: already isolated by someone else (IDLE+DRAIN: admin: bad fan, ticket 42)"
    )


@pytest.mark.parametrize(
    "state", ["IDLE+DRAIN", "ALLOCATED+DRAIN", "DOWN", "DOWN*", "DOWN+NOT_RESPONDING", "IDLE+FAIL"]
)
def test_a_drain_or_down_it_does_not_own_is_left_untouched_and_reported(fake, state):
    fake.set_node("node-3", state, "admin: bad fan")
    [done] = fake.executor().isolate(command())
    assert done.outcome is IsolateOutcome.ISOLATED_BY_OTHER
    assert done.after.reason == "admin: bad fan"
    assert fake.writes() == []
    assert fake.node("node-3") == {"state": state, "reason": "admin: bad fan"}


def test_its_own_earlier_drain_is_left_as_it_is(fake):
    fake.set_node("node-3", "IDLE+DRAIN", "stepguard: straggler: 1.8x (incident aaaa)")
    [done] = fake.executor().isolate(command())
    assert done.outcome is IsolateOutcome.ALREADY_OURS
    assert fake.writes() == []


def test_odd_characters_in_the_cause_never_reach_slurm(fake):
    fake.executor().isolate(command(cause="slow; `reboot` $(id)\nnext line"))
    reason = fake.node("node-3")["reason"]
    assert reason == "stepguard: slow_ _reboot_ _(id) next line (incident 1a2b3c4d5e6f)"


def test_without_a_cause_the_reason_names_the_command_and_the_episode(fake):
    fake.executor().isolate(command(cause=None, incident=None))
    reason = fake.node("node-3")["reason"]
    assert reason == "stepguard: isolated by command cmd-abc123 (incident 0123456789ab)"


def test_the_reason_fits_slurmdbd_and_keeps_the_incident():
    reason = drain_reason("x" * 2000, "1a2b3c4d5e6f7a8b", "cmd-1")
    assert len(reason.encode()) == REASON_MAX_BYTES
    assert reason.startswith("stepguard: xxx") and reason.endswith("x... (incident 1a2b3c4d5e6f)")


@pytest.mark.parametrize(
    "name", ["node1; rm -rf /", "-rf", "", "a" * 64, "node 1", "n$(id)", "../etc", "nöde"]
)
def test_malicious_or_odd_node_names_run_nothing(fake, name):
    with pytest.raises(InvalidNodeName):
        fake.executor().execute(command(targets=("node-1", name)))
    with pytest.raises(InvalidNodeName):
        fake.executor().resume(name)
    assert fake.calls() == []  # all or nothing: not even the valid node-1


def test_node_name_rule():
    assert validate_node_name("gpu-a100.rack-3_n017") == "gpu-a100.rack-3_n017"
    assert validate_node_name("a" * 63) == "a" * 63


def test_a_failing_scontrol_is_an_execution_error(fake, tmp_path):
    fake.set_node("fail-node", "IDLE")
    with pytest.raises(ExecutionError, match="exited 3"):
        fake.executor().execute(command(targets=("fail-node",)))
    with pytest.raises(ExecutionError, match="failed"):
        SlurmExecutor(scontrol=str(tmp_path / "missing")).execute(command())
    with pytest.raises(ExecutionError, match="not found"):
        fake.executor().execute(command(targets=("node-99",)))
    assert fake.writes() == []


# -- resume-node ---------------------------------------------------------------------------
def test_resume_puts_back_its_own_drain(fake):
    slurm = fake.executor()
    slurm.isolate(command())
    done = slurm.resume("node-3")
    assert done.outcome is ResumeOutcome.RESUMED
    assert fake.writes()[-1] == ["scontrol", "update", "NodeName=node-3", "State=RESUME"]
    assert fake.node("node-3") == {"state": "IDLE", "reason": None}


def test_resume_refuses_someone_elses_drain_and_force_overrides_it_logged(fake, caplog):
    fake.set_node("node-3", "IDLE+DRAIN", "admin: bad fan")
    with pytest.raises(ResumeRefused, match=r"someone else.*admin: bad fan.*--force"):
        fake.executor().resume("node-3")
    assert fake.writes() == []
    with caplog.at_level(logging.WARNING, logger="pipeline.services.actuator.slurm"):
        done = fake.executor().resume("node-3", force=True)
    assert done.outcome is ResumeOutcome.FORCED
    assert fake.node("node-3")["state"] == "IDLE"
    assert any("--force" in r.message and "admin: bad fan" in r.message for r in caplog.records)


def test_resume_reads_the_node_back_and_says_when_it_did_not_take_effect(fake):
    """Issue 41 item 1: resume-node printed `resumed` once scontrol accepted the update;
    a node still drained afterwards (Slurm kept it down) is now an error, exit 1."""
    slurm = fake.executor()
    slurm.isolate(command())
    fake.db = json.loads(fake.state.read_text()) | {"resume_ignored": True}
    fake.save()
    with pytest.raises(ExecutionError, match=r"node-3 is still out of service.*DRAIN"):
        slurm.resume("node-3")
    fake.db["resume_ignored"] = False
    fake.save()
    done = slurm.resume("node-3")
    assert done.after is not None and not done.after.out_of_service
    assert done.describe().endswith(", now IDLE)")


def test_resume_of_a_node_in_service_does_nothing(fake):
    done = fake.executor().resume("node-3")
    assert done.outcome is ResumeOutcome.NOT_ISOLATED
    assert fake.writes() == []


# -- RESTART -------------------------------------------------------------------------------
def test_restart_is_handled_only_for_jobs_it_was_told_are_slurm_jobs(fake):
    slurm = fake.executor(**{"job-1": "41"})
    assert slurm.handles(command(CommandKind.RESTART))
    assert not slurm.handles(command(CommandKind.RESTART, job_id="job-2"))
    assert not slurm.handles(command(CommandKind.CHECKPOINT))
    assert slurm.handles(command())  # ISOLATE: every job
    by_prefix = SlurmExecutor(jobs=SlurmJobs.parse("", prefix="slurm-"))
    assert by_prefix.handles(command(CommandKind.RESTART, job_id="slurm-77"))
    assert not by_prefix.handles(command(CommandKind.RESTART, job_id="slurm-77; reboot"))


def test_restart_requeues_the_running_job_held_until_the_exclusions_are_set(fake):
    fake.add_job("41", "RUNNING", "node-2,node-3", exc="node-7")
    detail = fake.executor(**{"job-1": "41"}).execute(command(CommandKind.RESTART))
    assert detail == "Slurm job 41 requeued (was RUNNING), ExcNodeList=node-7,node-3"
    assert fake.writes() == [
        ["scontrol", "requeuehold", "41"],
        ["scontrol", "update", "JobId=41", "ExcNodeList=node-7,node-3"],  # keeps its own
        ["scontrol", "release", "41"],
    ]


def test_restart_of_a_pending_job_only_adds_the_exclusions(fake):
    fake.add_job("41", "PENDING", "")
    fake.executor(**{"job-1": "41"}).execute(command(CommandKind.RESTART))
    assert fake.writes() == [["scontrol", "update", "JobId=41", "ExcNodeList=node-3"]]


def test_restart_refuses_a_target_the_slurm_job_does_not_run_on(fake):
    fake.add_job("41", "RUNNING", "node-5")
    with pytest.raises(NodeNotInJob, match="does not run on node-3"):
        fake.executor(**{"job-1": "41"}).execute(command(CommandKind.RESTART))
    assert fake.writes() == []
    assert issubclass(NodeNotInJob, InvalidNodeName)  # the runner answers REFUSED


def test_restart_of_a_finished_or_unknown_job_fails(fake):
    fake.add_job("41", "COMPLETED", "")
    with pytest.raises(ExecutionError, match="COMPLETED: nothing to restart"):
        fake.executor(**{"job-1": "41"}).execute(command(CommandKind.RESTART))
    with pytest.raises(ExecutionError, match="Invalid job id"):
        fake.executor(**{"job-1": "42"}).execute(command(CommandKind.RESTART))
    assert fake.writes() == []


def test_a_failed_exclusion_still_releases_the_job_and_fails(fake):
    fake.add_job("41", "RUNNING", "node-3")
    fake.db["refuse_job_updates"] = True
    fake.save()
    with pytest.raises(ExecutionError, match="requeued without its exclusions"):
        fake.executor(**{"job-1": "41"}).execute(command(CommandKind.RESTART))
    assert fake.writes()[-1] == ["scontrol", "release", "41"]


def test_slurm_jobs_parsing():
    jobs = SlurmJobs.parse(" llm-7 = 1234 ,llm-8=99_2", prefix="slurm-")
    assert (jobs.slurm_id("llm-7"), jobs.slurm_id("llm-8"), jobs.slurm_id("llm-9")) == (
        "1234", "99_2", None,
    )  # fmt: skip
    for bad in ("llm-7", "=12", "llm-7=abc", "llm-7=1 2"):
        with pytest.raises(ConfigError):
            SlurmJobs.parse(bad)


def test_make_executor_reads_the_slurm_settings(fake):
    settings = load_settings(
        {}, slurm_scontrol=fake.scontrol, slurm_jobs="job-1=41", slurm_job_prefix="slurm-"
    )
    slurm = make_executor("slurm", settings)
    assert isinstance(slurm, SlurmExecutor)
    assert slurm.squeue == str(fake.bin / "squeue")  # beside scontrol
    assert slurm.jobs.slurm_id("job-1") == "41" and slurm.jobs.slurm_id("slurm-5") == "5"


# -- the cause travels from the alert ----------------------------------------------------
def test_the_actuator_puts_the_alerts_cause_and_incident_on_its_commands():
    policy = Policy(PolicyParams(mode=ActuatorMode.AUTO, spare_nodes=("spare-000",),
                                 max_isolations=10, max_isolation_pct=100))  # fmt: skip
    alert = Alert(
        fingerprint="fp-node3-abcdef", seq=0, kind=AlertKind.HARDWARE, grade=Grade.CRITICAL,
        state=AlertState.FIRING, job_id="job-1", node="node-3", step=10, started_at=NOW,
        ts=NOW, evidence=Evidence(metric="ecc_uncorrected", value=1.0, deviation=1.0,
                                  detail="GPU 2: fatal XID 79"),
        recommended_action=RecommendedAction.REPLACE_AT_CHECKPOINT,
        summary="hardware (hw_fatal) on node-3 firing: GPU 2: fatal XID 79",
        incident="1a2b3c4d5e6f7a8b9c0d1e2f", node_in_steps=True,
    )  # fmt: skip
    [isolate] = [c for c in policy.on_alert(alert, NOW).commands if c.kind is CommandKind.ISOLATE]
    assert isolate.cause == "hardware: GPU 2: fatal XID 79"
    assert isolate.incident == "1a2b3c4d5e6f7a8b9c0d1e2f"
    assert "replace node-3" in isolate.summary  # the remedy stays the summary


def test_cause_and_incident_are_signed_and_a_command_without_them_still_verifies():
    keys = ACTUATOR_KEY.verifier()
    signed = sign(command(), ACTUATOR_KEY)
    assert signature_problem(signed, keys) is None
    assert signature_problem(signed.model_copy(update={"cause": "nothing to see"}), keys)
    assert signature_problem(signed.model_copy(update={"incident": None}), keys)
    older = sign(command(cause=None, incident=None), ACTUATOR_KEY)  # an older actuator's
    wire = json.loads(encode(older))
    for name in ("cause", "incident"):
        wire.pop(name, None)
    back = decode(Command, json.dumps(wire).encode())
    assert signature_problem(back, keys) is None
