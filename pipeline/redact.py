"""Secrets out of text: what may be logged, printed or archived.

Webhook URLs often carry a token (in the path, the query or the user info), DSNs a
password, settings hold SASL passwords and signing keys. Whatever formats one of them
into a log line, an error or a ``CommandResult.detail`` passes it through here first.

>>> url_origin("https://hooks.example.com/services/T0/B0/XYZ?token=abc")
'https://hooks.example.com'
>>> redact("POST http://u:s3cret@h:8080/x failed: s3cret", ["s3cret"])
'POST http://***@h:8080/x failed: ***'
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit

__all__ = ["MASK", "redact", "url_origin", "url_secrets"]

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
