"""Commands as bytes between ranks: rank 0 verified them, the others re-validate.

JSON, never pickle: what crosses the process group is plain data, decoded by the same
pydantic model the listener used (``broadcast_object_list`` would unpickle).

>>> from datetime import UTC, datetime
>>> from schemas import ActuatorMode, CommandKind
>>> cmd = Command(command_id="cmd-1", kind=CommandKind.CHECKPOINT, job_id="j", reason=(),
...               mode=ActuatorMode.AUTO, issued_at=datetime(2026, 1, 1, tzinfo=UTC))
>>> [c.kind.value for c in decode_commands(encode_commands([cmd]))]
['checkpoint']
>>> decode_commands(b"")
[]
"""

from __future__ import annotations

import json

from pydantic import TypeAdapter

from schemas import Command

__all__ = ["MAX_COMMAND_BYTES", "decode_commands", "encode_commands"]

#: Largest batch of commands broadcast at one step boundary.
MAX_COMMAND_BYTES = 1 << 20

_LIST = TypeAdapter(list[Command])


def encode_commands(commands: list[Command]) -> bytes:
    """The commands as one JSON array (b"" when there are none)."""
    if not commands:
        return b""
    data = json.dumps([c.model_dump(mode="json") for c in commands]).encode()
    if len(data) > MAX_COMMAND_BYTES:
        raise ValueError(f"{len(commands)} commands take {len(data)} bytes (> {MAX_COMMAND_BYTES})")
    return data


def decode_commands(data: bytes) -> list[Command]:
    """The commands of :func:`encode_commands` (ValueError on anything else)."""
    if not data:
        return []
    if len(data) > MAX_COMMAND_BYTES:
        raise ValueError(f"command batch of {len(data)} bytes (> {MAX_COMMAND_BYTES})")
    return _LIST.validate_json(data)
