"""One GPU out of service instead of its whole node: a DRA ``DeviceTaintRule``.

Where the fault is one GPU (the command's cause names exactly one, ``hardware: GPU 2:
fatal XID 79``) and the cluster hands GPUs out through Dynamic Resource Allocation, the
Kubernetes executor taints that device (``resource.k8s.io/v1`` ``DeviceTaintRule``, GA
in Kubernetes 1.37) rather than cordoning the node: the node's other GPUs keep working.
It is off unless ``STEPGUARD_KUBE_DEVICE_TAINTS=true``; without a ResourceSlice of the
driver (``STEPGUARD_KUBE_DRA_DRIVER``) on the node publishing the device
(``STEPGUARD_KUBE_DRA_DEVICE``, ``gpu-{index}``), the executor falls back to the node.

A rule is stepguard's by its label (:data:`MANAGED_BY`) and its name
(:func:`rule_name`: ``stepguard-<node>-<device>`` and a short hash); resume deletes only
those of the node (label :data:`NODE_LABEL`). The command carries no typed device field:
the GPU index is read from its signed ``cause`` (the alert's kind and evidence).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from pipeline.services.actuator.kube_nodes import TAINT_KEY, provenance, taint_value
from schemas import Command

__all__ = [
    "MANAGED_BY",
    "NODE_LABEL",
    "RULES",
    "SLICES",
    "device_in_slices",
    "device_taint_rule",
    "gpu_index",
    "rule_name",
]

RULES = "/apis/resource.k8s.io/v1/devicetaintrules"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"
MANAGED_BY = ("app.kubernetes.io/managed-by", "stepguard")
NODE_LABEL = "stepguard.io/node"
_GPU = re.compile(r"\bGPU[ _-]?(\d{1,3})\b", re.IGNORECASE)


def gpu_index(cause: str | None) -> int | None:
    """The one GPU a cause names, or ``None`` (none, or several: the node it is).

    >>> gpu_index("hardware: GPU 2: fatal XID 79"), gpu_index("GPU 1 and GPU 3: ECC")
    (2, None)
    >>> gpu_index("hang: no step for 600 s") is None
    True
    """
    found = {int(m) for m in _GPU.findall(cause or "")}
    return found.pop() if len(found) == 1 else None


def rule_name(node: str, device: str) -> str:
    """A DNS-subdomain name for the rule, unique per (node, device).

    >>> rule_name("node-3", "gpu-2")
    'stepguard-node-3-gpu-2-...'
    """
    base = re.sub(r"[^a-z0-9.-]", "-", f"{node}-{device}".lower()).strip("-.")[:200]
    digest = hashlib.sha256(f"{node}\0{device}".encode()).hexdigest()[:8]
    return f"stepguard-{base}-{digest}"


def device_in_slices(
    slices: Mapping[str, Any], node: str, driver: str, device: str
) -> tuple[str, str] | None:
    """(pool, device) of ``device`` in the ResourceSlices of ``driver`` on ``node``
    (a ``ResourceSliceList``), or ``None``: the cluster does not hand it out by DRA."""
    for item in slices.get("items") or ():
        spec = item.get("spec") or {}
        if spec.get("driver") != driver or spec.get("nodeName") != node:
            continue
        if any(d.get("name") == device for d in spec.get("devices") or ()):
            return str((spec.get("pool") or {}).get("name", "")), device
    return None


def device_taint_rule(
    node: str, driver: str, pool: str, device: str, cmd: Command, now: datetime, effect: str
) -> dict[str, Any]:
    """The ``DeviceTaintRule`` that takes one device out, with stepguard's provenance."""
    incident = cmd.incident or (cmd.reason[0] if cmd.reason else cmd.command_id)
    label_node = (
        node if re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", node) else ""
    )
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule_name(node, device),
            "labels": {MANAGED_BY[0]: MANAGED_BY[1], NODE_LABEL: label_node},
            "annotations": provenance(cmd, now),
        },
        "spec": {
            "deviceSelector": {"driver": driver, "pool": pool, "device": device},
            "taint": {"key": TAINT_KEY, "value": taint_value(incident), "effect": effect},
        },
    }
