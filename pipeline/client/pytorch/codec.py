"""Commands as bytes between ranks: rank 0 verified them, the others re-validate; how
many steps apart the exchanges are.

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

__all__ = [
    "MAX_COMMAND_BYTES",
    "MAX_EXCHANGE_STEPS",
    "decode_commands",
    "encode_commands",
    "exchange_gap",
]

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


#: most steps between two command exchanges, whatever the step time
MAX_EXCHANGE_STEPS = 100


def exchange_gap(steps: int, seconds: float, every_s: float) -> int:
    """Steps until the next command exchange, so that one happens about every
    ``every_s`` seconds at the pace of the last ``steps`` steps, which took ``seconds``.

    Launching a collective costs the ranks about a millisecond each on a busy host;
    once per step that is 1-2 % of a 0.1-0.25 s step (measured, 4 CPU ranks).

    >>> exchange_gap(10, 2.5, every_s=1.0)    # 0.25 s steps
    4
    >>> exchange_gap(10, 50.0, every_s=1.0)   # 5 s steps: every step
    1
    >>> exchange_gap(0, 0.0, every_s=1.0), exchange_gap(1000, 1.0, every_s=1.0)
    (1, 100)
    """
    if steps <= 0 or seconds <= 0.0:
        return 1
    return max(1, min(MAX_EXCHANGE_STEPS, int(every_s * steps / seconds)))
