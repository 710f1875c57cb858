"""Detector settings applied live from signed control messages.

``stepguard calibrate --apply`` publishes the recommended detector settings as a
:class:`~schemas.ControlMessage` with ``detector_settings``, signed with an operator
key, on the control topic. Every worker must see every such change, so the worker does
not read the control topic in its consumer group (that would give each change to one
worker only): :class:`ControlReader` reads it with a plain kafka-python consumer
without a group, from the beginning, in a thread of its own. A worker that starts
therefore replays the history and ends with the latest signed settings (they win over
the ``STEPGUARD_DETECTOR_CONFIG`` file it started from).

:class:`DetectorControl` decides, without I/O, what a change does. It is applied when

- an operator key (``STEPGUARD_OPERATOR_PUBLIC_KEYS``) signed it,
- its ``ts`` is newer than the last change applied and its ``change_id`` is unseen
  (a replayed old change is not applied again; the actuator's rule),
- it is not dated beyond the wall clock + ``STEPGUARD_MAX_CLOCK_SKEW_S`` (judged
  against the earlier of the record's broker time and now, so a change refused when
  it was written is not applied once its time has come), nor older than
  ``STEPGUARD_CONTROL_MAX_AGE_S`` then (an old change published again is refused even
  when every newer one has aged out of the topic), and
- its settings are a valid :class:`~detectors.config.DetectorConfig` (names and values
  checked, the message's reason names the setting).

Anything else is refused, counted and logged; a control message without
``detector_settings`` (the actuator's business) is ignored. An applied change sets
the thresholds of **new** jobs' detectors; a running job keeps the detectors it was
built with (its thresholds are spread over detector objects and its snapshot, which
offer no in-place change) until it ends.

Examples
--------
>>> from datetime import UTC, datetime
>>> from pipeline.io.trust import SigningKey, sign
>>> from schemas import ControlMessage
>>> op = SigningKey.generate("op")
>>> ctl = DetectorControl(op.verifier(), DetectorConfig())
>>> t = datetime(2026, 1, 1, tzinfo=UTC)
>>> msg = sign(ControlMessage(change_id="c1", scope="detector", by="sre", ts=t,
...                           detector_settings={"hang_factor": 4.0}), op)
>>> ctl.on_message(msg, now=t.timestamp()), ctl.config.hang_factor
(None, 4.0)
>>> ctl.on_message(msg, now=t.timestamp())
'change c1 already applied (replay)'
>>> ctl.applied, ctl.refused
(1, 1)
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import Any

from detectors.config import DetectorConfig
from pipeline.io.clockskew import future_dated
from pipeline.io.detector_config import config_from_overrides
from pipeline.io.errors import ConfigError
from pipeline.io.trust import PublicKeys, signature_problem
from schemas import ControlMessage, Rejected, decode

__all__ = ["ControlReader", "DetectorControl"]

log = logging.getLogger(__name__)


class DetectorControl:
    """Which signed detector-settings changes a worker applies (pure: no I/O).

    Parameters
    ----------
    keys
        The operators' public keys; empty: every change is refused.
    config
        The settings new jobs get until a change is applied.
    max_clock_skew_s
        A change dated more than this beyond now is refused; None: no check.
    max_age_s
        A change dated more than this before it reached the topic (or before now) is
        refused; None: no check.
    max_tracked
        Change ids remembered for replay refusal (the oldest forgotten first; the
        ``ts`` rule still refuses anything not newer than the last change applied).
    """

    def __init__(
        self,
        keys: PublicKeys,
        config: DetectorConfig,
        *,
        max_clock_skew_s: float | None = None,
        max_tracked: int = 4096,
        max_age_s: float | None = None,
    ) -> None:
        if max_tracked < 1:
            raise ValueError("max_tracked must be >= 1")
        self.keys = keys
        self.config = config
        self.max_clock_skew_s = max_clock_skew_s
        self.max_age_s = max_age_s
        self.max_tracked = max_tracked
        self.last_ts: datetime | None = None
        self.last_change: str | None = None
        self._seen: OrderedDict[str, None] = OrderedDict()
        self.applied = 0  #: changes applied
        self.refused = 0  #: changes refused (signature, replay, future, invalid)
        self.unreadable = 0  #: control records that did not decode

    def on_message(
        self, msg: ControlMessage, *, now: float, written: float | None = None
    ) -> str | None:
        """Apply ``msg`` if it passes every check: None when applied (or not a detector
        change), else why it was refused. ``now``: the wall clock (epoch seconds);
        ``written``: the record's broker time, when known."""
        if msg.detector_settings is None:
            return None
        problem = self._problem(msg, now, written)
        config: DetectorConfig | None = None
        if problem is None:
            try:
                config = config_from_overrides(msg.detector_settings)
            except ConfigError as exc:
                problem = str(exc)
        if problem is not None or config is None:
            self.refused += 1
            log.warning("not applying detector settings %s from %s: %s", msg.change_id,
                        msg.by, problem)  # fmt: skip
            return problem
        self.config = config
        self.last_ts, self.last_change = msg.ts, msg.change_id
        self._seen[msg.change_id] = None
        while len(self._seen) > self.max_tracked:
            self._seen.popitem(last=False)
        self.applied += 1
        log.info("detector settings %s by %s for new jobs: %s (%s)", msg.change_id,
                 msg.by, dict(msg.detector_settings) or "the defaults",
                 msg.reason or "no reason")  # fmt: skip
        return None

    def _problem(self, msg: ControlMessage, now: float, written: float | None) -> str | None:
        problem = signature_problem(msg, self.keys)
        if problem is not None:
            return problem
        if msg.change_id in self._seen:
            return f"change {msg.change_id} already applied (replay)"
        if self.last_ts is not None and msg.ts <= self.last_ts:
            return f"not newer than the last change applied ({self.last_ts.isoformat()})"
        judged = now if written is None else min(now, written)
        age = judged - msg.ts.timestamp()
        if self.max_age_s is not None and age > self.max_age_s:
            return (
                f"dated {msg.ts.isoformat()}, {age:.0f}s old when it reached the topic "
                f"(STEPGUARD_CONTROL_MAX_AGE_S={self.max_age_s:.0f})"
            )
        return future_dated(msg.ts, self.max_clock_skew_s, now=judged, whose="the worker's")

    def on_record(
        self, raw: bytes | None, *, now: float, written: float | None = None, where: str = ""
    ) -> str | None:
        """:meth:`on_message` of a raw control-topic value; an unreadable one is counted
        and logged (the actuator dead-letters it: one dead letter per record is enough)."""
        msg = decode(ControlMessage, raw)
        if isinstance(msg, Rejected):
            self.unreadable += 1
            log.warning("unreadable control record %s: %s", where, msg.error[:300])
            return msg.error
        return self.on_message(msg, now=now, written=written)

    def counts(self) -> dict[str, int]:
        """For ``stepguard_worker_state_events``."""
        return {
            "detector_settings_applied": self.applied,
            "refused_detector_settings": self.refused,
            "unreadable_control": self.unreadable,
        }


