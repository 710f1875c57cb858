"""The Kubernetes executor against a real kube-apiserver (issue 42).

The production path: a worker-signed alert on the decisions topic, the actuator in auto
mode, ``stepguard executor kubernetes`` (a subprocess) as the shipped ClusterRole's
service account (its token from the TokenRequest API). Nodes and pods are made here (no
kubelet); each test names its own (a tag), so tests share one API server.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from typer.testing import CliRunner

from pipeline.cli.app import app
from pipeline.io.errors import ConfigError
from pipeline.io.kafka import create_topics
from pipeline.services.actuator.kubernetes import KubernetesExecutor, PermissionMissing
from pipeline.services.actuator.service import Actuator
from schemas import (
    ActuatorMode,
    Command,
    CommandKind,
    CommandResult,
    CommandStatus,
)
from tests.factories import key_settings
from tests.integration import kube_apiserver, test_worker
from tests.integration.kube_apiserver import Kube, apply_manifests, call, service_account_token
from tests.integration.test_actuator import alert, env_of, poll_until, send, wait_topic
from tests.integration.test_worker import firing, record_frame, scenario

pytestmark = pytest.mark.integration
kube = kube_apiserver.kube  # the session's API server (a fixture)
workers, decisions = test_worker.workers, test_worker.decisions  # fixtures: the worker's

TAINT = "stepguard.io/unhealthy"
JOB_LABEL = "jobset.sigs.k8s.io/jobset-name"
ADMIN_TAINT = {"key": "admin.example.com/psu", "value": "ticket-42", "effect": "NoSchedule"}


@pytest.fixture(scope="module")
def executor_kubeconfig(kube: Kube) -> str:
    """The shipped manifests applied; a kubeconfig with the executor's service-account
    token (the ClusterRole's permissions, nothing more)."""
    admin = kube.admin()
    apply_manifests(admin)
    apply_manifests(admin, kube_apiserver.MANIFESTS / "dra")  # device taints (optional)
    token = service_account_token(admin, "stepguard", "stepguard-executor")
    return str(kube.kubeconfig_for_token(token, "stepguard-executor"))


@pytest.fixture
def admin(kube: Kube) -> Any:
    return kube.admin()


@pytest.fixture
def tag() -> str:
    return uuid.uuid4().hex[:6]


def make_node(api: Any, name: str, *, cordoned: bool = False, taints=()) -> dict[str, Any]:
    body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name},
            "spec": {"unschedulable": cordoned, "taints": list(taints)}}  # fmt: skip
    return call(api, "POST", "/api/v1/nodes", body)[1]


