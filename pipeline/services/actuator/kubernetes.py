"""The Kubernetes executor: cordons and taints it owns, evictions through the job's owner.

=============  ===========================================================================
Command        What :class:`KubernetesExecutor` does (official ``kubernetes`` client)
=============  ===========================================================================
ISOLATE        per target: reads the Node; a node stepguard isolated already, or one
               cordoned or tainted out of service by someone else, is left as it is
               (:func:`~.kube_nodes.foreign_isolation`; the result says whose it is);
               otherwise one merge patch pinned to the node's ``resourceVersion``:
               cordon, stepguard's taint beside the others, provenance annotations
               (:mod:`.kube_nodes`); a 409 reads again and decides again. Then the
               condition ``StepguardHealthy=False`` on ``nodes/status`` (when the role
               may patch it). With replacements (``ISOLATE`` of a replace plan) the job's
               pods on the targets are evicted too
RESTART        with targets: evicts the job's pods on them (Eviction API: a
               PodDisruptionBudget that forbids it is a FAILED result naming the pods);
               the job's controller (JobSet, PyTorchJob, Job) recreates them off the
               cordoned node. Never uncordons. Without targets: not handled here
resume         ``stepguard resume-node X --executor kubernetes``: removes stepguard's
               taint, annotations, condition and its own cordon; a node someone else
               isolated is refused unless ``--force``, which also lifts their cordon but
               never removes a taint of theirs (it is theirs to remove)
=============  ===========================================================================

A job's pods are the pods on the node whose label (one of ``kube_job_labels``, e.g.
``jobset.sigs.k8s.io/jobset-name``) equals the command's job id, in the namespaces of
``kube_namespaces`` (empty: all). Nothing is ever deleted: an eviction is a request the
API server grants only within the pods' disruption budgets.

At start the executor asks the API server (SelfSubjectAccessReview) whether it may do
what it needs (:data:`REQUIRED`) and refuses to start naming what is missing; the
condition needs ``nodes/status`` patch, without which it is left out (logged once).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

from pipeline.io.errors import ConfigError
from pipeline.services.actuator import kube_dra
from pipeline.services.actuator.base import ExecutionError, Executor, validate_node_name
from pipeline.services.actuator.kube_nodes import (
    CONDITION_TYPE,
    IsolateOutcome,
    NodeView,
    ResumeOutcome,
    condition,
    foreign_isolation,
    isolate_patch,
    label_value,
    resume_patch,
    still_isolated,
)
from schemas import Command, CommandKind

__all__ = [
    "DRA",
    "OPTIONAL",
    "REQUIRED",
    "Access",
    "Isolation",
    "KubernetesExecutor",
    "PermissionMissing",
    "Resume",
    "ResumeRefused",
    "load_api_client",
]

log = logging.getLogger(__name__)

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


@dataclass(frozen=True, slots=True)
class Access:
    """One verb on one resource, as a SelfSubjectAccessReview asks it."""

    verb: str
    resource: str
    subresource: str = ""
    group: str = ""

    def describe(self) -> str:
        res = f"{self.resource}/{self.subresource}" if self.subresource else self.resource
        return f"{self.verb} {res}" + (f" ({self.group})" if self.group else "")


#: what the executor cannot work without (deploy/kubernetes/clusterrole.yaml grants it)
REQUIRED = (
    Access("get", "nodes"),
    Access("list", "nodes"),
    Access("patch", "nodes"),
    Access("list", "pods"),
    Access("create", "pods", "eviction"),
)
#: the node condition, where the role may write it
OPTIONAL = (Access("patch", "nodes", "status"),)
#: device taints (``device_taints``): deploy/kubernetes/dra/ grants them
DRA = (
    Access("list", "resourceslices", group="resource.k8s.io"),
    Access("create", "devicetaintrules", group="resource.k8s.io"),
    Access("list", "devicetaintrules", group="resource.k8s.io"),
    Access("delete", "devicetaintrules", group="resource.k8s.io"),
)


class PermissionMissing(ConfigError):
    """The executor's identity lacks a permission it needs (named in the message)."""


class ResumeRefused(ExecutionError):
    """``resume-node`` of a node someone else isolated (``--force`` overrides)."""


