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


# -- roles --------------------------------------------------------------------------------
_ROLES = ("WorkerSettings", "ActuatorSettings", "ExecutorSettings", "AlertmanagerSettings",
          "ArchiveSettings")  # fmt: skip


def test_settings_is_every_role_with_the_same_variables_and_defaults():
    """A role's class holds a handful of its variables; Settings is all of them together
    (the client's, each role's, the consumer group and the state directory), so code that
    takes one role's settings takes a whole Settings too."""
    from pipeline.io import settings as mod

    roles = [getattr(mod, name) for name in _ROLES]
    whole = load_settings({})
    owned: dict[str, str] = {}
    for role in roles:
        assert isinstance(whole, role) and role.model_config["frozen"]
        assert role.model_config["env_prefix"] == "STEPGUARD_"
        for name in role.model_fields:
            assert name not in owned, f"{name} is {owned.get(name)}'s and {role.__name__}'s"
            owned[name] = role.__name__
        assert 0 < len(role.model_fields) <= 25  # a handful, not every knob
        alone = mod.load_role(role, {}).model_dump()
        assert alone == {k: getattr(whole, k) for k in role.model_fields}
    client = set(mod.ClientSettings.model_fields)
    assert set(mod.Settings.model_fields) == client | set(owned) | {"consumer_group", "state_dir"}
    assert not client & set(owned)


@pytest.mark.parametrize(
    ("role", "env", "named"),
    [
        ("WorkerSettings", {"STEPGUARD_WORKER_MAX_JOBS": "0"}, "STEPGUARD_WORKER_MAX_JOBS"),
        ("ActuatorSettings", {"STEPGUARD_ACTUATOR_ACTION_MODES": "isolate=maybe"},
         "STEPGUARD_ACTUATOR_ACTION_MODES"),
        ("ExecutorSettings", {"STEPGUARD_KUBE_NAMESPACES": "Not_A_Name"},
         "STEPGUARD_KUBE_NAMESPACES"),
        ("AlertmanagerSettings", {"STEPGUARD_ALERTMANAGER_URL": "ftp://am"},
         "STEPGUARD_ALERTMANAGER_URL"),
        ("ArchiveSettings", {"STEPGUARD_CLICKHOUSE_DSN": "http://ch"}, "STEPGUARD_CLICKHOUSE_DSN"),
    ],
)  # fmt: skip
def test_a_role_reads_only_its_variables_and_fails_fast_naming_one(role, env, named):
    from pipeline.io import settings as mod

    cls = getattr(mod, role)
    with pytest.raises(ConfigError, match=named):
        mod.load_role(cls, env)
    with pytest.raises(ConfigError, match=named):  # the whole Settings refuses it alike
        load_settings(env)
    other = {"STEPGUARD_KAFKA_BOOTSTRAP": "no-port", "STEPGUARD_STATE_DIR": "/x"}
    assert mod.load_role(cls, other) == mod.load_role(cls, {})  # another role's bad value


def test_the_policy_takes_the_actuators_settings_only():
    from pipeline.io.settings import ActuatorSettings, load_role
    from pipeline.policy.params import PolicyParams

    env = {"STEPGUARD_ACTUATOR_MODE": "approve", "STEPGUARD_SPARE_NODES": "s1, s2",
           "STEPGUARD_GUARD_MAX_ISOLATIONS": "2",
           "STEPGUARD_KAFKA_BOOTSTRAP": "no-port"}  # fmt: skip
    role = PolicyParams.from_settings(load_role(ActuatorSettings, env))
    env.pop("STEPGUARD_KAFKA_BOOTSTRAP")
    assert role == PolicyParams.from_settings(load_settings(env))
    assert (role.mode.value, role.spare_nodes, role.max_isolations) == ("approve", ("s1", "s2"), 2)