def make_namespace(api: Any, ns: str) -> None:
    call(api, "POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    # no controller-manager: the default service account pods need is made here
    call(api, "POST", f"/api/v1/namespaces/{ns}/serviceaccounts", {"metadata": {"name": "default"}})


def make_pod(api: Any, ns: str, name: str, node: str, labels: dict[str, str]) -> None:
    """A pod bound to ``node`` and reported Running and Ready (as a kubelet would: the
    Eviction API ignores disruption budgets for pending pods)."""
    container = {"name": "train", "image": "example.invalid/train"}
    body = {"metadata": {"name": name, "labels": labels},
            "spec": {"nodeName": node, "automountServiceAccountToken": False,
                     "containers": [container]}}  # fmt: skip
    call(api, "POST", f"/api/v1/namespaces/{ns}/pods", body)
    ready = [{"type": "Ready", "status": "True"}]
    status = {"status": {"phase": "Running", "conditions": ready}}
    call(api, "PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", status,
         content_type="application/merge-patch+json")  # fmt: skip


def node(api: Any, name: str) -> dict[str, Any]:
    return call(api, "GET", f"/api/v1/nodes/{name}")[1]


def pod_state(api: Any, ns: str, name: str) -> str:
    """``running`` (no deletion asked), ``evicted`` (terminating) or ``gone``."""
    status, out = call(api, "GET", f"/api/v1/namespaces/{ns}/pods/{name}", ok=False)
    if status == 404:
        return "gone"
    return "evicted" if out["metadata"].get("deletionTimestamp") else "running"


def taints(n: dict[str, Any]) -> list[dict[str, Any]]:
    return [{k: v for k, v in t.items() if k != "timeAdded"} for t in n["spec"].get("taints") or []]


def condition(n: dict[str, Any]) -> dict[str, Any] | None:
    conds = n.get("status", {}).get("conditions") or []
    return next((c for c in conds if c["type"] == "StepguardHealthy"), None)


@pytest.fixture
def executor_process(settings, executor_kubeconfig, tmp_path) -> Iterator[Any]:
    """``stepguard executor kubernetes`` as a service process; the settings it uses."""
    s = settings.model_copy(
        update=key_settings() | {"actuator_mode": "auto", "spare_nodes": "spare-0,spare-1",
                                 "guard_max_isolation_pct": 100.0,
                                 "guard_relaunch_cooldown_s": 0.0}
    )  # fmt: skip
    create_topics(s)
    env = env_of(s, STEPGUARD_KUBE_CONFIG=executor_kubeconfig)
    log = (tmp_path / "executor.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-c", "from pipeline.cli.app import main; main()", "executor",
         "kubernetes"], env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield s
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()
        print((tmp_path / "executor.log").read_text()[-3000:])


def test_the_production_path_isolates_the_culprit_with_provenance_and_touches_nothing_else(
    admin, executor_process, executor_kubeconfig, tag, monkeypatch
):
    s = executor_process
    culprit, held, bystander, other = (f"k{tag}-{i}" for i in (3, 4, 5, 6))
    make_node(admin, culprit, taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    make_node(admin, held, cordoned=True, taints=[ADMIN_TAINT])  # an administrator's
    make_node(admin, bystander)
    make_node(admin, other)
    ns = f"train-{tag}"
    make_namespace(admin, ns)
    make_pod(admin, ns, "job1-culprit", culprit, {JOB_LABEL: "job-1"})
    make_pod(admin, ns, "job1-bystander", bystander, {JOB_LABEL: "job-1"})
    make_pod(admin, ns, "job2-culprit", culprit, {JOB_LABEL: "job-2"})
    make_pod(admin, ns, "unlabelled-culprit", culprit, {})
    make_pod(admin, ns, "job1-held", held, {JOB_LABEL: "job-1"})
    before = {n: node(admin, n) for n in (held, bystander, other)}

    act = Actuator(s)
    try:
        send(s, "decisions", alert(f"fp-{tag}-3", node=culprit),
             alert(f"fp-{tag}-4", node=held))  # fmt: skip
        poll_until(act, 2)
    finally:
        act.close()

    def answered(results: list[CommandResult]) -> bool:
        return sum(r.executor == "kubernetes" for r in results) >= 4  # 2 x (ISOLATE, RESTART)

    results = [r for r in wait_topic(s, "results", answered, max_polls=900)
               if r.executor == "kubernetes"]  # fmt: skip
    assert all(r.status is CommandStatus.SUCCEEDED for r in results), results
    details = " | ".join(r.detail for r in results)

    # the culprit: cordoned, tainted beside the GPU pool's taint, with provenance
    n = node(admin, culprit)
    assert n["spec"]["unschedulable"] is True
    gpu, ours = taints(n)
    assert gpu == {"key": "nvidia.com/gpu", "effect": "NoSchedule"}
    assert ours["key"] == TAINT and ours["effect"] == "NoSchedule" and ours["value"]
    notes = n["metadata"]["annotations"]
    assert notes["stepguard.io/isolated-by"].startswith("stepguard (actuator key ")
    # what the alert saw (its summary: the test alert has no evidence detail), not the remedy
    assert notes["stepguard.io/cause"] == f"uncorrectable ECC on {culprit}"
    assert notes["stepguard.io/job"] == "job-1" and notes["stepguard.io/command-id"]
    assert notes["stepguard.io/cordoned"] == "true"
    cond = condition(n)
    assert cond is not None and cond["status"] == "False" and cond["reason"] == "StepguardIsolated"
    assert f"{culprit}: cordoned and tainted" in details

    # the administrator's node keeps its cordon and its own taint, nothing of ours
    n = node(admin, held)
    assert n["spec"]["unschedulable"] is True and taints(n) == [ADMIN_TAINT]
    assert not any(k.startswith("stepguard.io/") for k in n["metadata"].get("annotations") or {})
    assert condition(n) is None
    assert f"{held}: already isolated by someone else" in details
    # no other node touched at all
    for name in (bystander, other):
        assert (
            node(admin, name)["metadata"]["resourceVersion"]
            == before[name]["metadata"]["resourceVersion"]
        )

    # the job's pods on the isolated nodes are evicted, nobody else's
    assert pod_state(admin, ns, "job1-culprit") in ("evicted", "gone")
    assert pod_state(admin, ns, "job1-held") in ("evicted", "gone")
    assert pod_state(admin, ns, "job1-bystander") == "running"
    assert pod_state(admin, ns, "job2-culprit") == "running"
    assert pod_state(admin, ns, "unlabelled-culprit") == "running"
    # the RESTART did not uncordon
    assert node(admin, culprit)["spec"]["unschedulable"] is True

    # resume-node refuses the administrator's cordon and resumes stepguard's own
    monkeypatch.setenv("STEPGUARD_KUBE_CONFIG", executor_kubeconfig)
    refused = CliRunner().invoke(app, ["resume-node", held, "--executor", "kubernetes"])
    assert refused.exit_code == 1, refused.output
    assert "someone else" in refused.output and len(refused.output.strip().splitlines()) == 1
    assert node(admin, held)["spec"]["unschedulable"] is True
    done = CliRunner().invoke(app, ["resume-node", culprit, "--executor", "kubernetes"])
    assert done.exit_code == 0, done.output
    n = node(admin, culprit)
    assert not n["spec"].get("unschedulable")
    assert taints(n) == [{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]
    assert not any(k.startswith("stepguard.io/") for k in n["metadata"].get("annotations") or {})
    assert condition(n) is None


def test_force_lifts_a_foreign_cordon_but_never_a_foreign_taint(
    admin, executor_kubeconfig, tag, monkeypatch
):
    held = f"k{tag}-7"
    make_node(admin, held, cordoned=True, taints=[ADMIN_TAINT])
    monkeypatch.setenv("STEPGUARD_KUBE_CONFIG", executor_kubeconfig)
    forced = CliRunner().invoke(app, ["resume-node", held, "--executor", "kubernetes", "--force"])
    assert forced.exit_code == 0, forced.output
    assert "resumed (forced)" in forced.output
    n = node(admin, held)
    assert not n["spec"].get("unschedulable") and taints(n) == [ADMIN_TAINT]


def recordon_policy(admin: Any, name: str, nodes: list[str]) -> None:
    """A MutatingAdmissionPolicy (and its binding) that puts the cordon back on every
    update of ``nodes``: what a cluster's own policy or controller may do to a resume."""
    api = "/apis/admissionregistration.k8s.io/v1"
    rule = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"],
            "resources": ["nodes"]}  # fmt: skip
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
        "metadata": {"name": name},
        "spec": {
            "matchConstraints": {"resourceRules": [rule]},
            "matchConditions": [{"name": "these-nodes",
                                 "expression": f"object.metadata.name in {nodes!r}"}],
            "failurePolicy": "Fail", "reinvocationPolicy": "Never",
            "mutations": [{"patchType": "ApplyConfiguration", "applyConfiguration": {
                "expression": "Object{spec: Object.spec{unschedulable: true}}"}}],
        },
    }  # fmt: skip
    call(admin, "POST", f"{api}/mutatingadmissionpolicies", policy)
    binding = {"apiVersion": "admissionregistration.k8s.io/v1",
               "kind": "MutatingAdmissionPolicyBinding", "metadata": {"name": name},
               "spec": {"policyName": name}}  # fmt: skip
    call(admin, "POST", f"{api}/mutatingadmissionpolicybindings", binding)


def test_resume_node_reads_the_node_back_and_fails_unless_it_took_effect(
    admin, executor_kubeconfig, tag, monkeypatch
):
    """Issue 41: resume-node on Kubernetes printed `resumed` from the patch it sent. It
    now reads the node back: exit 0 with the state it read, exit 1 naming what is still
    there when something (here an admission policy) put the node back out of service."""
    kept, resumed, probe = f"k{tag}-r1", f"k{tag}-r2", f"k{tag}-r3"
    kube_exec = executor_for(executor_kubeconfig)
    for name in (kept, resumed):
        make_node(admin, name)
        kube_exec.isolate(command(CommandKind.ISOLATE, (name,), "job-r"))
    make_node(admin, probe)
    recordon_policy(admin, f"recordon-{tag}", [kept, probe])
    deadline = time.monotonic() + 60  # the policy takes effect when the server loaded it
    while True:
        patch = {"metadata": {"labels": {"probe": str(time.monotonic_ns())}}}
        call(admin, "PATCH", f"/api/v1/nodes/{probe}", patch,
             content_type="application/merge-patch+json")  # fmt: skip
        if node(admin, probe)["spec"].get("unschedulable"):
            break
        assert time.monotonic() < deadline, "the admission policy never took effect"
        time.sleep(0.2)  # the server's policy informer, polled with a deadline

    monkeypatch.setenv("STEPGUARD_KUBE_CONFIG", executor_kubeconfig)
    failed = CliRunner().invoke(app, ["resume-node", kept, "--executor", "kubernetes"])
    assert failed.exit_code == 1, failed.output
    assert "resumed" not in failed.output.replace("resume but", "")
    assert f"{kept} is still isolated: cordoned" in failed.output
    assert len(failed.output.strip().splitlines()) == 1, failed.output
    assert node(admin, kept)["spec"]["unschedulable"] is True

    done = CliRunner().invoke(app, ["resume-node", resumed, "--executor", "kubernetes"])
    assert done.exit_code == 0, done.output
    assert f"resumed {resumed} (was cordoned; taints: {TAINT}" in done.output
    assert "now schedulable)" in done.output  # what it read back
    assert not node(admin, resumed)["spec"].get("unschedulable")


def command(kind: CommandKind, targets: tuple[str, ...], job_id: str) -> Command:
    now = datetime.now(UTC)
    return Command(
        command_id=f"cmd-{uuid.uuid4().hex[:8]}", kind=kind, job_id=job_id, targets=targets,
        reason=("fp-1",), mode=ActuatorMode.AUTO, issued_at=now,
        expires_at=now + timedelta(minutes=5), cause="hardware: GPU 2: fatal XID 79",
        incident="1a2b3c4d5e6f7a8b9c0d", key_id="act-1",
    )  # fmt: skip


def executor_for(kubeconfig: str, **kwargs: Any) -> KubernetesExecutor:
    from kubernetes import config

    api = config.new_client_from_config(kubeconfig)
    return KubernetesExecutor(api, job_labels=[JOB_LABEL], **kwargs)


def test_a_disruption_budget_keeps_its_pods_and_the_restart_fails_naming_them(
    admin, executor_kubeconfig, tag
):
    culprit = f"k{tag}-8"
    make_node(admin, culprit)
    ns = f"pdb-{tag}"
    make_namespace(admin, ns)
    make_pod(admin, ns, "guarded", culprit, {JOB_LABEL: f"job-{tag}", "app": "guarded"})
    selector = {"matchLabels": {"app": "guarded"}}
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "all"},
           "spec": {"maxUnavailable": 0, "selector": selector}}  # fmt: skip
    call(admin, "POST", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", pdb)
    kube_exec = executor_for(executor_kubeconfig)
    with pytest.raises(Exception, match=f"not evicted: {ns}/guarded") as failed:
        kube_exec.execute(command(CommandKind.RESTART, (culprit,), f"job-{tag}"))
    assert "HTTP 429" in str(failed.value)
    assert pod_state(admin, ns, "guarded") == "running"
    assert not node(admin, culprit)["spec"].get("unschedulable")  # RESTART never cordons


def test_a_concurrent_change_is_read_again_not_overwritten(admin, executor_kubeconfig, tag):
    """An administrator's taint written between the executor's read and its write: the
    stale patch gets 409 and the executor decides again from the new node."""
    name = f"k{tag}-9"
    make_node(admin, name)
    kube_exec = executor_for(executor_kubeconfig)
    real = kube_exec._node
    raced = []

    def read_then_admin_writes(n: str):
        view = real(n)
        if not raced:  # the administrator's write lands after our first read
            raced.append(True)
            call(admin, "PATCH", f"/api/v1/nodes/{n}", {"spec": {"taints": [ADMIN_TAINT]}},
                    content_type="application/merge-patch+json")  # fmt: skip
        return view

    kube_exec._node = read_then_admin_writes  # type: ignore[method-assign]
    [done] = kube_exec.isolate(command(CommandKind.ISOLATE, (name,), "job-x"))
    assert done.outcome.value == "cordoned and tainted"
    assert [t["key"] for t in taints(node(admin, name))] == [ADMIN_TAINT["key"], TAINT]


def test_rbac_refuses_what_the_role_does_not_grant_and_a_weak_identity_cannot_start(
    admin, kube, executor_kubeconfig, tag
):
    from kubernetes import config

    name = f"k{tag}-10"
    make_node(admin, name)
    sa = config.new_client_from_config(executor_kubeconfig)
    status, out = call(sa, "DELETE", f"/api/v1/nodes/{name}", ok=False)
    assert status == 403, out
    status, _ = call(sa, "POST", "/api/v1/nodes", {"metadata": {"name": f"{name}x"}}, ok=False)
    assert status == 403
    assert node(admin, name)["metadata"]["name"] == name
    # an identity with nodes get only: the executor refuses to start, naming what is missing
    weak = f"weak-{tag}"
    call(
        admin, "POST", "/api/v1/namespaces/stepguard/serviceaccounts", {"metadata": {"name": weak}}
    )
    role = {
        "metadata": {"name": weak},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]}],
    }
    call(admin, "POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles", role)
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": weak}
    subject = {"kind": "ServiceAccount", "name": weak, "namespace": "stepguard"}
    binding = {"metadata": {"name": weak}, "roleRef": ref, "subjects": [subject]}
    call(admin, "POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", binding)
    weak_config = kube.kubeconfig_for_token(service_account_token(admin, "stepguard", weak), weak)
    with pytest.raises(PermissionMissing) as refused:
        executor_for(str(weak_config))
    text = str(refused.value)
    assert "patch nodes" in text and "create pods/eviction" in text and "list pods" in text
    assert "get nodes" not in text
    assert isinstance(refused.value, ConfigError)  # the CLI prints it as one line, exit 2


