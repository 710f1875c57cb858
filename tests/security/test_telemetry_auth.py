"""Issue 39, authenticated telemetry: a record about node N counts only with N's proof,
and a job-level lifecycle event only with its own job controller's signature.

Each test feeds the worker core (:class:`WorkerDetection`) what the least-trusted writer
of the topics can write: a node's exporter that holds only its own node's key.
"""

from __future__ import annotations

import base64

from pipeline.io.telemetry_auth import NodeKeys, TelemetryProver, TelemetryVerifier
from schemas import (
    AlertKind,
    EndReason,
    GpuHealth,
    JobEvent,
    JobEventKind,
    NodeHealth,
    Phase,
    Rejected,
    StepTelemetry,
    decode,
    encode,
)
from tests.factories import TELEMETRY_SECRET, job_controller_key, proofs, test_key
from tests.security._helpers import JOB_J_KEY, T0, step_msg, worker

#: what the worker holds: the cluster secret, every node's key derived from it
SECRET_NODES = NodeKeys(secret=base64.b64decode(TELEMETRY_SECRET))


def _core(refused: list | None = None):
    """A worker that checks proofs with the cluster secret and knows job j's controller."""
    check = TelemetryVerifier(SECRET_NODES, JOB_J_KEY.verifier())
    on_refused = (
        (lambda topic, node: refused.append((topic, node))) if refused is not None else None
    )
    return worker(telemetry=check, on_refused=on_refused)


def _feed_signed(core, steps: range, offset: int = 0, slow: int | None = None) -> list:
    """Every node's telemetry of ``steps``, each proven by its own node; the alerts."""
    alerts = []
    for s in steps:
        for n in range(8):
            value = step_msg(s, n)
            if slow is not None and n == slow:
                value = _slowed(value)
            out = core.handle_step(0, offset, b"j", value, token=offset,
                                   headers=proofs(value, f"n{n}"))  # fmt: skip
            assert out.dead_letters == [], out.dead_letters
            alerts += out.alerts
            offset += 1
    return alerts


def _slowed(value: bytes) -> bytes:
    """The same node's step with 40 % more compute (a straggler)."""
    msg = decode(StepTelemetry, value)
    assert not isinstance(msg, Rejected)
    samples = tuple(
        s.model_copy(update={"compute_s": s.compute_s * 1.4, "comm_wait_s": 0.01})
        for s in msg.samples
    )
    return encode(msg.model_copy(update={"samples": samples}))


def test_a_step_naming_another_node_without_its_proof_is_refused_and_enrols_nothing():
    """Threat (issue 39, finding 2): a writer holding node n1's key sends a step record
    naming n99 (a login node outside the job). Today it enrols n99 as a member, and a
    fatal XID for n99 later isolates it. Now: a dead letter (stage ``auth``, with its
    offset), counted for the node it claims; the job is not even created by it."""
    refused: list = []
    core = _core(refused)
    forged = step_msg(0, 99)  # node "n99"
    out = core.handle_step(3, 41, b"j", forged, token="t", headers=proofs(forged, "n1"))
    assert [d.stage for d in out.dead_letters] == ["auth"]
    letter = out.dead_letters[0]
    assert (letter.source_topic, letter.partition, letter.offset) == ("steps", 3, 41)
    assert "n99" in letter.error and letter.raw == forged
    assert out.release == ["t"] and out.alerts == []
    assert refused == [("steps", "n99")] and core.counts()["refused_proof"] == 1
    assert "j" not in core.jobs  # nothing of it reached a job, let alone detection
    # the same record with no proof at all, and once the job runs: refused too
    _feed_signed(core, range(0, 5))
    out = core.handle_step(0, 999, b"j", step_msg(5, 99), token="u")
    assert [d.stage for d in out.dead_letters] == ["auth"]
    assert "n99" not in core.jobs["j"].detection.guard.members
    assert core.counts()["refused_proof"] == 2


