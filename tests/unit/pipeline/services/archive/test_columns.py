"""The server's column writers (``pipeline.services.archive.columns``) put on the wire
the bytes clickhouse-driver's own columns write for the same values as Python rows."""

from __future__ import annotations

import math

import numpy as np
import pytest
from clickhouse_driver import Client
from clickhouse_driver.bufferedwriter import BufferedSocketWriter
from clickhouse_driver.columns.service import write_column

from pipeline.services.archive.columns import register_numpy_columns, string_bytes


class _Sent:
    """Where the driver's writer sends its bytes (no server: the column's bytes only)."""

    def __init__(self) -> None:
        self.out = bytearray()

    def sendall(self, data: bytes) -> None:
        self.out += data


def wire(spec: str, items, *, numpy: bool) -> bytes:
    """The bytes clickhouse-driver writes for one column of ``spec``: its numpy columns
    (with ours registered) for arrays, its generic ones for a Python list."""
    register_numpy_columns()
    context = Client(host="127.0.0.1", port=1, settings={"use_numpy": numpy}).connection.context
    sent = _Sent()
    buf = BufferedSocketWriter(sent, 1 << 16)
    write_column(context, "c", spec, items, buf)
    buf.flush()
    return bytes(sent.out)


def as_rows(values) -> list:
    """A column as the driver's row path takes it: Python values, None for NULL."""
    if isinstance(values, np.ma.MaskedArray):
        mask = np.ma.getmaskarray(values)
        return [None if m else v for v, m in zip(values.data.tolist(), mask.tolist(), strict=True)]
    return values.tolist()


def zero_under_nulls(values):
    """``values`` with 0 under each NULL: what the driver's rows write there."""
    if not isinstance(values, np.ma.MaskedArray):
        return values
    mask = np.ma.getmaskarray(values)
    return np.ma.MaskedArray(np.where(mask, 0, values.data).astype(values.dtype), mask=mask)


STRINGS = ["", "a", "node-0001", "é∂", "x" * 200, "y" * 20_000, "node-0001", ""]


def test_string_bytes_are_the_drivers_for_every_length_and_script():
    items = np.array(STRINGS * 3, dtype=object)
    assert string_bytes(items) == wire("String", STRINGS * 3, numpy=False)
    assert wire("String", items, numpy=True) == wire("String", STRINGS * 3, numpy=False)


def test_strings_with_a_none_or_a_non_str_take_the_drivers_way():
    assert string_bytes(np.array(["a", None], dtype=object)) is None
    assert string_bytes(np.array(["a", b"b"], dtype=object)) is None
    assert string_bytes(np.array([], dtype=object)) == b""


@pytest.mark.parametrize(
    ("spec", "values"),
    [
        ("Float64", np.array([0.5, math.nan, math.inf, -1.0])),
        ("UInt32", np.array([0, 1, 2**32 - 1], dtype=np.uint32)),
        ("UInt16", np.array([7, 65535], dtype=np.uint16)),
        ("UInt64", np.array([0, 2**63 + 5], dtype=np.uint64)),
        ("Int8", np.array([-1, 3], dtype=np.int8)),
        # NULL and NaN apart; the value under a NULL is the driver's null_value (0)
        ("Nullable(Float64)", np.ma.MaskedArray([math.nan, 0.0, 2.5], mask=[0, 1, 0])),
        ("Nullable(UInt64)", np.ma.MaskedArray(np.array([4096, 0, 1], np.uint64), mask=[0, 1, 0])),
        ("Nullable(Float64)", np.ma.MaskedArray([1.0, 2.0])),  # nothing NULL
    ],
)
def test_numbers_are_written_whole_as_the_drivers_rows(spec, values):
    assert wire(spec, values, numpy=True) == wire(spec, as_rows(values), numpy=False)
