"""An operator's verdict on an incident: the ground truth calibration learns from.

``stepguard label INCIDENT --true|--false`` writes one :class:`IncidentLabel` into the
archive's ``labels`` table (migration 007); ``stepguard calibrate`` reads the latest
verdict per incident. It is an archive row, not a topic message: nothing acts on it
but calibration, which only scores thresholds with it.

Examples
--------
>>> from datetime import datetime, timezone
>>> t = datetime(2026, 1, 1, tzinfo=timezone.utc)
>>> IncidentLabel(incident="a" * 24, job_id="j", verdict=False, by="sre", ts=t).note
''
>>> try:
...     IncidentLabel(incident="", job_id="j", verdict=True, by="sre", ts=t)
... except ValueError as exc:
...     print(exc.errors()[0]["loc"])
('incident',)
"""

from __future__ import annotations

from typing import Literal

from pydantic import AwareDatetime, Field

from schemas._base import Message

__all__ = ["IncidentLabel"]


class IncidentLabel(Message):
    """A verdict on one incident (``Alert.incident``): was it a real fault?"""

    kind_name = "incident_label"
    schema_version: Literal[1] = 1
    incident: str = Field(min_length=1, max_length=64, description="Alert.incident.")
    job_id: str = Field(min_length=1, max_length=256)
    verdict: bool = Field(description="True: a real fault; False: a false alarm.")
    by: str = Field(min_length=1, max_length=256)
    note: str = Field(default="", max_length=2000)
    ts: AwareDatetime
