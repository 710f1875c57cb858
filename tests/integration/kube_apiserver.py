"""A real kube-apiserver (on Debian's etcd) for the Kubernetes executor's tests.

The session fixture :func:`kube` starts one with ``scripts/kube-apiserver.sh`` (TLS, a
token-authenticated admin, RBAC, service-account keys; free loopback ports; state under
pytest's temp folder) and stops it at the end. The binary is built once into
``~/.cache/stepguard/kube-apiserver-v1.37.2/`` (``scripts/kube-apiserver.sh build``,
about 15 CPU-minutes); ``STEPGUARD_TEST_KUBE_APISERVER_BIN`` names another. Without the
binary or etcd the tests skip locally; under ``CI=true`` the script builds what is
missing and a failure fails the run. No kubelet runs: nodes and pods are objects made
here, which is all a cordon, a taint, a condition or an eviction needs.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
DEFAULT_BIN = Path.home() / ".cache/stepguard/kube-apiserver-v1.37.2/kube-apiserver"
SCRIPT = ROOT / "scripts" / "kube-apiserver.sh"
MANIFESTS = ROOT / "deploy" / "kubernetes"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class Kube:
    """A running API server: its URL, CA and the admin's kubeconfig."""

    url: str
    ca_file: Path
    admin_kubeconfig: Path
    home: Path

    def admin(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(str(self.admin_kubeconfig))

    def kubeconfig_for_token(self, token: str, name: str) -> Path:
        """A kubeconfig (mode 0600) that authenticates with ``token``."""
        path = self.home / f"{name}.kubeconfig"
        doc = {
            "apiVersion": "v1", "kind": "Config", "current-context": name,
            "clusters": [{"name": "test", "cluster": {"server": self.url,
                                                      "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": name, "context": {"cluster": "test", "user": name}}],
        }  # fmt: skip
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f)
        return path


def call(api: Any, method: str, path: str, body: Any = None, *, ok: bool = True,
            content_type: str = "application/json") -> tuple[int, dict[str, Any]]:  # fmt: skip
    """One API request as ``api`` (an ApiClient): (HTTP status, JSON body). ``ok``: raise
    unless 2xx."""
    headers = {"Accept": "application/json", "Content-Type": content_type}
    resp = api.call_api(*api.param_serialize(method=method, resource_path=path,
                                             header_params=headers, body=body,
                                             auth_settings=["BearerToken"]),
                        _request_timeout=30)  # fmt: skip
    data = json.loads(resp.read() or b"{}")
    if ok and not 200 <= resp.status < 300:
        raise AssertionError(f"{method} {path}: HTTP {resp.status} {data.get('message')}")
    return resp.status, data


def apply_manifests(api: Any, directory: Path = MANIFESTS) -> list[dict[str, Any]]:
    """Create every object of the YAML files in ``directory`` (the shipped manifests)."""
    paths = {
        "Namespace": "/api/v1/namespaces",
        "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
        "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
        "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    }
    docs = [d for p in sorted(directory.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text())]
    docs.sort(key=lambda d: list(paths).index(d["kind"]))  # namespaces first
    for doc in docs:
        ns = doc["metadata"].get("namespace", "")
        call(api, "POST", paths[doc["kind"]].format(ns=ns), doc)
    return docs


def service_account_token(api: Any, namespace: str, name: str) -> str:
    """A token of the service account from the TokenRequest API (no controller needed)."""
    body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
            "spec": {"expirationSeconds": 3600}}  # fmt: skip
    _, out = call(api, "POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                     body)  # fmt: skip
    return str(out["status"]["token"])


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    """A running kube-apiserver (started here by scripts/kube-apiserver.sh)."""
    binary = Path(os.environ.get("STEPGUARD_TEST_KUBE_APISERVER_BIN") or DEFAULT_BIN)
    missing = [
        what for what, there in [
            (f"kube-apiserver ({binary}; scripts/kube-apiserver.sh build)", binary.is_file()),
            ("etcd (apt-get install -y etcd-server)", shutil.which("etcd") is not None),
        ] if not there
    ]  # fmt: skip
    if missing and not IN_CI:
        pytest.skip("no " + " and no ".join(missing))
    try:
        import kubernetes  # noqa: F401
    except ImportError:
        if IN_CI:
            pytest.fail("CI=true but the kubernetes client is missing (extra 'kubernetes')")
        pytest.skip("the kubernetes client is not installed (pip install 'stepguard[kubernetes]')")
    home = tmp_path_factory.mktemp("kube") / "state"
    env = {
        **os.environ,
        "KUBE_HOME_DIR": str(home),
        "KUBE_APISERVER_BIN": str(binary),
        "KUBE_APISERVER_PORT": str(_free_port()),
        "KUBE_ETCD_PORT": str(_free_port()),
        "KUBE_ETCD_PEER_PORT": str(_free_port()),
    }
    try:
        # under CI a missing binary is built here (cached), a missing etcd installed
        proc = subprocess.run(["bash", str(SCRIPT), "start"], env=env, capture_output=True,
                              text=True, timeout=3600, check=False)  # fmt: skip
        if proc.returncode != 0:
            pytest.fail(f"scripts/kube-apiserver.sh start failed:\n{proc.stderr[-3000:]}",
                        pytrace=False)  # fmt: skip
        lines = dict(x.split("=", 1) for x in proc.stdout.splitlines() if "=" in x)
        yield Kube(lines["KUBE_APISERVER_URL"], Path(lines["KUBE_CA_FILE"]),
                   Path(lines["KUBECONFIG"]), home)  # fmt: skip
    finally:
        subprocess.run(["bash", str(SCRIPT), "stop"], env=env, capture_output=True,
                       timeout=120, check=False)  # fmt: skip
