"""``stepguard up --durable``: Apache Kafka and Alertmanager started and stopped through
the project's scripts (``scripts/kafka.sh``, ``scripts/alertmanager.sh``), data kept."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from rich.console import Console

from pipeline.io.errors import ConfigError, EmbeddedServiceError


def _kafka_script() -> Path:
    script = Path(__file__).resolve().parents[1] / "scripts" / "kafka.sh"
    if not script.is_file():
        raise ConfigError(f"--durable needs scripts/kafka.sh from a clone ({script} missing)")
    return script


def _start_durable_kafka(log: Path, console: Console) -> str:
    script = _kafka_script()
    log.parent.mkdir(parents=True, exist_ok=True)
    console.print(f"starting Apache Kafka (durable): {script} start --keep-data ...")
    with log.open("ab") as out:
        done = subprocess.run(
            ["bash", str(script), "start", "--keep-data"], stdout=subprocess.PIPE,
            stderr=out, check=False, timeout=900,
        )  # fmt: skip
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    last = lines[-1] if lines else ""
    if done.returncode != 0 or not last.startswith("KAFKA_BOOTSTRAP="):
        why = f"exit {done.returncode}"
        raise EmbeddedServiceError(f"scripts/kafka.sh start failed ({why}); see {log}")
    return last.partition("=")[2].strip()


def _stop_durable_kafka(log: Path) -> None:
    with log.open("ab") as out:
        subprocess.run(
            ["bash", str(_kafka_script()), "stop", "--keep-data"], stdout=out, stderr=out,
            check=False, timeout=120,
        )  # fmt: skip


def _start_durable_alertmanager(state: Path, log: Path, console: Console) -> str:
    """``scripts/alertmanager.sh start --keep-data``, its state under ``state``; the URL."""
    script = _kafka_script().with_name("alertmanager.sh")
    env = os.environ | {"ALERTMANAGER_STATE_DIR": str(state.resolve())}
    console.print(f"starting Alertmanager (durable): {script} start --keep-data ...")
    with log.open("ab") as out:
        done = subprocess.run(
            ["bash", str(script), "start", "--keep-data"], stdout=subprocess.PIPE,
            stderr=out, env=env, check=False, timeout=120,
        )  # fmt: skip
    lines = done.stdout.decode(errors="replace").strip().splitlines()
    last = lines[-1] if lines else ""
    if done.returncode != 0 or not last.startswith("ALERTMANAGER_URL="):
        raise EmbeddedServiceError(
            f"scripts/alertmanager.sh start failed (exit {done.returncode}); see {log}"
        )
    return last.partition("=")[2].strip()


def _stop_durable_alertmanager(state: Path, log: Path) -> None:
    script = _kafka_script().with_name("alertmanager.sh")
    env = os.environ | {"ALERTMANAGER_STATE_DIR": str(state.resolve())}
    with log.open("ab") as out:
        subprocess.run(
            ["bash", str(script), "stop", "--keep-data"], stdout=out, stderr=out, env=env,
            check=False, timeout=60,
        )  # fmt: skip