def test_one_faulty_gpu_is_a_device_taint_where_dra_publishes_it_else_the_node(
    admin, executor_kubeconfig, tag
):
    dra_node, plain_node = f"k{tag}-11", f"k{tag}-12"
    make_node(admin, dra_node)
    make_node(admin, plain_node)
    devices = [{"name": f"gpu-{i}"} for i in range(4)]
    pool = {"name": dra_node, "generation": 1, "resourceSliceCount": 1}
    rslice = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
              "metadata": {"name": f"{dra_node}-gpus"},
              "spec": {"driver": "gpu.nvidia.com", "pool": pool, "nodeName": dra_node,
                       "devices": devices}}  # fmt: skip
    call(admin, "POST", "/apis/resource.k8s.io/v1/resourceslices", rslice)
    kube_exec = executor_for(executor_kubeconfig, device_taints=True)

    [done] = kube_exec.isolate(command(CommandKind.ISOLATE, (dra_node,), "job-dra"))
    assert done.outcome.value == "device tainted" and done.rule
    _, rule = call(admin, "GET", f"/apis/resource.k8s.io/v1/devicetaintrules/{done.rule}")
    assert rule["spec"]["deviceSelector"] == {
        "driver": "gpu.nvidia.com", "pool": dra_node, "device": "gpu-2",
    }  # fmt: skip
    assert rule["spec"]["taint"]["key"] == TAINT
    assert "fatal XID 79" in rule["metadata"]["annotations"]["stepguard.io/cause"]
    n = node(admin, dra_node)
    assert not n["spec"].get("unschedulable") and not taints(n)  # the node stays in service
    # again: stepguard's rule is there already
    [again] = kube_exec.isolate(command(CommandKind.ISOLATE, (dra_node,), "job-dra"))
    assert again.outcome.value == "already isolated by stepguard"

    # a node that publishes no such device: the node is isolated instead
    [fallback] = kube_exec.isolate(command(CommandKind.ISOLATE, (plain_node,), "job-dra"))
    assert fallback.outcome.value == "cordoned and tainted"
    assert node(admin, plain_node)["spec"]["unschedulable"] is True

    # resume removes stepguard's rule of that node
    assert kube_exec.resume(dra_node).outcome.value == "resumed"
    status, _ = call(admin, "GET", f"/apis/resource.k8s.io/v1/devicetaintrules/{done.rule}",
                     ok=False)  # fmt: skip
    assert status == 404