class ControlReader:
    """Reads the control topic from the beginning, without a consumer group, in a
    daemon thread, and hands each record to a :class:`DetectorControl`; after every
    applied change calls ``on_change(config)``, after every record ``on_record()``.

    ``consumer_factory`` builds the kafka-python consumer (``group_id=None``, no
    commits); ``topic`` is the control topic's name.
    """

    def __init__(
        self,
        control: DetectorControl,
        consumer_factory: Callable[[], Any],
        topic: str,
        *,
        on_change: Callable[[DetectorConfig], None],
        on_record: Callable[[], None] = lambda: None,
        clock: Callable[[], float] | None = None,
    ) -> None:
        import time

        self.control = control
        self._factory = consumer_factory
        self.topic = topic
        self._on_change = on_change
        self._on_record = on_record
        self._clock = clock or time.time
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.records = 0
        #: partition -> next offset to read (a reconnect resumes there)
        self._next: dict[int, int] = {}

    def start(self) -> ControlReader:
        self._thread = threading.Thread(target=self._run, name="stepguard-control", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self._read()
            except Exception:  # a broker failure: log, wait, start over (no state lost)
                log.exception("control topic %s: reading failed; retrying", self.topic)
                self._stop.wait(2.0)

    def _read(self) -> None:
        from kafka import TopicPartition

        consumer = self._factory()
        try:
            parts = None
            while not parts and not self._stop.is_set():
                parts = consumer.partitions_for_topic(self.topic)
                if not parts:
                    self._stop.wait(0.5)
            if not parts:
                return
            tps = [TopicPartition(self.topic, p) for p in sorted(parts)]
            consumer.assign(tps)
            for tp in tps:  # resume after a failure where this process left off
                consumer.seek(tp, self._next.get(tp.partition, 0))
            while not self._stop.is_set():
                for tp, records in consumer.poll(timeout_ms=500).items():
                    for rec in records:
                        self._handle(rec)
                        self._next[tp.partition] = rec.offset + 1
        finally:
            consumer.close()

    def _handle(self, rec: Any) -> None:
        before = self.control.applied
        written = rec.timestamp / 1000 if getattr(rec, "timestamp", -1) > 0 else None
        where = f"{rec.topic}[{rec.partition}]@{rec.offset}"
        try:
            self.control.on_record(rec.value, now=self._clock(), written=written, where=where)
            if self.control.applied != before:
                self._on_change(self.control.config)
        except Exception:  # one record never stops the reader
            log.exception("control record %s could not be handled", where)
        self.records += 1
        self._on_record()
