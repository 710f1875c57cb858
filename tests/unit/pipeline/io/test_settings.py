from __future__ import annotations

import pytest

from pipeline.io.errors import ConfigError
from pipeline.io.kafka import client_config
from pipeline.io.settings import load_settings


def test_defaults_choose_the_embedded_archive():
    s = load_settings({})
    assert s.archive_backend == "chdb"
    assert s.kafka_bootstrap == ""


def test_reads_prefixed_variables_and_hides_secrets():
    s = load_settings(
        {
            "STEPGUARD_KAFKA_BOOTSTRAP": "k1:9092,k2:9092",
            "STEPGUARD_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
            "STEPGUARD_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
            "STEPGUARD_KAFKA_SASL_USERNAME": "svc",
            "STEPGUARD_KAFKA_SASL_PASSWORD": "hunter2",
            "STEPGUARD_CLICKHOUSE_DSN": "clickhouse://u:pw@ch:9000/sg",
            "UNRELATED": "x",
        }
    )
    assert s.archive_backend == "server"
    assert "hunter2" not in repr(s) and "pw@" not in repr(s)
    cfg = client_config(s)
    assert cfg["bootstrap_servers"] == ["k1:9092", "k2:9092"]
    assert cfg["sasl_mechanism"] == "SCRAM-SHA-512"
    assert cfg["sasl_plain_password"] == "hunter2"


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"STEPGUARD_KAFKA_BOOTSTRAP": "no-port"}, "STEPGUARD_KAFKA_BOOTSTRAP"),
        ({"STEPGUARD_KAFKA_SECURITY_PROTOCOL": "TLS"}, "STEPGUARD_KAFKA_SECURITY_PROTOCOL"),
        ({"STEPGUARD_CLICKHOUSE_DSN": "http://ch:8123"}, "STEPGUARD_CLICKHOUSE_DSN"),
        ({"STEPGUARD_TOPIC_PREFIX": "bad prefix!"}, "STEPGUARD_TOPIC_PREFIX"),
        ({"STEPGUARD_BROKER_FLAVOR": "redpanda"}, "STEPGUARD_BROKER_FLAVOR"),
        ({"STEPGUARD_KAFKA_SECURITY_PROTOCOL": "SASL_SSL"}, "KAFKA_SASL_MECHANISM"),
    ],
)
def test_bad_values_fail_fast_naming_the_variable(env, named):
    with pytest.raises(ConfigError, match=named):
        load_settings(env)


def test_settings_are_frozen():
    s = load_settings({})
    with pytest.raises(Exception, match="frozen"):
        s.topic_prefix = "x"  # type: ignore[misc]
