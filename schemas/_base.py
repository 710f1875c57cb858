"""Base class shared by every stepguard message."""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["KEY_ID_PATTERN", "SIGNATURE_PATTERN", "KeyId", "Message", "Signature"]

#: A signing key's id: short, printable, safe to log.
KEY_ID_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"
#: An Ed25519 signature: 64 bytes as 128 lowercase hex characters.
SIGNATURE_PATTERN = r"^[0-9a-f]{128}$"

KeyId = Annotated[
    str, Field(max_length=64, pattern=KEY_ID_PATTERN, description="Id of the signing key.")
]
Signature = Annotated[
    str,
    Field(
        min_length=128, max_length=128, pattern=SIGNATURE_PATTERN,
        description="Ed25519 signature of the canonical JSON, 128 lowercase hex characters.",
    ),
]  # fmt: skip


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
