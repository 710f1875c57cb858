"""Columns into a ClickHouse server without a Python object per row.

clickhouse-driver 0.2's numpy inserts still walk some columns value by value: a
Nullable column's null map is ``[x is None for x in items]`` (so a masked array had to
become an object array with ``None`` first), every column goes through
``pandas.isnull`` and a copy before it is written, and a String column is encoded
string by string. For the arrays :data:`~pipeline.services.archive.backend.Columns`
holds (numpy numbers, masked arrays whose mask is NULL, object arrays of ``str``), the
columns registered here write each column with a few numpy calls:

- a number (nullable or not): the mask's bytes as the null map (NaN stays a value,
  ``test_nan_and_null_losses_stay_apart``), then the values' little-endian bytes;
- a String: the distinct strings (``pandas.factorize``, one hash per row in C) encoded
  once each, and every row's bytes gathered from them by index.

Anything else (a Python list, an object array holding ``None`` or a non-string, a
FixedString) takes the driver's own way, so what is stored never depends on which
path wrote it. Values out of a column's range are refused before the insert
(:func:`~pipeline.services.archive.refusals.refused_value`), as on the driver's way.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["register_numpy_columns", "string_bytes"]

_NUMBERS = ("Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32", "UInt64",
            "Float32", "Float64")  # fmt: skip
_lock = threading.Lock()
_registered: list[bool] = []  # [True] once registered


def string_bytes(items: npt.NDArray[Any], encoding: str = "utf-8") -> bytes | None:
    """A String column's bytes on ClickHouse's wire (per row: the UTF-8 length as a
    varint, then the bytes) for an object array of ``str``; ``None`` when some item is
    not a ``str`` (the driver's way then decides).

    >>> string_bytes(np.array(["ab", "", "ab"], dtype=object))
    b'\\x02ab\\x00\\x02ab'
    >>> string_bytes(np.array(["x", None], dtype=object)) is None
    True
    """
    import pandas as pd

    codes, uniques = pd.factorize(items, use_na_sentinel=True)
    if len(items) and codes.min() < 0:
        return None
    pieces = []
    for value in uniques:
        if type(value) is not str:
            return None
        raw = value.encode(encoding)
        pieces.append(_varint(len(raw)) + raw)
    sizes = np.fromiter(map(len, pieces), dtype=np.int64, count=len(pieces))
    starts = np.cumsum(sizes) - sizes
    blob = np.frombuffer(b"".join(pieces), dtype=np.uint8)
    out_sizes = sizes[codes]
    total = int(out_sizes.sum())
    out_starts = np.cumsum(out_sizes) - out_sizes
    gather = np.arange(total, dtype=np.int64) + np.repeat(starts[codes] - out_starts, out_sizes)
    out: bytes = blob[gather].tobytes()
    return out


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def register_numpy_columns() -> None:
    """Teach clickhouse-driver's numpy inserts (every ``use_numpy`` client of this
    process) the columns of the module docstring; idempotent."""
    with _lock:
        if _registered:
            return
        from clickhouse_driver.columns.numpy import service, stringcolumn

        for ch_type in _NUMBERS:
            base = service.column_by_type[ch_type]
            service.column_by_type[ch_type] = type(base.__name__, (_NumberWriter, base), {})
        make_string = service.create_string_column
        strings = type("NumpyStringColumn", (_StringWriter, stringcolumn.NumpyStringColumn), {})

        def create_string_column(spec: str, options: dict[str, Any]) -> Any:
            column = make_string(spec, options)
            if type(column) is stringcolumn.NumpyStringColumn:  # String, as str
                column.__class__ = strings
            return column

        service.create_string_column = create_string_column
        _registered.append(True)


class _NumberWriter:
    """Mixed in before a driver numpy number column: numpy (and masked) arrays of
    numbers are written whole."""

    dtype: np.dtype[Any]
    nullable: bool

    def write_data(self, items: Any, buf: Any) -> None:
        if not isinstance(items, np.ndarray) or items.dtype.kind not in "biuf":
            super().write_data(items, buf)  # type: ignore[misc]
            return
        if self.nullable:
            buf.write(np.ma.getmaskarray(items).view(np.uint8).tobytes())
        data = np.ma.getdata(items).astype(self.dtype.newbyteorder("<"), copy=False)
        buf.write(data.tobytes())


class _StringWriter:
    """Mixed in before the driver's numpy String column: an object array of ``str`` is
    written by :func:`string_bytes`."""

    encoding: str
    nullable: bool

    def write_data(self, items: Any, buf: Any) -> None:
        if not self.nullable and isinstance(items, np.ndarray) and items.dtype == object:
            raw = string_bytes(items, self.encoding)
            if raw is not None:
                buf.write(raw)
                return
        super().write_data(items, buf)  # type: ignore[misc]
