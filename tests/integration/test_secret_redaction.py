"""Secrets are never printed or archived (issue 14 item 8): a webhook URL carrying a
token and a DSN carrying a password go through their failure paths, and neither the
logs, the error text, the published CommandResult nor the archived row holds them."""

from __future__ import annotations

import logging
import socket
import traceback
from datetime import UTC, datetime, timedelta

import pytest
from typer.testing import CliRunner

import pipeline.services.actuator.executors as executors
from pipeline.cli.app import app
from pipeline.io.errors import ArchiveError
from pipeline.io.redact import url_origin
from pipeline.io.settings import load_settings
from pipeline.io.trust import FinishedCommands
from pipeline.services.actuator.executors import ExecutorRunner, WebhookExecutor
from pipeline.services.archive import open_backend, rows_for
from schemas import ActuatorMode, Command, CommandKind, CommandStatus

pytestmark = pytest.mark.integration

SECRETS = ("TOKEN-pass-1234", "SECRET-PATH-5678", "SECRET-Q-9012", "DSN-PW-3456")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _assert_clean(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, (secret, text)


def test_an_unreachable_webhook_names_only_its_origin(archive, caplog, monkeypatch):
    port = _closed_port()
    urls = [
        f"http://hookuser:TOKEN-pass-1234@127.0.0.1:{port}/services/SECRET-PATH-5678",
        f"http://127.0.0.1:{port}/hooks/SECRET-PATH-5678?token=SECRET-Q-9012",
    ]
    executor = WebhookExecutor(urls, timeout_s=2, retries=1, sleep=lambda _s: None)
    # the runner's own checks (signatures, topics) are tested elsewhere: here only
    # what it makes of a failing webhook
    runner = ExecutorRunner.__new__(ExecutorRunner)
    runner.executor, runner.done, runner._keys = executor, FinishedCommands(100), []
    runner._clock = lambda: datetime.now(UTC)
    runner.settings = load_settings({})
    monkeypatch.setattr(executors, "check_command", lambda *_a: None)
    now = datetime.now(UTC)
    cmd = Command(
        command_id="cmd-secret", kind=CommandKind.NOTIFY, job_id="job-1", reason=("fp",),
        mode=ActuatorMode.AUTO, issued_at=now, expires_at=now + timedelta(minutes=5),
    )  # fmt: skip
    with caplog.at_level(logging.DEBUG):
        result = runner.result_for(cmd)
    assert result is not None and result.status is CommandStatus.FAILED
    assert f"127.0.0.1:{port}" in result.detail and url_origin(urls[0]) in result.detail
    for table, cols in rows_for([(result, 0)]).items():
        archive.insert(table, cols)
    _, rows = archive.query(f"SELECT * FROM {archive.database}.command_results FINAL")
    assert len(rows) == 1
    _assert_clean(caplog.text, result.detail, result.model_dump_json(), repr(rows))
    with pytest.raises(ValueError) as bad:
        WebhookExecutor(["ftp://u:TOKEN-pass-1234@h/SECRET-PATH-5678"])
    _assert_clean(str(bad.value))


def test_an_unreachable_clickhouse_dsn_never_shows_its_password(caplog):
    dsn = f"clickhouse://default:DSN-PW-3456@127.0.0.1:{_closed_port()}/default"
    env = {"STEPGUARD_CLICKHOUSE_DSN": dsn}
    backend = open_backend(load_settings(env))
    with caplog.at_level(logging.DEBUG), pytest.raises(ArchiveError) as failed:
        backend.query("SELECT 1")
    assert "127.0.0.1" in str(failed.value)
    printed = CliRunner().invoke(app, ["sql", "SELECT 1"], env=env)
    assert isinstance(printed.exception, ArchiveError)
    _assert_clean(
        caplog.text,
        "".join(traceback.format_exception(failed.value)),
        printed.output,
        str(printed.exception),
    )
    with pytest.raises(ArchiveError) as bad:
        open_backend(
            load_settings({"STEPGUARD_CLICKHOUSE_DSN": "clickhouse://u:DSN-PW-3456@h:x/d"})
        )
    _assert_clean(str(bad.value))
