"""Prometheus for stepguard: the shipped rules, and a scrape config for a stack.

Files shipped in this package (``python -m pipeline.tools.prometheus rules`` prints the
path of the rules for your own Prometheus's ``rule_files``):

============================  ==========================================================
file                          what
============================  ==========================================================
stepguard.rules.yml           recording rules and alerts for stepguard's own health:
                              a service down, no worker up, consumer lag growing, dead
                              letters arriving, the circuit breaker open, an action
                              held too long, steps that no worker scores, a job refused
                              over a worker's capacity limit
stepguard.rules.test.yml      ``promtool test rules`` unit tests of those rules
compose.yml                   the scrape config of docker-compose's ``prometheus``
============================  ==========================================================

The rules select targets by scrape job name, one per service kind (:data:`JOBS`):
``stepguard-worker``, ``stepguard-actuator``, ``stepguard-executor``,
``stepguard-archiver``, ``stepguard-alertmanager`` (the Alertmanager bridge), and
``stepguard-job-controller`` (a CommandListener inside
training code; it ends with its job, so it never counts as down). Scrape
stepguard's endpoints under these names, from any service discovery.

``stepguard up --prometheus`` (:func:`scrape_config`, :func:`file_sd`) runs Debian's
``prometheus`` as one more supervised service: loopback only, a 2 s scrape and rule
interval, the targets of the plan in a ``file_sd`` file, its data under the state
dir. ``scripts/prometheus.sh start`` does the same for CI and for any set of
targets. Nothing here imports a Prometheus client; this module only writes files.
"""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path

from pipeline.io.errors import ConfigError
from pipeline.tools.supervisor import ServiceSpec

__all__ = [
    "JOBS",
    "RULES_FILE",
    "file_sd",
    "find_prometheus",
    "job_of",
    "prometheus_for_up",
    "prometheus_service",
    "rules_path",
    "scrape_config",
]

RULES_FILE = "stepguard.rules.yml"
RULES_TEST_FILE = "stepguard.rules.test.yml"

#: scrape job name per service kind (the rules select on these)
JOBS: dict[str, str] = {
    "worker": "stepguard-worker",
    "actuator": "stepguard-actuator",
    "executor": "stepguard-executor",
    "archiver": "stepguard-archiver",
    "alertmanager": "stepguard-alertmanager",
    "simulate": "stepguard-job-controller",
    "job-controller": "stepguard-job-controller",
}


def rules_path(name: str = RULES_FILE) -> Path:
    """The path of a file shipped in this package (installed or in a clone).

    >>> rules_path().name
    'stepguard.rules.yml'
    """
    path = Path(str(resources.files(__name__) / name))
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not shipped (a broken install?)")
    return path


def job_of(service: str) -> str:
    """The scrape job of a service named as ``stepguard up`` names them.

    >>> job_of("worker-2"), job_of("executor-dry-run"), job_of("simulate")
    ('stepguard-worker', 'stepguard-executor', 'stepguard-job-controller')
    """
    for kind, job in JOBS.items():
        if service == kind or service.startswith(kind + "-"):
            return job
    raise ValueError(f"no scrape job for service {service!r}")


def file_sd(ports: Mapping[str, int], host: str = "127.0.0.1") -> list[dict[str, object]]:
    """A ``file_sd`` target list: one group per service, labelled with its job and
    the service's name (``service``).

    >>> file_sd({"worker-1": 9108})
    [{'targets': ['127.0.0.1:9108'], 'labels': {'job': 'stepguard-worker', 'service': 'worker-1'}}]
    """
    return [
        {"targets": [f"{host}:{port}"], "labels": {"job": job_of(name), "service": name}}
        for name, port in ports.items()
    ]


def scrape_config(
    targets_file: Path,
    rules: Sequence[Path] = (),
    *,
    interval_s: float = 2.0,
    alertmanagers: Sequence[str] = (),
) -> str:
    """A ``prometheus.yml``: every target of ``targets_file`` (file_sd, re-read when it
    changes) scraped and the ``rules`` evaluated every ``interval_s``; alerts sent to
    ``alertmanagers`` (``host:port``) when given. JSON is YAML, so this is JSON.
    """
    if interval_s <= 0:
        raise ValueError("interval_s must be positive")
    every = f"{int(interval_s * 1000)}ms"
    timeout = f"{max(1, int(interval_s * 1000 * 0.8))}ms"  # below the interval
    config: dict[str, object] = {
        "global": {
            "scrape_interval": every,
            "scrape_timeout": timeout,
            "evaluation_interval": every,
        },
        "rule_files": [str(p) for p in rules],
        "scrape_configs": [
            {
                # each target group's own ``job`` label wins over this name
                "job_name": "stepguard",
                "file_sd_configs": [{"files": [str(targets_file)], "refresh_interval": "5s"}],
            }
        ],
    }
    if alertmanagers:
        config["alerting"] = {
            "alertmanagers": [{"static_configs": [{"targets": list(alertmanagers)}]}]
        }
    return json.dumps(config, indent=2) + "\n"


