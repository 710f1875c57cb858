"""Secrets out of text: what may be logged, printed or archived.

Webhook URLs often carry a token (in the path, the query or the user info), DSNs a
password, settings hold SASL passwords and signing keys. Whatever formats one of them
into a log line, an error or a ``CommandResult.detail`` passes it through here first;
the ``stepguard`` command line also masks every secret of its settings
(:func:`settings_secrets`) in whatever it logs (:class:`RedactingFilter`) or prints
as an error.

>>> url_origin("https://hooks.example.com/services/T0/B0/XYZ?token=abc")
'https://hooks.example.com'
>>> redact("POST http://u:s3cret@h:8080/x failed: s3cret", ["s3cret"])
'POST http://***@h:8080/x failed: ***'
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from pipeline.io.settings import Settings

__all__ = [
    "MASK",
    "RedactingFilter",
    "redact",
    "settings_secrets",
    "url_origin",
    "url_secrets",
]

MASK = "***"
#: The user info of any URL in a text (``scheme://user:password@``).
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)[^/\s@]+@")
#: Shorter values are not searched for: masking every "1" would hide the message.
_MIN_SECRET = 4


def url_origin(url: str) -> str:
    """``scheme://host[:port]`` of ``url``: no user info, path, query or fragment."""
    try:
        parts = urlsplit(url.strip())
        host, port = parts.hostname, parts.port
    except ValueError:
        return "<invalid url>"
    if not parts.scheme or not host:
        return "<invalid url>"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}" + (f":{port}" if port else "")


def url_secrets(url: str) -> list[str]:
    """The parts of ``url`` beyond its origin, where tokens live: the URL itself, its
    user info, password, path and query."""
    try:
        parts = urlsplit(url.strip())
        found = [url, parts.netloc.rpartition("@")[0], parts.password or "", parts.query]
    except ValueError:
        return [url]
    return found + ([parts.path] if parts.path.strip("/") else [])


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with every URL's user info and every one of ``secrets`` masked; a full
    URL among ``secrets`` becomes its origin (``scheme://host[:port]``)."""
    for secret in sorted({s for s in secrets if s and len(s) >= _MIN_SECRET}, key=len)[::-1]:
        if secret not in text:
            continue
        replacement = url_origin(secret) if "://" in secret else MASK
        text = text.replace(secret, replacement)
    return _USERINFO.sub(lambda m: f"{m['scheme']}{MASK}@", text)


def settings_secrets(settings: Settings) -> list[str]:
    """Every secret ``settings`` hold, as the texts to mask: the SASL password, the
    ClickHouse DSN (and its password), each private key (and its key material), each
    webhook URL and the Alertmanager URL (and the parts beyond their origin).

    >>> from pipeline.io.settings import load_settings
    >>> s = load_settings({}, webhook_urls="https://h.example/T0/B0/XYZ-token")
    >>> redact(f"POST {s.webhooks[0]}: refused", settings_secrets(s))
    'POST https://h.example: refused'
    """
    found: list[str] = []
    if settings.kafka_sasl_password is not None:
        found.append(settings.kafka_sasl_password.get_secret_value())
    if settings.clickhouse_dsn is not None:
        found += url_secrets(settings.clickhouse_dsn.get_secret_value())
    for name in type(settings).model_fields:
        if name.endswith("_private_key"):
            secret = getattr(settings, name)
            if secret is not None:
                text = secret.get_secret_value()
                found += [text, text.partition(":")[2].strip()]
    for url in settings.webhooks:
        found += url_secrets(url)
    if settings.alertmanager:
        found += url_secrets(settings.alertmanager)
    return [s for s in found if s]


class RedactingFilter(logging.Filter):
    """A handler filter that masks ``secrets()`` (read once, at the first record) in
    every record's message and traceback before any formatter sees them."""

    def __init__(self, secrets: Callable[[], Iterable[str]]) -> None:
        super().__init__()
        self._source = secrets
        self._secrets: list[str] | None = None

    def filter(self, record: logging.LogRecord) -> bool:
        if self._secrets is None:
            self._secrets = list(self._source())
        try:
            message = record.getMessage()
        except Exception:  # a malformed log call: logging reports it, we must not raise
            return True
        record.msg, record.args = redact(message, self._secrets), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self._secrets)
        return True
