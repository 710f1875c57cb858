"""A secure Apache Kafka for the trust-boundary tests.

``scripts/kafka.sh start --secure`` runs it: SASL_SSL with SCRAM-SHA-512, ACLs enforced
by StandardAuthorizer, one principal per stepguard service (docs/kafka-acls.md). It is
started once per module with its own state folder, ports, topic prefix and consumer
group, and stopped after the module that uses it (a JVM of ~0.5 GB is not kept
for the rest of the run).

- ``STEPGUARD_TEST_SECURE_KAFKA_HOME``: the broker's state folder (``.ci/run`` makes
  one so that its cleanup stops the broker even if pytest dies); default a fresh
  temporary folder.
- ``STEPGUARD_TEST_SECURE_KAFKA_PORT``: the client port (the controller's is the next
  one); default 40592.
- The jars come from ``KAFKA_LIBS_DIR``, or from ``$KAFKA_HOME_DIR/libs-<version>`` when
  the plain broker's folder holds them (CI), so they are never fetched twice.

Under ``CI=true`` a missing Java or a broker that does not start fails the run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pipeline.io.settings import Settings, load_settings
from tests.conftest import IN_CI
from tests.factories import TELEMETRY_SECRET

REPO = Path(__file__).resolve().parents[2]
KAFKA_VERSION = os.environ.get("KAFKA_VERSION", "4.4.0")

#: every service principal the script creates (and `admin`, the super user)
PRINCIPALS = (
    "exporter", "simulator", "worker", "actuator", "executor", "listener", "operator",
    "archiver", "alertmanager",
)  # fmt: skip


@dataclass(frozen=True)
class SecureKafka:
    """A running secure broker: its private folder of env files and certificates."""

    secure_dir: Path
    bootstrap: str
    prefix: str
    group: str
    home: Path  #: the state folder (logs/server.log is the broker's log)

    def env(self, principal: str) -> dict[str, str]:
        """The ``STEPGUARD_*`` variables the script wrote for ``principal``, and the
        tests' cluster telemetry secret (telemetry proofs, as a deployment has them)."""
        text = (self.secure_dir / f"{principal}.env").read_text()
        env = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
        return env | {"STEPGUARD_TELEMETRY_SECRET": TELEMETRY_SECRET}

    def settings(self, principal: str, **updates: Any) -> Settings:
        """Settings as the service builds them: from its principal's env file."""
        return load_settings(self.env(principal), **updates)


def _fail_or_skip(why: str) -> None:
    if IN_CI:
        pytest.fail(f"CI=true but {why}", pytrace=False)
    pytest.skip(why)


def _script_env(home: Path, port: int, prefix: str, group: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPGUARD_")}
    plain_home = os.environ.get("KAFKA_HOME_DIR", "")
    libs = os.environ.get("KAFKA_LIBS_DIR", "")
    if not libs and plain_home:
        shared = Path(plain_home) / f"libs-{KAFKA_VERSION}"
        if (shared / ".complete").exists():
            libs = str(shared)
    env |= {
        "KAFKA_HOME_DIR": str(home),
        "KAFKA_PORT": str(port),
        "KAFKA_CONTROLLER_PORT": str(port + 1),
        "KAFKA_ACL_TOPIC_PREFIX": prefix,
        "KAFKA_ACL_GROUP": group,
    }
    if libs:
        env["KAFKA_LIBS_DIR"] = libs
    else:
        env.pop("KAFKA_LIBS_DIR", None)
    return env


@pytest.fixture(scope="module")
def secure_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureKafka]:
    """``scripts/kafka.sh start --secure`` with a uuid topic prefix and group."""
    if shutil.which("java") is None:
        _fail_or_skip("java is not installed (the secure Kafka needs Java 17+)")
    if shutil.which("openssl") is None:
        _fail_or_skip("openssl is not installed (the secure Kafka makes its certificates)")
    given = os.environ.get("STEPGUARD_TEST_SECURE_KAFKA_HOME", "")
    home = Path(given) if given else tmp_path_factory.mktemp("secure-kafka") / "home"
    port = int(os.environ.get("STEPGUARD_TEST_SECURE_KAFKA_PORT", "40592"))
    tag = uuid.uuid4().hex[:10]
    prefix, group = f"t{tag}.", f"g{tag}"
    env = _script_env(home, port, prefix, group)
    script = ["bash", str(REPO / "scripts" / "kafka.sh")]
    started = subprocess.run(
        [*script, "start", "--secure"],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if started.returncode != 0:
        subprocess.run([*script, "stop"], check=False, env=env, capture_output=True, timeout=120)
        pytest.fail(f"kafka.sh start --secure failed:\n{started.stderr[-4000:]}", pytrace=False)
    out = dict(line.split("=", 1) for line in started.stdout.splitlines() if "=" in line)
    try:
        yield SecureKafka(
            Path(out["KAFKA_SECURE_DIR"]), out["KAFKA_BOOTSTRAP"], prefix, group, home
        )
    finally:
        subprocess.run([*script, "stop"], check=False, env=env, capture_output=True, timeout=120)
