"""Which insert errors are the rows' fault (dead letters) and which an outage (retried):
by ClickHouse's error code, the same for the server's driver and chDB's messages."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import pytest
from clickhouse_driver import errors

from pipeline.io.errors import ArchiveError, ArchiveRowError
from pipeline.services.archive.backend import ServerBackend
from pipeline.services.archive.refusals import code_of, is_data_error, refused_value


@pytest.mark.parametrize(
    ("code", "message", "data"),
    [
        (252, "Too many partitions for single INSERT block (more than 100)", True),
        (252, "Too many parts (300). Merges are processing significantly slower than inserts",
         False),
        (321, "Value 70000 is out of range of UInt16", True),
        (53, "Type mismatch", True),
        (691, "Unknown element 'x' for enum", True),
        (131, "String too long for type FixedString(4)", True),
        (27, "Cannot parse input", True),
        (210, "Connection refused", False),
        (209, "Timeout exceeded while reading from socket", False),
        (241, "Memory limit (for query) exceeded", False),
        (60, "Table t.x doesn't exist", False),
        (None, "Connection reset by peer", False),
    ],
)  # fmt: skip
def test_a_refusal_is_classified_by_its_code(code, message, data):
    assert is_data_error(code, message) is data


def test_chdb_messages_give_their_code():
    assert code_of("Code: 252. DB::Exception: Too many partitions ...") == 252
    assert code_of("std::exception") is None


class _Raising:
    def __init__(self, exc: Exception) -> None:
        self.exc = exc

    def execute(self, *args, **kwargs):
        raise self.exc


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (errors.ServerException("Too many partitions for single INSERT block", 252),
         ArchiveRowError),
        (errors.ServerException("Too many parts (300). Merges are processing", 252),
         ArchiveError),
        (errors.TooLargeStringSize("too long"), ArchiveRowError),
        (errors.LogicalError("Unknown element 'c' for type Enum8('a' = 0)"), ArchiveRowError),
        (errors.TypeMismatchError("bad"), ArchiveRowError),
        (errors.NetworkError("Connection refused"), ArchiveError),
        (errors.SocketTimeoutError("timed out"), ArchiveError),
        (ConnectionResetError("reset"), ArchiveError),
        (EOFError("eof"), ArchiveError),
    ],
)  # fmt: skip
def test_the_server_backend_retries_only_an_outage(exc, kind):
    backend = ServerBackend("clickhouse://default@127.0.0.1:1/db")  # never connects
    backend._client = _Raising(exc)
    with pytest.raises(ArchiveError) as raised:
        backend.execute("INSERT INTO db.t (x) VALUES")
    assert type(raised.value) is kind


def test_values_beyond_their_column_are_named_before_any_insert():
    types = {
        "n": "UInt16", "ts": "DateTime('UTC')", "s": "FixedString(2)",
        "e": "Enum8('a' = 0, 'b' = 1)", "xs": "Array(UInt8)", "f": "Nullable(Float64)",
    }  # fmt: skip
    fine = {"n": np.array([1, 65535], dtype=np.int64), "ts": [datetime.now(UTC), None],
            "s": ["ab", "é"], "e": ["a", "b"], "xs": [[1], [255]], "f": [None, 1.0]}  # fmt: skip
    assert refused_value("t", fine, types) is None
    for column, values, says in [
        ("n", np.array([0, 65536], dtype=np.int64), "65536 is outside UInt16"),
        ("n", [-1, 0], "-1 is outside UInt16"),
        ("ts", [datetime(2106, 2, 8, tzinfo=UTC), None], "outside DateTime"),
        ("s", ["ab", "éé"], "4 bytes do not fit FixedString(2)"),
        ("e", ["a", "c"], "'c' is not an element of Enum8"),
        ("xs", [[1], [256]], "256 is outside UInt8"),
    ]:
        problem = refused_value("t", {**fine, column: values}, types)
        assert problem is not None and problem.startswith(f"t.{column}: "), problem
        assert says in problem, problem