def test_a_straggler_played_through_the_worker_is_isolated_and_its_pods_evicted(
    admin, executor_process, workers, decisions, tag
):
    """Steps from the job's exporters -> ``stepguard worker`` -> a signed alert -> the
    actuator (auto) -> ``stepguard executor kubernetes``: node-0005 is isolated."""
    from pipeline.client import StepExporter
    from pipeline.tools.simulator import simulate
    from schemas import AlertKind, Grade

    s = executor_process
    sc = scenario(
        f"straggler-{tag}",
        [{"kind": "straggler", "node": 5, "gpu": 2, "onset_step": 40, "magnitude": 0.25}],
    )
    names = [f"node-{i:04d}" for i in range(sc.nodes)]
    for name in names:  # the simulator's node names; only this test makes them
        make_node(admin, name)
    ns = f"worker-{tag}"
    make_namespace(admin, ns)
    make_pod(admin, ns, "rank-5", "node-0005", {JOB_LABEL: sc.job})
    make_pod(admin, ns, "rank-4", "node-0004", {JOB_LABEL: sc.job})
    make_pod(admin, ns, "neighbour-5", "node-0005", {JOB_LABEL: "someone-else"})
    before = {n: node(admin, n)["metadata"]["resourceVersion"] for n in names}

    exporter = StepExporter.direct(
        s, job_id=sc.job, node="node-0000", ranks_per_node=8, register_atexit=False
    )
    for ev in simulate(sc):
        if ev.frame is not None:
            record_frame(exporter, ev.frame)
    assert exporter.close(timeout=30).dropped == 0
    w = workers()
    decisions.wait(firing(AlertKind.STRAGGLER, "node-0005", Grade.CRITICAL), 60, "straggler", w)

    act = Actuator(s)
    try:
        poll_until(act, 1, max_polls=300)

        def isolated(results: list[CommandResult]) -> bool:
            return any(r.executor == "kubernetes" and "node-0005: " in r.detail for r in results)

        for _ in range(300):  # the actuator keeps consuming while the executor works
            act.poll_once(timeout_ms=200)
            results = wait_topic(s, "results", lambda _r: True, max_polls=1)
            if isolated(results):
                break
    finally:
        act.close()
    ours = [r for r in results if r.executor == "kubernetes"]
    assert ours and all(r.status is CommandStatus.SUCCEEDED for r in ours), ours
    n = node(admin, "node-0005")
    assert n["spec"]["unschedulable"] is True and [t["key"] for t in taints(n)] == [TAINT]
    assert n["metadata"]["annotations"]["stepguard.io/job"] == sc.job
    assert pod_state(admin, ns, "rank-5") in ("evicted", "gone")
    assert pod_state(admin, ns, "rank-4") == "running"
    assert pod_state(admin, ns, "neighbour-5") == "running"
    changed = [n for n in names if node(admin, n)["metadata"]["resourceVersion"] != before[n]]
    assert changed == ["node-0005"]
