"""The executors' role (``stepguard executor``): :class:`ExecutorSettings`, the webhook
receivers, Slurm and Kubernetes."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings

from pipeline.io.settings._base import MODEL_CONFIG

__all__ = ["ExecutorSettings"]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
#: a Kubernetes label key: an optional DNS-subdomain prefix and a name of 63 at most
_LABEL_KEY = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)


class ExecutorSettings(BaseSettings):
    """Where commands are carried out: webhook receivers (Alertmanager-compatible),
    ``scontrol`` and the Slurm jobs, the Kubernetes API."""

    model_config = MODEL_CONFIG

    #: Prometheus port of an executor (0: off; :mod:`pipeline.io.metrics`)
    executor_metrics_port: int = Field(default=9110, ge=0, le=65535)
    #: comma-separated receiver URLs; secret (they often carry a token), so a repr or
    #: a dump of the settings never shows them: read them through :attr:`webhooks`
    webhook_urls: SecretStr = SecretStr("")
    webhook_timeout_s: float = Field(default=5.0, gt=0)
    webhook_retries: int = Field(default=3, ge=0)
    #: the ``scontrol`` executable used by the Slurm executor
    slurm_scontrol: str = "scontrol"
    #: stepguard job ids that are Slurm jobs, ``job=slurm_job_id[,...]``: RESTART of them
    #: is a requeue (:class:`pipeline.services.actuator.slurm.SlurmJobs`)
    slurm_jobs: str = ""
    #: ... and job ids made of this prefix and a Slurm job id (empty: none)
    slurm_job_prefix: str = Field(default="", max_length=64)
    #: the Kubernetes executor (pipeline/services/actuator/kubernetes.py): its
    #: kubeconfig (None: in-cluster config in a pod, else ~/.kube/config) and context
    kube_config: Path | None = None
    kube_context: str = Field(default="", max_length=253)
    #: the effect of stepguard's taint: NoSchedule (new pods stay off) or NoExecute
    #: (pods without a toleration are evicted by Kubernetes too)
    kube_taint_effect: Literal["NoSchedule", "NoExecute"] = "NoSchedule"
    #: write the condition StepguardHealthy=False (needs nodes/status patch)
    kube_node_condition: bool = True
    #: pod labels whose value is the stepguard job id (the pods a RESTART evicts)
    kube_job_labels: str = (
        "jobset.sigs.k8s.io/jobset-name,training.kubeflow.org/job-name,batch.kubernetes.io/job-name"
    )
    #: namespaces whose pods may be evicted, comma-separated (empty: every namespace)
    kube_namespaces: str = ""
    kube_timeout_s: float = Field(default=30.0, gt=0, le=600)
    #: a fault on one named GPU taints that device (a DRA DeviceTaintRule) instead of
    #: cordoning the node, where the node publishes it (a ResourceSlice of the driver)
    kube_device_taints: bool = False
    kube_dra_driver: str = Field(
        default="gpu.nvidia.com", pattern=r"^[a-z0-9]([-a-z0-9.]{0,61}[a-z0-9])?$"
    )
    #: the device's name in the driver's ResourceSlice, from the GPU index
    kube_dra_device: str = Field(default="gpu-{index}", pattern=r"^[a-z0-9-]*\{index\}[a-z0-9-]*$")

    @field_validator("kube_config")
    @classmethod
    def _check_kube_config(cls, value: Path | None) -> Path | None:
        if value is not None and not value.is_file():
            raise ValueError(f"no such file: {value}")
        return value

    @field_validator("kube_job_labels")
    @classmethod
    def _check_kube_job_labels(cls, value: str) -> str:
        labels = [x.strip() for x in value.split(",") if x.strip()]
        if not labels:
            raise ValueError("expected at least one pod label key")
        for label in labels:
            if not _LABEL_KEY.fullmatch(label):
                raise ValueError(f"{label!r} is not a label key (prefix/name)")
        return ",".join(labels)

    @field_validator("kube_namespaces")
    @classmethod
    def _check_kube_namespaces(cls, value: str) -> str:
        names = [x.strip() for x in value.split(",") if x.strip()]
        for name in names:
            if not _DNS_LABEL.fullmatch(name):
                raise ValueError(f"{name!r} is not a namespace name")
        return ",".join(names)

    @property
    def kube_job_label_keys(self) -> list[str]:
        return [x for x in self.kube_job_labels.split(",") if x]

    @property
    def kube_namespace_list(self) -> list[str]:
        return [x for x in self.kube_namespaces.split(",") if x]

    @property
    def webhooks(self) -> list[str]:
        """The webhook URLs (secrets: log :func:`pipeline.io.redact.url_origin` of them)."""
        urls = self.webhook_urls.get_secret_value()
        return [u.strip() for u in urls.split(",") if u.strip()]