def find_prometheus() -> str | None:
    """The ``prometheus`` executable on PATH (Debian: /usr/bin/prometheus), or None."""
    return shutil.which("prometheus")


def _ready(port: int) -> Callable[[], bool]:
    def probe() -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/-/ready", timeout=0.5):
                return True
        except OSError:
            return False

    return probe


def prometheus_service(
    binary: str,
    folder: Path,
    port: int,
    ports: Mapping[str, int],
    *,
    interval_s: float = 2.0,
    retention: str = "7d",
    alertmanagers: Sequence[str] = (),
) -> ServiceSpec:
    """The ``prometheus`` service of ``stepguard up``: writes its config and the
    targets (``ports``: service name to metrics port) under ``folder``, and returns the
    spec that runs ``binary`` on 127.0.0.1:``port`` with its data in ``folder/data``
    (kept across runs), the shipped rules loaded. Stops first (tier 0): nothing
    reports the stack down while it stops.

    Every path in the config is absolute: Prometheus resolves a relative ``file_sd``
    path from the config's own folder, not from where it was started, so a relative
    state dir (the default ``.stepguard``) left it scraping nothing.

    >>> import contextlib, tempfile
    >>> with tempfile.TemporaryDirectory() as tmp, contextlib.chdir(tmp):
    ...     _ = prometheus_service("prometheus", Path("state/prometheus"), 9090, {"worker-1": 1})
    ...     config = json.loads(Path("state/prometheus/prometheus.yml").read_text())
    ...     [sd] = config["scrape_configs"][0]["file_sd_configs"][0]["files"]
    ...     Path(sd).is_absolute() and Path(sd).is_file()
    True
    """
    folder = folder.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    targets = folder / "targets.json"
    targets.write_text(json.dumps(file_sd(ports), indent=2) + "\n")
    config = folder / "prometheus.yml"
    config.write_text(
        scrape_config(targets, [rules_path()], interval_s=interval_s, alertmanagers=alertmanagers)
    )
    argv = (
        binary, f"--config.file={config}", f"--storage.tsdb.path={folder / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}", f"--storage.tsdb.retention.time={retention}",
        "--log.level=warn",
    )  # fmt: skip
    return ServiceSpec("prometheus", argv, stop_tier=0, ready=_ready(port))


def prometheus_for_up(
    asked: bool | None,
    *,
    durable: bool,
    folder: Path,
    take_port: Callable[[str], int],
    ports: Mapping[str, int],
    notes: list[str],
    alertmanagers: Sequence[str] = (),
) -> tuple[ServiceSpec, str] | None:
    """``stepguard up``'s Prometheus service and its URL, or None.

    ``asked``: ``--prometheus`` (True: a missing binary is an error), ``--no-prometheus``
    (False), or neither (None: with ``durable`` when a binary is on PATH, else a note).
    ``ports``: service name to metrics port, the targets; ``alertmanagers``
    (``host:port``) receive the alerts when given.
    """
    if not (durable if asked is None else asked):
        return None
    binary = find_prometheus()
    if binary is None:
        if asked:
            raise ConfigError(
                "--prometheus needs a `prometheus` executable on PATH (Debian: apt-get "
                "install prometheus, or scripts/prometheus.sh install)"
            )
        notes.append(
            "no `prometheus` on PATH: nothing scrapes the services (apt-get install "
            "prometheus; --no-prometheus leaves it out)"
        )
        return None
    port = take_port("prometheus")
    spec = prometheus_service(binary, folder, port, ports, alertmanagers=alertmanagers)
    url = f"http://127.0.0.1:{port}"
    notes.append(f"prometheus: {url}, stepguard's alerting rules every 2 s (data in {folder})")
    return spec, url