@dataclass(frozen=True, slots=True)
class Isolation:
    node: str
    outcome: IsolateOutcome
    after: NodeView
    #: why the condition was not written ("" when it was, or was already there)
    condition_note: str = ""
    #: the DeviceTaintRule of a device taint ("" for the node's own isolation)
    rule: str = ""

    def describe(self) -> str:
        if self.rule:
            return (
                f"{self.node}: {self.outcome.value} (DeviceTaintRule {self.rule}); node in service"
            )
        text = f"{self.node}: {self.outcome.value} ({self.after.describe()})"
        return text + (f" [{self.condition_note}]" if self.condition_note else "")


@dataclass(frozen=True, slots=True)
class Resume:
    node: str
    outcome: ResumeOutcome
    before: NodeView
    after: NodeView | None = None

    def describe(self) -> str:
        if self.outcome is ResumeOutcome.NOT_ISOLATED:
            state = self.before.describe()
            return f"{self.node} is not isolated by stepguard ({state}): nothing to resume"
        now = f", now {self.after.describe()}" if self.after is not None else ""
        text = f"{self.outcome.value} {self.node} (was {self.before.describe()}{now})"
        if self.after is not None and self.after.foreign_taints:
            text += "; others' taints left as they are"
        return text


def load_api_client(kubeconfig: Path | None, context: str = "") -> Any:
    """An ``ApiClient`` from ``kubeconfig`` (and ``context``), else in-cluster config when
    running in a pod, else the default kubeconfig (``~/.kube/config``)."""
    try:
        from kubernetes import client, config
    except ImportError as exc:  # an optional integration
        raise ConfigError(
            "the Kubernetes executor needs the kubernetes client: "
            "pip install 'stepguard[kubernetes]'"
        ) from exc
    try:
        if kubeconfig is not None:
            return config.new_client_from_config(str(kubeconfig), context=context or None)
        try:
            config.load_incluster_config()
            return client.ApiClient()
        except config.ConfigException:
            return config.new_client_from_config(context=context or None)
    except (config.ConfigException, OSError, ValueError) as exc:
        raise ConfigError(f"STEPGUARD_KUBE_CONFIG: cannot load a Kubernetes config: {exc}") from exc


