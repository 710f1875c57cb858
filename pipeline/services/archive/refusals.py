"""Which insert errors are the rows' fault: the archiver never stops on data.

An insert fails for one of two reasons. Either ClickHouse refuses the *data* (a value
beyond a column's type, text it cannot parse, an Enum element the column lacks, a
block spread over too many partitions): sending the same rows again gets the same
answer, so they go to the dead-letter topic (halved until the smallest set that fails
is found, and the rest stored) and the archiver goes on. Or the server is down or
unwell (a socket error, a timeout, memory, too many parts waiting to merge): those are
retried with backoff, and only they may end the service.

The codes are ClickHouse's own (``src/Common/ErrorCodes.cpp``), the same on 18.16 and
on chDB's engine; chDB reports them in its message (``Code: 252. DB::Exception: ...``),
clickhouse-driver as ``ServerException.code``, and the driver's own client-side checks
(it converts each value before sending) as its error classes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["DATA_ERROR_CODES", "code_of", "is_data_error", "refused_value"]

#: ClickHouse error codes that refuse the values of the rows, never the server's state.
DATA_ERROR_CODES: dict[int, str] = {
    6: "CANNOT_PARSE_TEXT",
    26: "CANNOT_PARSE_QUOTED_STRING",
    27: "CANNOT_PARSE_INPUT_ASSERTION_FAILED",
    36: "BAD_ARGUMENTS",  # 18.16-era servers: an Enum element the column lacks
    38: "CANNOT_PARSE_DATE",
    41: "CANNOT_PARSE_DATETIME",
    53: "TYPE_MISMATCH",
    69: "ARGUMENT_OUT_OF_BOUND",
    70: "CANNOT_CONVERT_TYPE",
    72: "CANNOT_PARSE_NUMBER",
    117: "INCORRECT_DATA",
    131: "TOO_LARGE_STRING_SIZE",  # a string longer than its FixedString(N)
    190: "SIZES_OF_ARRAYS_DOESNT_MATCH",
    321: "VALUE_IS_OUT_OF_RANGE_OF_DATA_TYPE",
    349: "CANNOT_INSERT_NULL_IN_ORDINARY_COLUMN",
    377: "ILLEGAL_SYNTAX_FOR_DATA_TYPE",
    691: "UNKNOWN_ELEMENT_OF_ENUM",
}
#: 252 TOO_MANY_PARTS says two things: "Too many partitions for single INSERT block"
#: (the rows' dates spread the block: the data's fault, and half the block may fit)
#: or "Too many parts ... Merges are processing significantly slower than inserts"
#: (the server is behind: retried).
TOO_MANY_PARTS = 252
_PARTITION_SPREAD = re.compile(r"too many partitions", re.IGNORECASE)
#: clickhouse-driver's client-side conversion failures: its Enum column raises a
#: LogicalError "Unknown element ... for type Enum8(...)".
_DRIVER_ENUM = re.compile(r"Unknown element .* for type Enum", re.DOTALL)
_CODE = re.compile(r"Code: (\d+)")


def code_of(message: str) -> int | None:
    """The ClickHouse error code a message (chDB's) starts with, if any."""
    found = _CODE.search(message)
    return int(found[1]) if found else None


def is_data_error(code: int | None, message: str) -> bool:
    """Whether an insert failed with error ``code`` (and ``message``) because of the
    rows' values, so that retrying the same rows cannot help.

    >>> is_data_error(252, "Too many partitions for single INSERT block (more than 100)")
    True
    >>> is_data_error(252, "Too many parts (300). Merges are processing significantly slower")
    False
    >>> is_data_error(210, "Connection refused"), is_data_error(321, "out of range")
    (False, True)
    """
    if code == TOO_MANY_PARTS:
        return bool(_PARTITION_SPREAD.search(message))
    if code in DATA_ERROR_CODES:
        return True
    return bool(_DRIVER_ENUM.search(message))


_INT_RANGE = {
    f"{sign}Int{bits}": (0, 2**bits - 1) if sign else (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1)
    for sign in ("", "U")
    for bits in (8, 16, 32, 64)
}
_DATETIME_RANGE = (0, 2**32 - 1)  # DateTime: seconds since 1970 in a UInt32
_FIXED = re.compile(r"^FixedString\((\d+)\)$")
_ENUM_NAME = re.compile(r"'((?:[^'\\]|\\.)*)'\s*=")


def refused_value(table: str, columns: Mapping[str, Any], types: Mapping[str, str]) -> str | None:
    """Why a value of ``columns`` does not fit its column of ``table`` (``types``: name
    -> ClickHouse type), or ``None``.

    Both backends check this before they insert, so that a value is refused the same
    way on both: chDB (Arrow) would otherwise store a DateTime past 2106 as 2106 and
    cut a FixedString, where the server's driver refuses them. Numbers beyond an
    integer type, times outside DateTime, strings longer than a FixedString and Enum
    names the column lacks; numpy arrays are checked whole (min and max).
    """
    for name, values in columns.items():
        ch_type = types.get(name)
        if ch_type is None:
            continue
        problem = _refused(ch_type, values)
        if problem is not None:
            return f"{table}.{name}: {problem}"
    return None


def _refused(ch_type: str, values: Any) -> str | None:
    if ch_type.startswith("Nullable("):
        ch_type = ch_type[len("Nullable(") : -1]
    if ch_type.startswith("Array("):
        inner = ch_type[len("Array(") : -1]
        for items in values:
            if (problem := _refused(inner, items)) is not None:
                return problem
        return None
    if isinstance(values, np.ndarray) and values.dtype != object:
        return _refused_array(ch_type, values)
    check = _value_check(ch_type)
    if check is None:
        return None
    for value in values:
        if value is not None and (problem := check(value)) is not None:
            return problem
    return None


def _refused_array(ch_type: str, values: npt.NDArray[Any]) -> str | None:
    """A numeric array against an integer or DateTime column (Enum8 codes are the
    builder's own, checked where they are made)."""
    bounds = _INT_RANGE.get(ch_type) or (
        _DATETIME_RANGE if ch_type.startswith("DateTime") else None
    )
    if isinstance(values, np.ma.MaskedArray):  # a Nullable column: NULLs hold no value
        values = values.compressed()
    if bounds is None or values.size == 0 or values.dtype.kind not in "iu":
        return None
    lo, hi = int(values.min()), int(values.max())
    if lo < bounds[0] or hi > bounds[1]:
        bad = lo if lo < bounds[0] else hi
        return f"{bad} is outside {ch_type}"
    return None


def _value_check(ch_type: str) -> Callable[[Any], str | None] | None:
    if ch_type in _INT_RANGE:
        lo, hi = _INT_RANGE[ch_type]

        def check_int(v: Any) -> str | None:
            if isinstance(v, int | np.integer) and not lo <= int(v) <= hi:
                return f"{int(v)} is outside {ch_type}"
            return None

        return check_int
    if ch_type.startswith("DateTime"):

        def check_time(v: Any) -> str | None:
            seconds = v.timestamp() if isinstance(v, datetime) else v
            if isinstance(seconds, int | float) and not (
                _DATETIME_RANGE[0] <= seconds <= _DATETIME_RANGE[1]
            ):
                shown = v.isoformat() if isinstance(v, datetime) else v
                return f"{shown} is outside DateTime (1970-01-01 .. 2106-02-07)"
            return None

        return check_time
    if fixed := _FIXED.match(ch_type):
        size = int(fixed[1])

        def check_fixed(v: Any) -> str | None:
            n = len(v.encode() if isinstance(v, str) else v)
            return f"{n} bytes do not fit {ch_type}" if n > size else None

        return check_fixed
    if ch_type.startswith(("Enum8(", "Enum16(")):
        names = {n.replace("\\'", "'") for n in _ENUM_NAME.findall(ch_type)}

        def check_enum(v: Any) -> str | None:
            if isinstance(v, str) and v not in names:
                return f"{v!r} is not an element of {ch_type}"
            return None

        return check_enum
    return None