def test_a_copy_of_another_nodes_record_is_refused_not_raced():
    """A writer with n1's key copies n2's record (same step, its own numbers) before the
    real one: without n2's proof it is refused, and n2's real record is the one taken."""
    core = _core()
    _feed_signed(core, range(0, 5))
    real = step_msg(5, 2)
    fake = _slowed(real)
    first = core.handle_step(0, 100, b"j", fake, token="f", headers=proofs(fake, "n1"))
    assert [d.stage for d in first.dead_letters] == ["auth"]
    # a proof of n2 copied from its real record does not cover other bytes either
    second = core.handle_step(0, 101, b"j", fake, token="g", headers=proofs(real, "n2"))
    assert [d.stage for d in second.dead_letters] == ["auth"]
    then = core.handle_step(0, 102, b"j", real, token="r", headers=proofs(real, "n2"))
    assert then.dead_letters == []


def test_a_rack_message_with_a_sample_of_a_node_it_is_not_keyed_for_is_refused():
    """A rack aggregator's message (version 2) speaks for its sender and every sample's
    node: one sample of n7 without n7's proof refuses the whole message."""
    core = _core()
    _feed_signed(core, range(0, 3))
    parts = [decode(StepTelemetry, step_msg(3, n)) for n in (5, 6, 7)]
    samples = tuple(s.model_copy(update={"node": m.node}) for m in parts for s in m.samples)
    rack = encode(parts[0].model_copy(update={"schema_version": 2, "node": "rack-1",
                                              "samples": samples}))  # fmt: skip
    keyed = proofs(rack, "rack-1", "n5", "n6")  # not n7
    out = core.handle_step(0, 50, b"j", rack, token="r", headers=keyed)
    assert [d.stage for d in out.dead_letters] == ["auth"]
    assert "n7" in out.dead_letters[0].error
    full = proofs(rack, "rack-1", "n5", "n6", "n7")
    assert core.handle_step(0, 51, b"j", rack, token="s", headers=full).dead_letters == []


def test_a_fatal_xid_for_a_node_without_its_proof_is_refused():
    """Health (topic key: the node) is refused at routing unless its node proved it: a
    fatal XID 79 for n3 written with n1's key never reaches the job."""
    refused: list = []
    core = _core(refused)
    gpu = GpuHealth(index=0, temperature_c=60, power_w=300, sm_clock_mhz=1400,
                    utilization_pct=90, xid_events=(79,))  # fmt: skip
    value = encode(NodeHealth(job_id="j", node="n3", ts=T0, gpus=(gpu,)))
    routed = core.route_health(2, 17, b"n3", value, proofs(value, "n1"))
    assert isinstance(routed, Rejected)
    assert (routed.letter.stage, routed.letter.offset, routed.letter.partition) == ("auth", 17, 2)
    assert refused == [("health", "n3")]
    assert isinstance(core.route_health(2, 18, b"n3", value, None), Rejected)
    good = core.route_health(2, 19, b"n3", value, proofs(value, "n3"))
    assert good is not None and not isinstance(good, Rejected)


def _event(kind: JobEventKind, job: str = "j", **kw: object) -> bytes:
    return encode(JobEvent(job_id=job, kind=kind, ts=T0, source="n1", **kw))


def _controller_proof(value: bytes, job: str) -> list[tuple[str, bytes]]:
    prover = TelemetryProver(None, job_controller_key(job))
    return prover.headers("lifecycle", decode(JobEvent, value), value)


