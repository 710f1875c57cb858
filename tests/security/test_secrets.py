"""Threat: whoever reads logs, a settings dump, an error or the archive learns a
secret (webhook URLs carry tokens, DSNs passwords, settings signing keys).

Control: ``webhook_urls`` is a ``SecretStr`` like the DSN, the SASL password and the
private keys; the ``stepguard`` entry point masks every secret of its settings in its
log lines, its error messages and an unexpected traceback (:mod:`pipeline.io.redact`).
What executors and the archive write is covered by
``tests/integration/test_secret_redaction.py``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pipeline.io.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
TOKEN, PASSWORD, SASL = "hook-TOKEN-8417", "dsn-PASSWORD-2291", "sasl-PASSWORD-5530"
ENV = {
    "STEPGUARD_WEBHOOK_URLS": f"https://hooks.example.com/services/{TOKEN}",
    "STEPGUARD_CLICKHOUSE_DSN": f"clickhouse://default:{PASSWORD}@127.0.0.1:9/db",
}


def test_a_settings_repr_or_dump_never_shows_a_webhook_url():
    settings = load_settings(ENV)
    assert settings.webhooks == [ENV["STEPGUARD_WEBHOOK_URLS"]]  # still usable
    for text in (repr(settings), str(settings.model_dump()), settings.model_dump_json()):
        assert TOKEN not in text and PASSWORD not in text


#: the real entry point (``stepguard`` = ``pipeline.cli.app:main``) around a command that
#: logs and fails quoting its secrets, as a careless library or error message would
_FAILING_COMMAND = """
import logging, sys
import pipeline.cli.app as cli
from pipeline.io.errors import StepguardError
from pipeline.io.settings import load_settings

def careless():
    s = load_settings()
    url, dsn = s.webhooks[0], s.clickhouse_dsn.get_secret_value()
    sasl = s.kafka_sasl_password.get_secret_value()
    logging.getLogger("somewhere").warning("POST %s failed", url)
    if sys.argv[1] == "known":
        raise StepguardError(f"cannot reach {dsn} (password {sasl})")
    raise RuntimeError(f"unexpected failure talking to {url} and {dsn}")

cli.app = careless
cli.main()
"""


def _run(kind: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPGUARD_")}
    env |= ENV | {
        "STEPGUARD_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "STEPGUARD_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "STEPGUARD_KAFKA_SASL_USERNAME": "stepguard",
        "STEPGUARD_KAFKA_SASL_PASSWORD": SASL,
    }
    return subprocess.run(
        [sys.executable, "-c", _FAILING_COMMAND, kind], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_command_line_masks_secrets_in_its_logs_and_errors():
    out = _run("known")
    assert out.returncode == 2, out.stderr
    text = out.stdout + out.stderr
    assert "POST https://hooks.example.com failed" in text  # the origin stays: debuggable
    assert "cannot reach" in text and "***" in text
    for secret in (TOKEN, PASSWORD, SASL):
        assert secret not in text, text


def test_an_unexpected_traceback_is_masked_too():
    out = _run("unexpected")
    assert out.returncode == 1, out.stderr
    text = out.stdout + out.stderr
    assert "RuntimeError: unexpected failure" in text
    for secret in (TOKEN, PASSWORD, SASL):
        assert secret not in text, text


def test_a_logged_traceback_is_masked_and_a_malformed_log_call_does_not_raise():
    import io
    import logging

    from pipeline.io.redact import RedactingFilter

    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RedactingFilter(lambda: [PASSWORD]))
    log = logging.getLogger("tests.security.redact")
    log.addHandler(handler)
    log.propagate = False
    try:
        try:
            raise ConnectionError(f"clickhouse://default:{PASSWORD}@db:9000 refused")
        except ConnectionError:
            log.exception("archive write failed")
        log.warning("bad %d", "not a number")  # logging reports it; the filter must not raise
    finally:
        log.removeHandler(handler)
    text = out.getvalue()
    assert "ConnectionError: clickhouse://***@db:9000 refused" in text
    assert PASSWORD not in text
