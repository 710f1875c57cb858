"""The Slurm executor and ``stepguard resume-node`` against a real slurmctld.

``STEPGUARD_TEST_SLURM_CONF`` names the ``slurm.conf`` of a running Slurm (``.ci/run``
starts one with ``scripts/slurm.sh``); otherwise this module starts its own with
``scripts/slurm.sh`` (ports from ``SLURMCTLD_PORT``/``SLURMD_PORT``, else free ones) and
stops it afterwards. Without Debian's slurm-wlm the tests skip, or fail under ``CI=true``.
Every test uses nodes of its own.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.services.actuator.slurm import IsolateOutcome, SlurmExecutor, SlurmJobs
from schemas import ActuatorMode, Command, CommandKind

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
INCIDENT = "1a2b3c4d5e6f7a8b9c0d1e2f"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _sinfo_answers(conf: str) -> bool:
    proc = subprocess.run(["sinfo", "-h", "-o", "%D"], env={**os.environ, "SLURM_CONF": conf},
                          capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
    return proc.returncode == 0


@pytest.fixture(scope="module")
def slurm_conf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A running Slurm's ``slurm.conf`` (CI's, or one started here by scripts/slurm.sh)."""
    given = os.environ.get("STEPGUARD_TEST_SLURM_CONF", "")
    if given:
        if not _sinfo_answers(given):
            pytest.fail(f"STEPGUARD_TEST_SLURM_CONF={given}: sinfo gets no answer", pytrace=False)
        yield given
        return
    path = f"{os.environ.get('PATH', '')}{os.pathsep}/usr/sbin"
    if not all(shutil.which(x, path=path) for x in ("slurmctld", "slurmd", "munged", "sinfo")):
        what = "slurmctld/slurmd/munged not installed (apt-get install -y slurm-wlm munge)"
        if IN_CI:
            pytest.fail(f"CI=true but {what}; .ci/run must install it", pytrace=False)
        pytest.skip(what)
    env = {
        **os.environ,
        "PATH": path,
        "SLURM_HOME_DIR": str(tmp_path_factory.mktemp("slurm")),
        "SLURMCTLD_PORT": os.environ.get("SLURMCTLD_PORT") or str(_free_port()),
        "SLURMD_PORT": os.environ.get("SLURMD_PORT") or str(_free_port()),
    }
    script = str(ROOT / "scripts" / "slurm.sh")
    try:
        proc = subprocess.run(["bash", script, "start"], env=env, capture_output=True,
                              text=True, timeout=120, check=False)  # fmt: skip
        if proc.returncode != 0:
            pytest.fail(f"scripts/slurm.sh start failed:\n{proc.stderr[-3000:]}", pytrace=False)
        conf = proc.stdout.strip().splitlines()[-1].removeprefix("SLURM_CONF=")
        yield conf
    finally:
        subprocess.run(["bash", script, "stop"], env=env, capture_output=True, timeout=120,
                       check=False)  # fmt: skip


@pytest.fixture
def slurm(slurm_conf: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """``SLURM_CONF`` set for this test (scontrol, sinfo, the executor's subprocesses)."""
    monkeypatch.setenv("SLURM_CONF", slurm_conf)
    return slurm_conf


def run(*argv: str) -> str:
    proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=30, check=False)
    assert proc.returncode == 0, f"{argv}: {proc.stderr}"
    return proc.stdout


def nodes() -> dict[str, tuple[str, str]]:
    """Every node's state and reason as ``sinfo`` (not the executor's reader) shows it."""
    out = run("sinfo", "-N", "-h", "-o", "%N|%T|%E")
    rows = (line.split("|", 2) for line in out.splitlines())
    return {name: (state, reason) for name, state, reason in rows}


def admin_drain(node: str, reason: str) -> None:
    run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")


def until(what: str, check: Callable[[], object], timeout_s: float = 60.0) -> object:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := check():
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def command(kind: CommandKind, targets: tuple[str, ...], job_id: str = "llm-7") -> Command:
    now = datetime.now(UTC)
    return Command(
        command_id=f"cmd-{kind.value}-{'-'.join(targets)}", kind=kind, job_id=job_id,
        targets=targets, replacements=("spare-001",), reason=("fedcba9876543210fedc",),
        mode=ActuatorMode.AUTO, issued_at=now, expires_at=now + timedelta(seconds=300),
        summary=f"replace {targets[0]} with spare-001 at the next checkpoint boundary",
        cause="hardware: GPU 2: fatal XID 79", incident=INCIDENT,
    )  # fmt: skip


