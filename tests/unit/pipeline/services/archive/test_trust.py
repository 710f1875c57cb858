"""Which archived messages count as signed (``signed`` column): only those a public key
of their writer's role verified."""

from __future__ import annotations

from datetime import timedelta

from pipeline.io.settings import load_settings
from pipeline.io.trust import SigningKey, sign
from pipeline.services.archive import rows_for
from pipeline.services.archive.rows import result_at_ms
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


def test_without_keys_nothing_counts_as_signed():
    """The archiver holding no public keys cannot tell a forgery from a real message:
    a well-formed signature is not enough (it used to be archived with signed = 1)."""
    check = SignatureCheck(load_settings({}))
    assert not check.verifies
    assert "CommandResult" in check.unverifiable and "Alert" in check.unverifiable
    s = samples()
    someone = SigningKey.generate("x")
    kinds = ("decisions", "commands", "actions", "approvals", "control", "results")
    marked = [check.mark(sign(s[k], someone)) for k in kinds]
    assert all(m.signature is None for m in marked)
    signed = _signed(rows_for([(m, 0) for m in marked]))
    assert signed == {t: [0] for t in ("alerts", "commands", "actions", "approvals",
                                       "control_changes", "command_results")}  # fmt: skip


def test_an_alert_is_signed_by_a_worker_or_the_actuator_and_nobody_else():
    actuator = SigningKey.generate("a1")
    check = SignatureCheck(load_settings({}, actuator_public_keys=actuator.public_text()))
    by_a_worker = sign(samples()["decisions"], SigningKey.generate("w1"))
    assert check.mark(by_a_worker).signature is None  # no worker key: cannot tell
    notice = sign(samples()["decisions"], actuator)
    assert check.mark(notice) is notice
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


def test_command_results_need_a_result_writers_key():
    executor, actuator = SigningKey.generate("e1"), SigningKey.generate("a1")
    settings = load_settings(
        {}, executor_public_keys=executor.public_text(), actuator_public_keys=actuator.public_text()
    )
    check = SignatureCheck(settings)
    r = samples()["results"]
    results = [sign(r, executor), sign(r, actuator), sign(r, SigningKey.generate("e1")), r]
    marked = [check.mark(m) for m in results]
    assert _signed(rows_for([(m, 0) for m in marked])) == {"command_results": [1, 0, 0, 0]}
    assert check.failed == 2


def test_a_result_counts_no_later_than_the_archiver_received_it():
    r = samples()["results"]
    ahead = r.model_copy(update={"ts": r.ts + timedelta(days=3650)})
    received = int(r.ts.timestamp() * 1000) + 5_000
    rows = rows_for([(r, 0), (ahead, 0)], received_ms=received)["command_results"]
    [at_real, at_ahead] = rows["at_ms"]
    assert at_real == int(r.ts.timestamp() * 1000)  # its own time: before its receipt
    assert at_ahead == received  # ten years ahead counts as when it came
    assert result_at_ms(10**13, 7) == 7