class KubernetesExecutor(Executor):
    """ISOLATE as a cordon + taint stepguard owns, RESTART as evictions (module docstring).

    ``api`` is a ``kubernetes.client.ApiClient``; ``check_access`` asks the API server
    for :data:`REQUIRED` at once (:class:`PermissionMissing` names what is missing).
    """

    name = "kubernetes"

    def __init__(
        self,
        api: Any,
        *,
        taint_effect: str = "NoSchedule",
        node_condition: bool = True,
        job_labels: Iterable[str] = (),
        namespaces: Iterable[str] = (),
        device_taints: bool = False,
        dra_driver: str = "gpu.nvidia.com",
        dra_device: str = "gpu-{index}",
        timeout_s: float = 30.0,
        retries: int = 5,
        check_access: bool = True,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        from kubernetes import client

        if taint_effect not in ("NoSchedule", "NoExecute"):
            raise ValueError(f"taint_effect must be NoSchedule or NoExecute, not {taint_effect!r}")
        if timeout_s <= 0 or retries < 1:
            raise ValueError("timeout_s must be positive and retries >= 1")
        self.api = api
        self.core = client.CoreV1Api(api)
        self.taint_effect = taint_effect
        self.job_labels = tuple(job_labels)
        self.namespaces = tuple(namespaces)
        self.timeout_s = timeout_s
        self.retries = retries
        self._clock = clock
        self.node_condition = node_condition
        self.device_taints = device_taints
        self.dra_driver = dra_driver
        self.dra_device = dra_device
        if check_access:
            needed = REQUIRED + (DRA if device_taints else ())
            try:
                missing = [a for a in needed if not self.allowed(a)]
            except Exception as exc:  # unreachable, TLS, 401: no executor to run
                raise ConfigError(f"cannot ask the Kubernetes API server: {_error(exc)}") from exc
            if missing:
                raise PermissionMissing(
                    "the Kubernetes executor may not "
                    + ", ".join(a.describe() for a in missing)
                    + " (deploy/kubernetes/clusterrole.yaml grants what it needs; device "
                    "taints: deploy/kubernetes/dra/)"
                )
            if node_condition and not all(self.allowed(a) for a in OPTIONAL):
                log.warning(
                    "kubernetes: may not patch nodes/status: no %s condition", CONDITION_TYPE
                )
                self.node_condition = False

    # -- the API ---------------------------------------------------------------------------
    def allowed(self, access: Access) -> bool:
        """Whether this identity may do ``access`` (a SelfSubjectAccessReview)."""
        attrs: dict[str, str] = {"verb": access.verb, "resource": access.resource}
        if access.subresource:
            attrs["subresource"] = access.subresource
        if access.group:
            attrs["group"] = access.group
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attrs}}  # fmt: skip
        out = self._call("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body)
        return bool((out.get("status") or {}).get("allowed"))

    def _call(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json",
        query: list[tuple[str, str]] | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        """One request; the JSON answer as a dict (raises ``ApiException`` on an error)."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        resp = self.api.call_api(
            *self.api.param_serialize(
                method=method, resource_path=path, query_params=query or [],
                header_params=headers, body=body, auth_settings=["BearerToken"],
            ),
            _request_timeout=self.timeout_s,
        )  # fmt: skip
        resp.read()
        if not 200 <= resp.status < 300:
            from kubernetes.client.exceptions import ApiException

            raise ApiException(http_resp=resp)
        out: dict[str, Any] = json.loads(resp.data or b"{}")
        return out

    def _node(self, name: str) -> NodeView:
        return NodeView.of(self._get_node(name))

    def _get_node(self, name: str) -> dict[str, Any]:
        return self._guard(f"read node {name}", lambda: self._call("GET", f"/api/v1/nodes/{name}"))

    def _guard(self, what: str, fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        from kubernetes.client.exceptions import ApiException

        try:
            return fn()
        except ApiException as exc:
            raise ExecutionError(f"{what}: HTTP {exc.status} {_reason(exc)}") from exc
        except _network_errors() as exc:  # connection, TLS, timeout, bad JSON
            raise ExecutionError(f"{what}: {exc}") from exc

    def _patch_node(
        self, name: str, compute: Callable[[NodeView], dict[str, Any] | None]
    ) -> NodeView:
        """Read, compute a patch from what was read, write it pinned to that
        resourceVersion; a 409 (the node changed in between) reads and computes again."""
        from kubernetes.client.exceptions import ApiException

        for _ in range(self.retries):
            view = self._node(name)
            patch = compute(view)
            if not patch:
                return view
            try:
                out = self._call("PATCH", f"/api/v1/nodes/{name}", patch, content_type=MERGE)
            except ApiException as exc:
                if exc.status == 409:
                    continue
                raise ExecutionError(
                    f"patch node {name}: HTTP {exc.status} {_reason(exc)}"
                ) from exc
            except _network_errors() as exc:
                raise ExecutionError(f"patch node {name}: {exc}") from exc
            return NodeView.of(out)
        raise ExecutionError(f"patch node {name}: still conflicting after {self.retries} reads")

    def _patch_condition(self, name: str, body: dict[str, Any]) -> None:
        # conditions merge by type (strategic merge): only StepguardHealthy is written
        self._guard(f"patch node {name} status", lambda: self._call(
            "PATCH", f"/api/v1/nodes/{name}/status", body, content_type=STRATEGIC))  # fmt: skip

    # -- Executor --------------------------------------------------------------------------
    def handles(self, cmd: Command) -> bool:
        if cmd.kind is CommandKind.ISOLATE:
            return True
        return cmd.kind is CommandKind.RESTART and bool(cmd.targets)

    def execute(self, cmd: Command) -> str:
        nodes = [validate_node_name(n) for n in cmd.targets]  # all or nothing
        if not nodes:
            raise ExecutionError(f"{cmd.kind.value} without targets")
        parts = []
        if cmd.kind is CommandKind.ISOLATE:
            parts = [i.describe() for i in self.isolate(cmd)]
        if cmd.kind is CommandKind.RESTART or cmd.replacements:
            parts.append(self.evict_job(cmd.job_id, nodes))
        return "; ".join(parts)

    # -- nodes -----------------------------------------------------------------------------
    def isolate(self, cmd: Command) -> list[Isolation]:
        """Cordon and taint every target nobody isolated; leave the others as they are."""
        out = []
        for node in (validate_node_name(n) for n in cmd.targets):
            tainted = self._taint_device(node, cmd) if self.device_taints else None
            if tainted is not None:
                out.append(tainted)
                log.info("kubernetes: %s", tainted.describe())
                continue
            decided: list[IsolateOutcome] = []

            def compute(
                view: NodeView, decided: list[IsolateOutcome] = decided
            ) -> dict[str, Any] | None:
                decided.clear()
                if view.our_taint is not None or view.our_cordon:
                    decided.append(IsolateOutcome.ALREADY_OURS)
                    return None
                if foreign_isolation(view) is not None:
                    decided.append(IsolateOutcome.ISOLATED_BY_OTHER)
                    return None
                decided.append(IsolateOutcome.ISOLATED)
                return isolate_patch(view, cmd, self._clock(), self.taint_effect)

            after = self._patch_node(node, compute)
            outcome = decided[0]
            note = ""
            if outcome is IsolateOutcome.ISOLATED:
                if self.node_condition:
                    self._patch_condition(
                        node, {"status": {"conditions": [condition(cmd, self._clock())]}}
                    )
                else:
                    note = f"no {CONDITION_TYPE} condition: may not patch nodes/status"
            out.append(Isolation(node, outcome, after, note))
            log.info("kubernetes: %s", out[-1].describe())
        return out

    def _taint_device(self, node: str, cmd: Command) -> Isolation | None:
        """Taint the one GPU the cause names, if the node publishes it through DRA
        (a ResourceSlice of the driver); ``None``: isolate the node instead."""
        index = kube_dra.gpu_index(cmd.cause)
        if index is None:
            return None
        device = self.dra_device.format(index=index)
        query = [("fieldSelector", f"spec.nodeName={node}")]
        slices = self._guard(f"list resourceslices of {node}", lambda: self._call(
            "GET", kube_dra.SLICES, query=query))  # fmt: skip
        found = kube_dra.device_in_slices(slices, node, self.dra_driver, device)
        if found is None:
            log.info("kubernetes: %s publishes no %s device %s: isolating the node",
                     node, self.dra_driver, device)  # fmt: skip
            return None
        pool, device = found
        rule = kube_dra.device_taint_rule(
            node, self.dra_driver, pool, device, cmd, self._clock(), self.taint_effect
        )
        name = rule["metadata"]["name"]
        from kubernetes.client.exceptions import ApiException

        try:
            self._call("POST", kube_dra.RULES, rule)
        except ApiException as exc:
            if exc.status != 409:
                raise ExecutionError(f"create DeviceTaintRule {name}: HTTP {exc.status} "
                                     f"{_reason(exc)}") from exc  # fmt: skip
            view = self._node(node)  # the rule exists: stepguard's name, stepguard's rule
            return Isolation(node, IsolateOutcome.ALREADY_OURS, view, rule=name)
        except _network_errors() as exc:
            raise ExecutionError(f"create DeviceTaintRule {name}: {exc}") from exc
        return Isolation(node, IsolateOutcome.DEVICE_TAINTED, self._node(node), rule=name)

    def _our_rules(self, node: str) -> list[str]:
        selector = f"{'='.join(kube_dra.MANAGED_BY)},{kube_dra.NODE_LABEL}={node}"
        out = self._guard(f"list DeviceTaintRules of {node}", lambda: self._call(
            "GET", kube_dra.RULES, query=[("labelSelector", selector)]))  # fmt: skip
        return [str(r["metadata"]["name"]) for r in out.get("items") or ()]

    def resume(self, node: str, *, force: bool = False) -> Resume:
        """Undo stepguard's isolation of ``node``; someone else's only with ``force``
        (their cordon; their taints never). Raises :class:`ResumeRefused`."""
        node = validate_node_name(node)
        before = self._node(node)
        foreign = foreign_isolation(before)
        rules = self._our_rules(node) if self.device_taints else []
        ours = before.our_taint is not None or before.our_cordon or bool(before.our_annotations)
        ours = ours or bool(rules)
        if foreign is not None and not force:
            raise ResumeRefused(
                f"{node} was isolated by someone else ({foreign}): not resuming it (--force "
                "lifts their cordon; their taints stay theirs)"
            )
        if not ours and foreign is None:
            return Resume(node, ResumeOutcome.NOT_ISOLATED, before)
        if foreign is not None:
            log.warning("resume-node --force: %s was isolated by someone else (%s)", node, foreign)
        for name in rules:
            path = f"{kube_dra.RULES}/{name}"
            self._guard(f"delete DeviceTaintRule {name}", partial(self._call, "DELETE", path))
        self._patch_node(node, lambda view: resume_patch(view, force=force))
        if before.our_condition is not None:
            directive = {"type": CONDITION_TYPE, "$patch": "delete"}
            self._patch_condition(node, {"status": {"conditions": [directive]}})
        # what took effect, not what was answered: an admission policy, a controller or
        # another tool may have put the node back out of service
        after = self._node(node)
        left = still_isolated(
            before, after, self._our_rules(node) if rules else [], force=foreign is not None
        )
        if left:
            raise ExecutionError(
                f"the API server accepted the resume but {node} is still isolated: "
                f"{'; '.join(left)} (read back: {after.describe()})"
            )
        outcome = ResumeOutcome.FORCED if foreign is not None else ResumeOutcome.RESUMED
        log.info("%s %s (was %s)", outcome.value, node, before.describe())
        return Resume(node, outcome, before, after)

    # -- pods ------------------------------------------------------------------------------
    def job_pods(self, job_id: str, node: str) -> list[dict[str, Any]]:
        """The job's pods on ``node``: labelled with the job id under one of the job
        labels, in the allowed namespaces (a job id that is no label value has none)."""
        value = label_value(job_id)
        if value is None:
            return []
        found: dict[str, dict[str, Any]] = {}
        field = f"spec.nodeName={node}"
        for label in self.job_labels:
            query = [("fieldSelector", field), ("labelSelector", f"{label}={value}")]
            for ns in self.namespaces or ("",):
                path = f"/api/v1/namespaces/{ns}/pods" if ns else "/api/v1/pods"
                got = self._guard(
                    f"list pods on {node}", partial(self._call, "GET", path, query=query)
                )
                for pod in got.get("items") or ():
                    meta = pod.get("metadata") or {}
                    if (pod.get("spec") or {}).get("nodeName") != node:
                        continue  # the selector said so; trust nothing
                    if (meta.get("labels") or {}).get(label) != value:
                        continue
                    found[f"{meta.get('namespace')}/{meta.get('name')}"] = pod
        return [found[k] for k in sorted(found)]

    def evict_job(self, job_id: str, nodes: Iterable[str]) -> str:
        """Evict the job's pods on ``nodes`` (Eviction API); raises naming the pods a
        disruption budget (or anything else) kept."""
        from kubernetes.client.exceptions import ApiException

        evicted, terminating, blocked = [], [], []
        for node in nodes:
            for pod in self.job_pods(job_id, node):
                meta = pod["metadata"]
                ns, name = str(meta.get("namespace")), str(meta.get("name"))
                if meta.get("deletionTimestamp"):
                    terminating.append(f"{ns}/{name}")
                    continue
                body = {"apiVersion": "policy/v1", "kind": "Eviction",
                        "metadata": {"name": name, "namespace": ns}}  # fmt: skip
                try:
                    self._call("POST", f"/api/v1/namespaces/{ns}/pods/{name}/eviction", body)
                    evicted.append(f"{ns}/{name}")
                except ApiException as exc:
                    if exc.status == 404:
                        terminating.append(f"{ns}/{name}")  # gone meanwhile
                    else:
                        blocked.append(f"{ns}/{name} (HTTP {exc.status} {_reason(exc)})")
                except _network_errors() as exc:
                    blocked.append(f"{ns}/{name} ({exc})")
        text = f"evicted {len(evicted)} pod(s) of job {job_id}" + (
            f": {', '.join(evicted)}" if evicted else ""
        )
        if terminating:
            text += f"; already going: {', '.join(terminating)}"
        if not evicted and not terminating:
            text = f"no pods of job {job_id} on the targets (labels {', '.join(self.job_labels)})"
        if blocked:
            raise ExecutionError(f"{text}; not evicted: {'; '.join(blocked)}")
        return text


def _network_errors() -> tuple[type[BaseException], ...]:
    """What a request raises short of an HTTP answer (urllib3's errors are no OSError)."""
    from urllib3.exceptions import HTTPError

    return (OSError, ValueError, HTTPError)


def _error(exc: BaseException) -> str:
    status = getattr(exc, "status", None)
    if status:
        return f"HTTP {status} {_reason(exc)}"
    return f"{type(exc).__name__}: {exc}"[:300]


def _reason(exc: Any) -> str:
    """The API server's message from an ``ApiException`` (its Status body), bounded."""
    try:
        body = json.loads(exc.body or b"{}")
        text = str(body.get("message") or exc.reason or "")
    except (ValueError, AttributeError):
        text = str(getattr(exc, "reason", "") or "")
    return text[:300]
