"""Base class shared by every stepguard message."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict

__all__ = ["Message"]


class Message(BaseModel):
    """A frozen, versioned message.

    Producers send exactly the model; consumers ignore unknown fields so that adding an
    optional field never breaks an older reader. Floats must be finite unless a field
    says otherwise (a NaN loss is a signal, so ``RankSample.loss`` allows it).
    """

    model_config = ConfigDict(
        frozen=True,
        extra="ignore",
        allow_inf_nan=False,
        ser_json_bytes="base64",
        val_json_bytes="base64",
        ser_json_inf_nan="strings",
        use_enum_values=False,
    )

    #: Name used for the committed JSON Schema file and the archive table.
    kind_name: ClassVar[str] = "message"