OUR_REASON = "stepguard: hardware: GPU 2: fatal XID 79 (incident 1a2b3c4d5e6f)"


def test_isolate_drains_the_right_node_with_the_cause_and_touches_no_other(slurm):
    before = nodes()
    assert "node-0003" in before and "spare-003" in before  # named as the simulator does
    detail = SlurmExecutor().execute(command(CommandKind.ISOLATE, ("node-0003",)))
    after = nodes()
    assert after["node-0003"] == ("drained", OUR_REASON)
    assert detail == f"node-0003: drained ({OUR_REASON})"
    assert {n: s for n, s in after.items() if n != "node-0003"} == {
        n: s for n, s in before.items() if n != "node-0003"
    }
    log = Path(slurm).parent / "log" / "slurmctld.log"  # scripts/slurm.sh's layout
    line = f"update_node: node node-0003 reason set to: {OUR_REASON}"
    until("slurmctld to log the drain", lambda: log.exists() and line in log.read_text())


def test_an_administrators_drain_and_reason_are_left_untouched_and_reported(slurm):
    admin_drain("node-0004", "admin: replacing the PSU, ticket 42")
    [done] = SlurmExecutor().isolate(command(CommandKind.ISOLATE, ("node-0004",)))
    assert done.outcome is IsolateOutcome.ISOLATED_BY_OTHER
    assert nodes()["node-0004"] == ("drained", "admin: replacing the PSU, ticket 42")
    detail = SlurmExecutor().execute(command(CommandKind.ISOLATE, ("node-0004",)))
    assert detail.startswith("node-0004: already isolated by someone else (")
    assert "admin: replacing the PSU, ticket 42" in detail


def test_resume_node_refuses_an_administrators_drain_and_force_resumes_it(slurm):
    admin_drain("node-0005", "admin: memory test")
    refused = CliRunner().invoke(app, ["resume-node", "node-0005"])
    assert refused.exit_code == 1, refused.output
    assert "someone else" in refused.output
    assert nodes()["node-0005"] == ("drained", "admin: memory test")
    forced = CliRunner().invoke(app, ["resume-node", "node-0005", "--force"])
    assert forced.exit_code == 0, forced.output
    assert "resumed (forced) node-0005" in forced.output
    until("node-0005 back in service", lambda: "drain" not in nodes()["node-0005"][0])


def test_resume_node_resumes_its_own_drain(slurm):
    SlurmExecutor().execute(command(CommandKind.ISOLATE, ("node-0006",)))
    assert nodes()["node-0006"] == ("drained", OUR_REASON)
    result = CliRunner().invoke(app, ["resume-node", "node-0006"])
    assert result.exit_code == 0, result.output
    assert "resumed node-0006" in result.output
    until("node-0006 back in service", lambda: "drain" not in nodes()["node-0006"][0])


def test_restart_requeues_a_real_slurm_job_excluding_the_isolated_node(slurm, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(600)\n")
    script.chmod(0o755)
    job = run("sbatch", "--parsable", "-N1", f"--chdir={tmp_path}",
              f"--output={tmp_path}/slurm-%j.out", str(script)).strip()  # fmt: skip
    slurm_exec = SlurmExecutor(jobs=SlurmJobs({"llm-slurm": job}))

    def queued() -> list[str]:
        return run("squeue", "-h", "-j", job, "-o", "%T|%N").strip().split("|")

    try:
        until(f"job {job} running", lambda: queued()[0] == "RUNNING")
        node = queued()[1]
        isolate = command(CommandKind.ISOLATE, (node,), job_id="llm-slurm")
        restart = command(CommandKind.RESTART, (node,), job_id="llm-slurm")
        assert slurm_exec.handles(restart)
        assert not slurm_exec.handles(command(CommandKind.RESTART, (node,), job_id="other"))
        slurm_exec.execute(isolate)  # the actuator's order: isolate, then restart
        detail = slurm_exec.execute(restart)
        assert detail == f"Slurm job {job} requeued (was RUNNING), ExcNodeList={node}"
        shown = run("scontrol", "show", "job", "-o", job)
        assert "Restarts=1" in shown and f"ExcNodeList={node} " in shown
        # back in the queue (through COMPLETING while its first run is killed)
        until(f"job {job} queued again", lambda: queued()[0] in ("PENDING", "RUNNING"))
        assert queued()[1] != node  # pending (no node), or running on another one (-N1)
    finally:
        run("scancel", job)
        until(f"job {job} gone", lambda: run("squeue", "-h", "-o", "%i").split().count(job) == 0)
    slurm_exec.resume(node)
