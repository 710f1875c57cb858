"""The pure half of the Kubernetes executor: taints, provenance, whose a node's state is.

The executor against a real API server: tests/integration/test_kubernetes.py.
"""

from __future__ import annotations

import doctest
from datetime import UTC, datetime, timedelta

import pytest

from pipeline.io.errors import ConfigError
from pipeline.io.settings import load_settings
from pipeline.services.actuator import kube_nodes
from pipeline.services.actuator.executors import EXECUTORS
from pipeline.services.actuator.kube_nodes import (
    CORDONED,
    TAINT_KEY,
    NodeView,
    condition,
    foreign_isolation,
    isolate_patch,
    provenance,
    resume_patch,
    with_taint,
    without_ours,
)
from schemas import ActuatorMode, Command, CommandKind

NOW = datetime.now(UTC)
ADMIN = {"key": "admin.example.com/psu", "value": "ticket-42", "effect": "NoSchedule"}
GPU_POOL = {"key": "nvidia.com/gpu", "effect": "NoSchedule"}


def cmd(**over) -> Command:
    base = dict(
        command_id="cmd-isolate-1", kind=CommandKind.ISOLATE, job_id="llm-7",
        targets=("node-3",), reason=("fp-1",), mode=ActuatorMode.AUTO, issued_at=NOW,
        expires_at=NOW + timedelta(minutes=5), cause="hardware: GPU 2: fatal XID 79",
        incident="1a2b3c4d5e6f7a8b9c0d", key_id="actuator-20261207",
    )  # fmt: skip
    return Command(**(base | over))


