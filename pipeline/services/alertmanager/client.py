"""``POST /api/v2/alerts`` with retries: the only HTTP the Alertmanager bridge does.

=====================  ==================================================================
answer                 what happens
=====================  ==================================================================
2xx                    done
4xx (not 408, 429)     not retried (Alertmanager will not change its mind): the body
                       (Alertmanager's reason, e.g. a Go unmarshal error) is logged and
                       the batch counts as rejected; the bridge goes on
5xx, 408, 429, network retried ``retries`` times with exponential backoff (``backoff_s``
                       doubling, at most ``max_backoff_s``); then
                       :class:`AlertmanagerUnavailable`: the service exits non-zero
                       without committing, for its supervisor to restart it
=====================  ==================================================================

The URL may carry credentials: logs and errors name only its origin.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pipeline.io.errors import StepguardError
from pipeline.io.redact import redact, url_origin, url_secrets
from pipeline.services.alertmanager.episodes import PostableAlert

__all__ = ["AlertSink", "AlertmanagerClient", "AlertmanagerUnavailable", "PostOutcome"]

log = logging.getLogger(__name__)
_BODY_LOGGED = 2000


class AlertmanagerUnavailable(StepguardError):
    """Alertmanager did not accept a batch after every retry (5xx or unreachable)."""


@dataclass(frozen=True)
class PostOutcome:
    """What became of one :meth:`AlertmanagerClient.post` call."""

    sent: int = 0
    rejected: int = 0
    #: the last refusal: ``HTTP 400: <body>``
    error: str = ""


class AlertSink(Protocol):
    """Where the bridge posts (:class:`AlertmanagerClient`; tests record instead)."""

    def post(self, alerts: Sequence[PostableAlert]) -> PostOutcome: ...


class AlertmanagerClient:
    """Posts PostableAlerts to one Alertmanager (urllib; no new dependency).

    Parameters
    ----------
    base_url
        ``http(s)://host:port[/prefix]`` (``/api/v2/alerts`` is appended).
    batch
        Alerts per POST at most.
    sleep
        Waits between retries (tests pass a recorder).
    """

    def __init__(
        self,
        base_url: str,
        *,
        timeout_s: float = 5.0,
        retries: int = 3,
        backoff_s: float = 0.5,
        max_backoff_s: float = 10.0,
        batch: int = 500,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url: {url_origin(base_url)} is not http(s)")
        if timeout_s <= 0 or retries < 0 or backoff_s < 0 or batch < 1:
            raise ValueError("timeout_s > 0, retries >= 0, backoff_s >= 0, batch >= 1")
        self.url = base_url.rstrip("/") + "/api/v2/alerts"
        self.origin = url_origin(base_url)
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self.batch = batch
        self._secrets = url_secrets(base_url)
        self._sleep = sleep

    def post(self, alerts: Sequence[PostableAlert]) -> PostOutcome:
        """Post ``alerts`` in batches; raises :class:`AlertmanagerUnavailable`."""
        sent = rejected = 0
        error = ""
        for i in range(0, len(alerts), self.batch):
            chunk = alerts[i : i + self.batch]
            body = json.dumps([a.json() for a in chunk]).encode()
            refusal = self._post(body)
            if refusal is None:
                sent += len(chunk)
            else:
                rejected += len(chunk)
                error = refusal
                names = sorted({a.labels.get("alertname", "?") for a in chunk})
                log.error("Alertmanager %s refused %d alert(s) (%s): %s", self.origin,
                          len(chunk), ", ".join(names), refusal)  # fmt: skip
        return PostOutcome(sent, rejected, error)

    def _post(self, body: bytes) -> str | None:
        """None when accepted; the refusal of a 4xx; raises after the last retry."""
        error = ""
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(min(self.max_backoff_s, self.backoff_s * 2 ** (attempt - 1)))
            req = urllib.request.Request(  # noqa: S310 - scheme checked in __init__
                self.url, data=body, method="POST",
                headers={"Content-Type": "application/json"},
            )  # fmt: skip
            try:
                with urllib.request.urlopen(req, timeout=self.timeout_s):  # noqa: S310
                    return None  # urlopen raises HTTPError for anything but 2xx/3xx
            except urllib.error.HTTPError as exc:
                text = self._body(exc)
                error = f"HTTP {exc.code}: {text}" if text else f"HTTP {exc.code}"
                if 400 <= exc.code < 500 and exc.code not in (408, 429):
                    return error
            except (urllib.error.URLError, OSError, ValueError) as exc:
                error = redact(str(getattr(exc, "reason", exc)), self._secrets)
            log.warning("Alertmanager %s attempt %d/%d failed: %s", self.origin, attempt + 1,
                        self.retries + 1, error)  # fmt: skip
        raise AlertmanagerUnavailable(
            f"Alertmanager {self.origin} did not accept alerts after {self.retries + 1} "
            f"attempt(s): {error}"
        )

    def _body(self, exc: urllib.error.HTTPError) -> str:
        try:
            raw = exc.read(_BODY_LOGGED)
        except OSError:
            return ""
        return redact(raw.decode("utf-8", errors="replace").strip(), self._secrets)
