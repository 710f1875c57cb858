"""SQL from outside never becomes SQL text; ``stepguard sql`` reads only (issue 14)."""

from __future__ import annotations

import pytest

from pipeline.io.errors import ArchiveError
from pipeline.services.archive.backend import bind_params, read_only_problem
from pipeline.services.archive.queries import QUERIES


def test_bind_params_types_every_placeholder_and_refuses_text_for_numbers():
    sql = "SELECT 1 WHERE job = {job:String} AND step BETWEEN {lo:UInt64} AND {hi:UInt64}"
    assert bind_params(sql, {"job": "x' OR 1=1 --", "lo": 1, "hi": 2, "extra": 3}) == {
        "job": "x' OR 1=1 --", "lo": 1, "hi": 2,
    }  # fmt: skip
    with pytest.raises(ArchiveError, match="hi has no value"):
        bind_params(sql, {"job": "j", "lo": 1})
    with pytest.raises(ArchiveError, match="expected an int"):
        bind_params(sql, {"job": "j", "lo": "1 OR 1", "hi": 2})
    with pytest.raises(ArchiveError, match="out of UInt64"):
        bind_params(sql, {"job": "j", "lo": -1, "hi": 2})
    with pytest.raises(ArchiveError, match="expected a str"):
        bind_params(sql, {"job": 5, "lo": 1, "hi": 2})


def test_analyst_queries_hold_no_value_from_outside():
    for q in QUERIES.values():
        sql = q.render("db")
        assert "'{" not in sql and "{db}" not in sql, q.name
        names = set(bind_params(sql, {"job": "j", "limit": 5}))
        assert names <= {"job", "limit"}, q.name


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT 1",
        "  select count() FROM db.alerts FINAL WHERE node = 'x; DROP TABLE t' ;",
        "SHOW TABLES FROM db",
        "SHOW CREATE TABLE db.alerts",
        "DESCRIBE TABLE db.alerts",
        "EXPLAIN SELECT 1",
        "WITH 1 AS x SELECT x",
        "SELECT `update`, 'it''s', 'a\\'b' FROM db.t ORDER BY x DESC",
    ],
)
def test_read_only_accepts_one_read(sql):
    assert read_only_problem(sql) is None


@pytest.mark.parametrize(
    "sql",
    [
        "DROP TABLE db.alerts",
        "INSERT INTO db.alerts SELECT * FROM db.alerts",
        "ALTER TABLE db.alerts DELETE WHERE 1",
        "TRUNCATE TABLE db.alerts",
        "SELECT 1; DROP TABLE db.alerts",
        "SELECT 1;; ",
        "select 1 ; select 2",
        "SELECT * FROM db.alerts INTO OUTFILE '/tmp/x'",
        "WITH 1 AS x INSERT INTO t SELECT x",
        "SET readonly = 0",
        "SYSTEM DROP DNS CACHE",
        "(SELECT 1)",
        "SELECT 1 -- ; DROP TABLE t",
        "SELECT 1 /* /* */ ' */ ; DROP TABLE t -- '",
        "SELECT $$'$$; DROP TABLE t; SELECT $$'$$",
        "SELECT 'unterminated",
        "",
    ],
)
def test_read_only_refuses_writes_and_anything_ambiguous(sql):
    assert read_only_problem(sql) is not None


def test_every_named_query_is_read_only_so_the_archivers_socket_takes_it():
    for q in QUERIES.values():
        assert read_only_problem(q.render("db")) is None, q.name


def test_named_queries_read_only_signed_alerts_and_commands():
    for name in ("incident_timeline", "command_outcomes", "incidents", "detection_delay",
                 "top_nodes"):  # fmt: skip
        sql = QUERIES[name].render("db")
        for table, filtered in (("db.alerts", "signed != 0"), ("db.commands", "signed")):
            if table in sql:
                assert filtered in sql, (name, table)
