"""Which archived alerts and commands count as signed (``signed`` column)."""

from __future__ import annotations

from pipeline.io.settings import load_settings
from pipeline.io.trust import SigningKey, sign
from pipeline.services.archive import rows_for
from pipeline.services.archive.trust import SignatureCheck
from tests.factories import samples


def _signed(rows):
    return {table: list(cols["signed"]) for table, cols in rows.items() if "signed" in cols}


def test_only_a_writers_key_makes_an_alert_or_command_signed():
    worker, actuator, stranger = (SigningKey.generate(k) for k in ("w1", "a1", "w1"))
    settings = load_settings(
        {}, worker_public_keys=worker.public_text(), actuator_public_keys=actuator.public_text()
    )
    check = SignatureCheck(settings)
    assert check.verifies
    s = samples()
    alerts = [
        sign(s["decisions"], worker),  # a worker's
        sign(s["decisions"], actuator),  # a guardrail notice: the actuator's
        sign(s["decisions"], stranger),  # the worker's key id, another key
        s["decisions"],  # unsigned
    ]
    commands = [sign(s["commands"], actuator), sign(s["commands"], worker)]
    marked = [check.mark(m) for m in (*alerts, *commands)]
    assert _signed(rows_for([(m, 0) for m in marked])) == {
        "alerts": [1, 1, 0, 0],
        "commands": [1, 0],
    }
    assert check.failed == 2
    assert check.mark(s["results"]) is s["results"]  # not checked here


def test_without_keys_a_well_formed_signature_is_all_that_counts():
    check = SignatureCheck(load_settings({}))
    assert not check.verifies
    forged = sign(samples()["decisions"], SigningKey.generate("x"))
    assert check.mark(forged) is forged


def test_alerts_are_checked_only_with_the_workers_keys():
    actuator = SigningKey.generate("a1")
    check = SignatureCheck(load_settings({}, actuator_public_keys=actuator.public_text()))
    by_a_worker = sign(samples()["decisions"], SigningKey.generate("w1"))
    assert check.mark(by_a_worker) is by_a_worker  # no worker key to tell
    forged = sign(samples()["commands"], SigningKey.generate("a1"))
    assert check.mark(forged).signature is None


def test_action_records_need_the_actuators_key_and_approvals_an_operators():
    actuator, operator = SigningKey.generate("a1"), SigningKey.generate("op1")
    stranger = SigningKey.generate("op1")  # an operator's key id, another key
    settings = load_settings(
        {}, actuator_public_keys=actuator.public_text(), operator_public_keys=operator.public_text()
    )
    check = SignatureCheck(settings)
    s = samples()
    actions = [sign(s["actions"], actuator), sign(s["actions"], operator), s["actions"]]
    approvals = [sign(s["approvals"], operator), sign(s["approvals"], stranger),
                 sign(s["approvals"], actuator), s["approvals"]]  # fmt: skip
    marked = [check.mark(m) for m in (*actions, *approvals)]
    assert _signed(rows_for([(m, 0) for m in marked])) == {
        "actions": [1, 0, 0],
        "approvals": [1, 0, 0, 0],
    }
    assert check.failed == 3