def test_a_job_end_not_signed_by_that_jobs_controller_is_refused():
    """An END (or a PHASE, or a START naming the job's nodes) speaks for the whole job:
    a member node's proof is not enough, nor another job's controller; only job j's."""
    core = _core()
    end = _event(JobEventKind.END, reason=EndReason.COMPLETED)
    for headers in (None, proofs(end, "n1"), _controller_proof(end, "other-job")):
        routed = core.route_lifecycle(0, 5, b"j", end, headers)
        assert isinstance(routed, Rejected) and routed.letter.stage == "auth", headers
    # job j's controller key id with a signature by another key: refused too
    assert isinstance(core.route_lifecycle(0, 6, b"j", end, _impostor_headers(end)), Rejected)
    assert not isinstance(core.route_lifecycle(0, 7, b"j", end, _controller_proof(end, "j")),
                          Rejected)  # fmt: skip
    phase = _event(JobEventKind.PHASE, phase=Phase.CHECKPOINT)
    assert isinstance(core.route_lifecycle(0, 8, b"j", phase, proofs(phase, "n1")), Rejected)
    declared = _event(JobEventKind.START, nodes=("n1", "login-1"))
    assert isinstance(core.route_lifecycle(0, 9, b"j", declared, proofs(declared, "n1")),
                      Rejected)  # fmt: skip
    # a process's own START (no nodes declared) is its node's to say
    start = _event(JobEventKind.START)
    assert not isinstance(core.route_lifecycle(0, 10, b"j", start, proofs(start, "n1")),
                          Rejected)  # fmt: skip
    assert isinstance(core.route_lifecycle(0, 11, b"j", start, proofs(start, "n2")), Rejected)


def _impostor_headers(value: bytes) -> list[tuple[str, bytes]]:
    forger = test_key("forger")
    sig = forger.private.sign(value).hex()
    return [("sg-proof", f"jc:{JOB_J_KEY.key_id}:{sig}".encode())]


def test_signed_telemetry_still_detects_a_straggler():
    """The good path: every record proven by its own node, a straggler on n4 is found."""
    core = _core()
    alerts = _feed_signed(core, range(0, 40))
    alerts += _feed_signed(core, range(40, 160), offset=10_000, slow=4)
    stragglers = [a for a in alerts if a.kind is AlertKind.STRAGGLER]
    assert stragglers and {a.node for a in stragglers} == {"n4"}
    assert core.counts()["refused_proof"] == 0


def test_malformed_proof_headers_never_raise():
    """Whatever a header holds is a reason to refuse, never an exception."""
    core = _core()
    value = step_msg(0, 1)
    junk = [("sg-proof", b""), ("sg-proof", b"node:"), ("sg-proof", b"node:n1:zz"),
            ("sg-proof", b"node:\xff\xfe:" + b"0" * 32), ("sg-proof", b"jc::"),
            ("other", b"x"), ("sg-proof", b"node:n1:" + b"0" * 32)]  # fmt: skip
    out = core.handle_step(0, 1, b"j", value, token="t", headers=junk)
    assert [d.stage for d in out.dead_letters] == ["auth"]
    end = _event(JobEventKind.END, reason=EndReason.FAILED)
    assert isinstance(core.route_lifecycle(0, 2, b"j", end, junk), Rejected)
    for odd in ({"sg-proof": b"x"}, [("sg-proof",)], [b"sg-proof"], [("sg-proof", None)]):
        out = core.handle_step(0, 3, b"j", value, token="t", headers=odd)  # type: ignore[arg-type]
        assert [d.stage for d in out.dead_letters] == ["auth"], odd


def test_a_replayed_health_report_or_end_is_refused_a_redelivery_is_not():
    """Written again at another offset, a node's own proven report (a fatal XID of the
    past) or its job's signed end is a replay, refused; read again at its own offset
    (a redelivery after a rebalance) it is the same record."""
    core = _core()
    gpu = GpuHealth(index=0, temperature_c=60, power_w=300, sm_clock_mhz=1400,
                    utilization_pct=90, xid_events=(79,))  # fmt: skip
    value = encode(NodeHealth(job_id="j", node="n3", ts=T0, gpus=(gpu,)))
    proof = proofs(value, "n3")
    assert not isinstance(core.route_health(2, 19, b"n3", value, proof), Rejected)
    assert not isinstance(core.route_health(2, 19, b"n3", value, proof), Rejected)
    again = core.route_health(5, 700, b"n3", value, proof)
    assert isinstance(again, Rejected) and "replay of health[2]@19" in again.letter.error
    end = _event(JobEventKind.END, reason=EndReason.COMPLETED)
    signed = _controller_proof(end, "j")
    assert not isinstance(core.route_lifecycle(0, 7, b"j", end, signed), Rejected)
    assert isinstance(core.route_lifecycle(1, 70, b"j", end, signed), Rejected)
