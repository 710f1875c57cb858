"""Threat: whoever can write the actions or approvals topic invents the human history
that ``stepguard calibrate --actions`` graduates kinds on (forged approvals of forged
holds: "restarts are always approved, move them to auto") and that the incident
timeline shows. The archiver marks action records the actuator's key did not sign and
approvals no operator key signed as unsigned (migration 010), and both readers leave
them out. On both backends (the server one where CI provides it)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from pipeline.io.settings import ROLES, load_settings
from pipeline.io.trust import SigningKey, sign
from pipeline.services.archive import rows_for
from pipeline.services.archive.queries import run_query
from pipeline.services.archive.trust import SignatureCheck
from pipeline.tools.calibrate.graduation import GraduationRules, graduation_report
from schemas import ActionState, ApprovalDecision
from tests.factories import ACTUATOR_KEY, EXECUTOR_KEY, OPERATOR_KEY, WORKER_KEY, samples

pytestmark = pytest.mark.integration


def test_forged_holds_and_approvals_neither_graduate_a_kind_nor_reach_the_timeline(archive):
    # the archiver's row of SECURITY.md's key table: every signing role's public keys
    # (no private key), as `stepguard up` hands them to it
    settings = load_settings(
        {}, actuator_public_keys=ACTUATOR_KEY.public_text(),
        operator_public_keys=OPERATOR_KEY.public_text(),
        worker_public_keys=WORKER_KEY.public_text(),
        executor_public_keys=EXECUTOR_KEY.public_text(),
    )  # fmt: skip
    assert not any(settings.private_key(r) for r in ROLES)
    check = SignatureCheck(settings)  # what the archiver applies to every record
    assert check.verifies
    s = samples()
    alert = sign(s["decisions"], WORKER_KEY)
    t0 = alert.ts
    messages = [alert]
    # the forger holds a key of its own under the operator's and the actuator's key ids
    forger_op, forger_act = (
        SigningKey.generate(OPERATOR_KEY.key_id),
        SigningKey.generate(ACTUATOR_KEY.key_id),
    )
    for i in range(6):
        held = s["actions"].model_copy(
            update={"action_id": f"act-forged-{i:04d}", "reason": (alert.fingerprint,),
                    "ts": t0 + timedelta(seconds=i)}
        )  # fmt: skip
        approval = s["approvals"].model_copy(
            update={"action_id": held.action_id, "by": "forger",
                    "ts": t0 + timedelta(seconds=i, milliseconds=500)}
        )  # fmt: skip
        approved = held.model_copy(update={"state": ActionState.APPROVED, "by": "forger",
                                           "ts": approval.ts})  # fmt: skip
        if i % 2:  # with a well-formed signature from the wrong key ...
            held, approved = sign(held, forger_act), sign(approved, forger_act)
            approval = sign(approval, forger_op)
        messages += [held, approval, approved]  # ... or none
    # one real hold, rejected by a real operator
    real = sign(s["actions"].model_copy(update={"action_id": "act-real-0000",
                                                "reason": (alert.fingerprint,)}),
                ACTUATOR_KEY)  # fmt: skip
    rejection = sign(s["approvals"].model_copy(
        update={"action_id": real.action_id, "decision": ApprovalDecision.REJECT,
                "ts": t0 + timedelta(seconds=30)}), OPERATOR_KEY)  # fmt: skip
    messages += [real, rejection]
    marked = [check.mark(m) for m in messages]
    for table, cols in rows_for([(m, 0) for m in marked], list(range(len(marked)))).items():
        archive.insert(table, cols)

    report = graduation_report(archive, GraduationRules(min_approvals=5))
    [total] = report.totals
    assert (total.held, total.approved, total.rejected) == (1, 0, 1)
    assert not any(r.auto for r in report.recommendations)
    cols, rows = run_query(archive, "incident_timeline", job=alert.job_id)
    text = " ".join(str(v) for r in rows for v in r)
    assert "forged" not in text and "forger" not in text
    assert "act-real-0000" in text and "approval reject" in text
    assert check.failed == 9  # 3 wrongly keyed holds, approvals and approved records
