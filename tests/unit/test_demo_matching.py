"""How the demo scores alerts against the simulator's truth (``match_alerts``)."""

from __future__ import annotations

from pipeline.demo import match_alerts
from schemas import AlertKind, AlertState, FaultKind, FaultTruth
from tests.factories import samples

BASE = samples()["decisions"]


def alert(kind: AlertKind, step: int, node: str | None = None):
    return BASE.model_copy(
        update={
            "fingerprint": f"{kind.value}-{step}-{node}",
            "kind": kind,
            "step": step,
            "node": node,
            "state": AlertState.FIRING,
        }
    )


def fault(kind: FaultKind, node: str, onset: int) -> FaultTruth:
    return FaultTruth(scenario="s", job_id="job-1", fault_id=f"{kind.value}-{node}", kind=kind,
                      node=node, onset_step=onset)  # fmt: skip


def test_a_job_hang_after_a_rank_died_belongs_to_the_fault_that_killed_it():

    truth = [fault(FaultKind.ECC_STORM, "node-0201", 590)]
    alerts = [
        alert(AlertKind.HARDWARE, 609, "node-0201"),
        alert(AlertKind.HANG, 630),  # the job stalled: XID 48 killed a rank at 620
        alert(AlertKind.HANG, 100),  # before the fault: false
    ]
    outcomes, traps, unmatched = match_alerts(truth, alerts)
    assert unmatched == 1 and traps == 0
    assert outcomes[0].detected_step == 609
    assert outcomes[0].alert_kinds == ["hang", "hardware"]


def test_a_job_hang_during_a_slow_node_is_still_a_false_alert():

    truth = [fault(FaultKind.STRAGGLER, "node-0005", 40)]
    alerts = [alert(AlertKind.STRAGGLER, 45, "node-0005"), alert(AlertKind.HANG, 50)]
    outcomes, _, unmatched = match_alerts(truth, alerts)
    assert unmatched == 1 and outcomes[0].alert_kinds == ["straggler"]
