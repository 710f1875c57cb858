"""Columns as the Arrow arrays chDB reads through ``Python(table)`` (inserts)."""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeline.io.errors import ArchiveError

__all__ = ["arrow_array", "arrow_type"]


def arrow_array(values: Any, ch_type: str) -> Any:
    """An Arrow array for one column: lists typed from the ClickHouse type; numpy
    arrays as they are (ClickHouse casts Int8 codes to the Enum, UInt32 to DateTime),
    object arrays as strings, masked arrays with their mask as NULL."""
    import pyarrow as pa

    if isinstance(values, np.ma.MaskedArray):
        return pa.array(np.asarray(values.data), mask=np.ma.getmaskarray(values))
    if isinstance(values, np.ndarray):
        return pa.array(values, type=pa.string() if values.dtype == object else None)
    return pa.array(values, type=arrow_type(ch_type))


def arrow_type(ch_type: str) -> Any:
    """The Arrow type to feed a ClickHouse column of ``ch_type`` (subset we use)."""
    import pyarrow as pa

    if ch_type.startswith("Nullable("):
        return arrow_type(ch_type[len("Nullable(") : -1])
    if ch_type.startswith("Array("):
        return pa.list_(arrow_type(ch_type[len("Array(") : -1]))
    if ch_type.startswith("DateTime"):
        return pa.timestamp("us", tz="UTC")
    if ch_type.startswith(("Enum", "String", "FixedString", "LowCardinality")):
        return pa.string()
    simple = {
        "UInt8": pa.uint8(), "UInt16": pa.uint16(), "UInt32": pa.uint32(),
        "UInt64": pa.uint64(), "Int8": pa.int8(), "Int16": pa.int16(), "Int32": pa.int32(),
        "Int64": pa.int64(), "Float32": pa.float32(), "Float64": pa.float64(),
    }  # fmt: skip
    if ch_type not in simple:
        raise ArchiveError(f"no Arrow mapping for ClickHouse type {ch_type}")
    return simple[ch_type]
