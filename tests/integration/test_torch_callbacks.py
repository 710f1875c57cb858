"""The Lightning and Hugging Face callbacks on a real ``torch.distributed`` job (issue 25).

The same stack as test_torch_ddp.py (``stepguard up --job`` against the test broker,
the job under ``stepguard-torchrun -- torchrun --nproc-per-node 4``, gloo, CPU, two
emulated nodes of two ranks); the job is callback_job.py: the framework's own training
loop with ``callbacks=[StepguardCallback()]``.

Lightning and transformers are optional extras: without them these tests skip, except
under ``CI=true`` (.ci/run installs ``.[dev,torch,lightning,hf]``), where they fail.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from schemas import AlertKind, AlertState, JobEventKind
from tests.conftest import IN_CI
from tests.integration import test_torch_ddp as ddp
from tests.integration.test_torch_ddp import NODES, described, firing

stack = ddp.stack  # its fixture: the stack up, the job run under stepguard-torchrun

pytestmark = [pytest.mark.integration, pytest.mark.slow]

JOB = Path(__file__).with_name("callback_job.py")
MODULES = {"lightning": "lightning", "hf": "transformers"}


@pytest.fixture(params=sorted(MODULES))
def framework(request: pytest.FixtureRequest) -> str:
    name = request.param
    if importlib.util.find_spec(MODULES[name]) is None:
        if IN_CI:
            pytest.fail(f"CI=true but {MODULES[name]} is missing: .ci/run installs .[{name}]")
        pytest.skip(f"{MODULES[name]} is not installed (pip install -e '.[{name}]')")
    return name


def test_a_clean_run_raises_nothing_and_announces_the_job_once(stack, framework):
    s = stack("observe")
    doc = s.run_job("--framework", framework, steps=40, script=JOB)
    assert doc["relaunches"] == [], doc
    assert {r["node"] for r in doc["ranks"]} == set(NODES)
    assert all(r["recorded"] == 40 and r["hooked"] for r in doc["ranks"]), doc["ranks"]
    s.wait_steps(40 * 4)
    fired = [a for a in s.alerts if a.state is AlertState.FIRING]
    assert not fired, described(fired)
    kinds = [e.kind for e in s.events]
    assert kinds.count(JobEventKind.START) == 1 and kinds.count(JobEventKind.END) == 1, kinds


def test_a_compute_straggler_is_named_with_cause_compute(stack, framework):
    s = stack("observe")
    onset = 40
    s.run_job("--framework", framework, "--slow-rank", "3", "--slow-from", str(onset),
              steps=64, script=JOB)  # fmt: skip
    alert = s.wait_alert(firing(AlertKind.STRAGGLER, "node-b"), 60, "straggler alert on node-b")
    assert alert.rank == 3, alert
    assert alert.evidence.metric.startswith("compute"), alert.evidence
    assert alert.step is not None and alert.step <= onset + 12, alert
    wrong = [a for a in s.alerts if a.node == "node-a" and a.state is AlertState.FIRING]
    assert not wrong, described(wrong)