def node(unschedulable=False, taints=(), annotations=None, rv="41") -> dict:
    return {
        "metadata": {"name": "node-3", "resourceVersion": rv, "annotations": annotations or {}},
        "spec": {"unschedulable": unschedulable, "taints": list(taints)},
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_doctests():
    assert doctest.testmod(kube_nodes, optionflags=doctest.ELLIPSIS).failed == 0


def test_our_taint_goes_beside_the_others_which_stay_as_they_are_and_in_order():
    ours = {"key": TAINT_KEY, "value": "i1", "effect": "NoSchedule"}
    old = {"key": TAINT_KEY, "value": "i0", "effect": "NoExecute"}
    assert with_taint([ADMIN, old, GPU_POOL], ours) == [ADMIN, GPU_POOL, ours]
    assert without_ours([ADMIN, old, GPU_POOL]) == [ADMIN, GPU_POOL]
    assert without_ours([]) == []


def test_the_isolate_patch_cordons_taints_annotates_and_pins_the_resource_version():
    view = NodeView.of(node(taints=[GPU_POOL]))
    patch = isolate_patch(view, cmd(), NOW)
    assert patch["metadata"]["resourceVersion"] == "41"
    assert patch["spec"]["unschedulable"] is True
    assert patch["spec"]["taints"] == [
        GPU_POOL, {"key": TAINT_KEY, "value": "1a2b3c4d5e6f7a8b9c0d", "effect": "NoSchedule"},
    ]  # fmt: skip
    notes = patch["metadata"]["annotations"]
    assert notes[CORDONED] == "true"  # the cordon is ours: resume may lift it
    assert notes["stepguard.io/isolated-by"] == "stepguard (actuator key actuator-20261207)"
    assert notes["stepguard.io/cause"] == "hardware: GPU 2: fatal XID 79"
    assert notes["stepguard.io/incident"] == "1a2b3c4d5e6f7a8b9c0d"
    assert notes["stepguard.io/command-id"] == "cmd-isolate-1"
    assert notes["stepguard.io/isolated-at"] == NOW.isoformat(timespec="seconds")


def test_a_noexecute_taint_carries_its_time_added():
    patch = isolate_patch(NodeView.of(node()), cmd(), NOW, effect="NoExecute")
    [taint] = patch["spec"]["taints"]
    assert taint["effect"] == "NoExecute" and taint["timeAdded"].endswith("Z")


def test_provenance_is_bounded_and_falls_back_to_the_summary_without_a_cause():
    notes = provenance(cmd(cause=None, summary="replace node-3 with spare-0"), NOW)
    assert notes["stepguard.io/cause"] == "replace node-3 with spare-0"
    long = provenance(cmd(cause="x" * 500, job_id="j" * 256), NOW)
    assert all(len(v) <= 1024 for v in long.values())


def test_whose_isolation_it_is():
    # someone's cordon, or their NoExecute / out-of-service taint: theirs
    assert foreign_isolation(NodeView.of(node(unschedulable=True))) == "cordoned"
    nox = {"key": "example.com/maintenance", "effect": "NoExecute"}
    assert foreign_isolation(NodeView.of(node(taints=[nox]))) is not None
    oos = {"key": "node.kubernetes.io/out-of-service", "effect": "NoSchedule"}
    assert foreign_isolation(NodeView.of(node(taints=[oos]))) is not None
    # a dedicated pool's NoSchedule taint is no isolation
    assert foreign_isolation(NodeView.of(node(taints=[GPU_POOL]))) is None
    # our cordon, and the taint the node controller adds for a cordon: not foreign
    controller = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    ours = node(unschedulable=True, annotations={CORDONED: "true"}, taints=[controller])
    assert foreign_isolation(NodeView.of(ours)) is None
    # an annotation without the cordon claims nothing
    assert foreign_isolation(NodeView.of(node(annotations={CORDONED: "true"}))) is None
    assert not NodeView.of(node(annotations={CORDONED: "true"})).our_cordon


def test_resume_removes_only_what_is_ours():
    isolated = isolate_patch(NodeView.of(node(taints=[GPU_POOL])), cmd(), NOW)
    notes = {**isolated["metadata"]["annotations"], "team": "infra"}
    after = node(unschedulable=True, taints=isolated["spec"]["taints"], annotations=notes, rv="42")
    patch = resume_patch(NodeView.of(after))
    assert patch["spec"] == {"taints": [GPU_POOL], "unschedulable": None}
    assert patch["metadata"]["resourceVersion"] == "42"
    removed = patch["metadata"]["annotations"]
    assert set(removed) == set(isolated["metadata"]["annotations"]) and "team" not in removed
    assert all(v is None for v in removed.values())


def test_resume_never_lifts_someone_elses_cordon_unless_forced_nor_their_taint_ever():
    theirs = NodeView.of(node(unschedulable=True, taints=[ADMIN]))
    assert resume_patch(theirs) == {}
    forced = resume_patch(theirs, force=True)
    assert forced["spec"] == {"unschedulable": None}  # their taint is not in the patch
    # our taint on a node they cordoned: ours goes, their cordon and taint stay
    mixed = NodeView.of(
        node(unschedulable=True, taints=[ADMIN, {"key": TAINT_KEY, "effect": "NoSchedule"}])
    )
    assert resume_patch(mixed)["spec"] == {"taints": [ADMIN]}
    # our last taint gone: the list is removed, not left empty
    only = NodeView.of(node(taints=[{"key": TAINT_KEY, "effect": "NoSchedule"}]))
    assert resume_patch(only)["spec"] == {"taints": None}


def test_the_condition_says_false_with_the_cause():
    cond = condition(cmd(), NOW)
    assert (cond["type"], cond["status"], cond["reason"]) == (
        "StepguardHealthy", "False", "StepguardIsolated",
    )  # fmt: skip
    assert "fatal XID 79" in cond["message"] and "cmd-isolate-1" in cond["message"]


def test_kubernetes_is_a_registered_executor_and_its_settings_fail_fast_naming_the_field():
    assert {"dry-run", "slurm", "webhook", "kubernetes"} <= set(EXECUTORS)
    s = load_settings({"STEPGUARD_KUBE_JOB_LABELS": " jobset.sigs.k8s.io/jobset-name , app "})
    assert s.kube_job_label_keys == ["jobset.sigs.k8s.io/jobset-name", "app"]
    for env, field in [
        ({"STEPGUARD_KUBE_TAINT_EFFECT": "PreferNoSchedule"}, "STEPGUARD_KUBE_TAINT_EFFECT"),
        ({"STEPGUARD_KUBE_JOB_LABELS": "a=b"}, "STEPGUARD_KUBE_JOB_LABELS"),
        ({"STEPGUARD_KUBE_JOB_LABELS": ""}, "STEPGUARD_KUBE_JOB_LABELS"),
        ({"STEPGUARD_KUBE_NAMESPACES": "Team_A"}, "STEPGUARD_KUBE_NAMESPACES"),
        ({"STEPGUARD_KUBE_CONFIG": "/nonexistent/kubeconfig"}, "STEPGUARD_KUBE_CONFIG"),
    ]:
        with pytest.raises(ConfigError, match=field):
            load_settings(env)


def test_a_device_taint_names_the_one_gpu_of_the_cause_and_carries_provenance():
    from pipeline.services.actuator import kube_dra

    assert doctest.testmod(kube_dra, optionflags=doctest.ELLIPSIS).failed == 0
    assert kube_dra.gpu_index("xid: GPU 7: XID 48 (DBE)") == 7
    assert kube_dra.gpu_index("GPU 2 and gpu 2 again") == 2
    assert kube_dra.gpu_index(None) is None
    slices = {"items": [
        {"spec": {"driver": "other.example.com", "nodeName": "node-3", "pool": {"name": "x"},
                  "devices": [{"name": "gpu-2"}]}},
        {"spec": {"driver": "gpu.nvidia.com", "nodeName": "node-3", "pool": {"name": "node-3"},
                  "devices": [{"name": "gpu-0"}, {"name": "gpu-2"}]}},
    ]}  # fmt: skip
    assert kube_dra.device_in_slices(slices, "node-3", "gpu.nvidia.com", "gpu-2") == (
        "node-3", "gpu-2",
    )  # fmt: skip
    assert kube_dra.device_in_slices(slices, "node-3", "gpu.nvidia.com", "gpu-5") is None
    assert kube_dra.device_in_slices(slices, "node-4", "gpu.nvidia.com", "gpu-2") is None
    rule = kube_dra.device_taint_rule("node-3", "gpu.nvidia.com", "node-3", "gpu-2", cmd(), NOW,
                                      "NoSchedule")  # fmt: skip
    assert rule["spec"]["deviceSelector"] == {
        "driver": "gpu.nvidia.com", "pool": "node-3", "device": "gpu-2",
    }  # fmt: skip
    assert rule["spec"]["taint"]["key"] == TAINT_KEY
    assert rule["metadata"]["labels"] == {
        "app.kubernetes.io/managed-by": "stepguard", "stepguard.io/node": "node-3",
    }  # fmt: skip
    assert rule["metadata"]["annotations"]["stepguard.io/cause"] == "hardware: GPU 2: fatal XID 79"
    assert kube_dra.rule_name("node-3", "gpu-2") != kube_dra.rule_name("node-3", "gpu-1")


def test_the_executor_refuses_to_start_without_a_reachable_api_server(tmp_path, monkeypatch):
    """Before any broker: a kubeconfig that loads but reaches no API server is a
    ConfigError (one line, exit 2 from ``stepguard``), never a traceback."""
    from typer.testing import CliRunner

    from pipeline.cli.app import app

    with socket_closed_port() as port:
        config = tmp_path / "kubeconfig"
        config.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
            f"clusters: [{{name: k, cluster: {{server: 'https://127.0.0.1:{port}'}}}}]\n"
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
        )
        monkeypatch.setenv("STEPGUARD_KUBE_CONFIG", str(config))
        monkeypatch.setenv("STEPGUARD_KUBE_TIMEOUT_S", "2")
        result = CliRunner().invoke(app, ["executor", "kubernetes"])
    assert isinstance(result.exception, ConfigError), result.output
    assert "cannot ask the Kubernetes API server" in str(result.exception)
    bogus = CliRunner().invoke(app, ["executor", "bogus"])
    assert bogus.exit_code == 2 and "kubernetes" in bogus.output


def socket_closed_port():
    """A context manager giving a loopback port nothing listens on."""
    import contextlib
    import socket

    @contextlib.contextmanager
    def closed():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        yield port

    return closed()
