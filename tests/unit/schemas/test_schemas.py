"""Message contracts: committed JSON Schemas, validation rules, codec behaviour."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest
from pydantic import ValidationError

from schemas import (
    MESSAGE_MODELS,
    TOPICS,
    Approval,
    ApprovalDecision,
    DeadLetter,
    JobEvent,
    NodeHealth,
    RankSample,
    Rejected,
    StepTelemetry,
    TopicRegistry,
    decode,
    encode,
)
from schemas.jsonschemas import SCHEMA_DIR, render
from tests.factories import T0, samples, step_telemetry


@pytest.mark.parametrize("model", MESSAGE_MODELS, ids=lambda m: m.kind_name)
def test_committed_json_schema_matches_model(model):
    path = SCHEMA_DIR / f"{model.kind_name}.json"
    assert path.exists(), f"missing {path}; run python -m schemas.jsonschemas"
    assert path.read_text() == render(model), (
        f"{path.name} drifted from {model.__name__}; run python -m schemas.jsonschemas "
        "(renaming or retyping a field needs a new schema_version)"
    )


@pytest.mark.parametrize("logical", sorted(TOPICS))
def test_every_sample_validates_against_its_committed_schema(logical):
    msg = samples()[logical]
    schema = json.loads((SCHEMA_DIR / f"{type(msg).kind_name}.json").read_text())
    jsonschema.validate(json.loads(encode(msg)), schema)


def test_every_topic_has_a_sample_of_its_model():
    got = samples()
    assert set(got) == set(TOPICS)
    for logical, msg in got.items():
        assert isinstance(msg, TOPICS[logical].model)


def test_payload_is_plain_json_without_framework_metadata():
    payload = json.loads(encode(step_telemetry()))
    assert "__faust" not in payload
    assert payload["schema_version"] == 1


def test_nan_loss_is_a_signal_that_survives_the_wire():
    base = step_telemetry(ranks=1)
    sample = base.samples[0].model_copy(update={"loss": math.nan, "grad_norm": math.inf})
    msg = base.model_copy(update={"samples": (sample,)})
    back = decode(StepTelemetry, encode(msg))
    assert isinstance(back, StepTelemetry)
    assert math.isnan(back.samples[0].loss) and math.isinf(back.samples[0].grad_norm)


def test_nan_timing_is_rejected():
    with pytest.raises(ValidationError, match="compute_s"):
        RankSample(rank=0, local_rank=0, step_time_s=1, compute_s=math.nan, comm_wait_s=0,
                   data_wait_s=0)  # fmt: skip


def test_naive_datetime_is_rejected():
    payload = json.loads(encode(step_telemetry()))
    payload["ts_end"] = "2026-11-29T12:00:00"
    out = decode(StepTelemetry, json.dumps(payload).encode(), topic="s", partition=1, offset=9)
    assert isinstance(out, Rejected)
    assert "ts_end" in out.error and "timezone" in out.error


def test_unknown_fields_are_ignored():
    payload = json.loads(encode(step_telemetry()))
    payload["added_in_a_later_version"] = {"x": 1}
    assert isinstance(decode(StepTelemetry, json.dumps(payload).encode()), StepTelemetry)


def test_decode_bad_bytes_gives_dead_letter_with_coordinates():
    out = decode(StepTelemetry, b"\xff\xfe", topic="p.stepguard.steps", partition=3, offset=17,
                 key=b"job")  # fmt: skip
    assert isinstance(out, Rejected)
    letter = out.letter
    assert isinstance(letter, DeadLetter)
    assert (letter.source_topic, letter.partition, letter.offset, letter.key) == (
        "p.stepguard.steps",
        3,
        17,
        b"job",
    )
    assert letter.raw == b"\xff\xfe"
    assert "Invalid JSON" in letter.error


def test_oversized_message_is_refused_before_parsing():
    out = decode(StepTelemetry, b"x" * 101, max_bytes=100)
    assert isinstance(out, Rejected)
    assert "exceeds" in out.error
    assert len(out.letter.raw) == 100


def test_duplicate_ranks_are_rejected():
    msg = step_telemetry(ranks=2)
    payload = json.loads(encode(msg))
    payload["samples"][1]["rank"] = payload["samples"][0]["rank"]
    assert isinstance(decode(StepTelemetry, json.dumps(payload).encode()), Rejected)


def test_topic_registry_prefixes_and_rejects_unknown_names():
    reg = TopicRegistry(prefix="acme.")
    assert reg.name("decisions") == "acme.stepguard.decisions"
    assert reg.logical_of("acme.stepguard.health") == "health"
    assert reg.logical_of("other.topic") is None
    with pytest.raises(KeyError, match="unknown topic"):
        reg.name("nope")


_APPROVAL_V1 = {
    "schema_version": 1, "command_id": "act-0123456789abcdef01234567",
    "decision": "reject", "by": "sre", "reason": "false positive",
    "ts": f"{T0:%Y-%m-%dT%H:%M:%SZ}", "key_id": "k1", "signature": "ab" * 64,
}  # fmt: skip


@pytest.mark.parametrize("without_version", [False, True])
def test_an_approval_of_version_1_decodes_its_command_id_as_the_action_id(without_version):
    payload = {
        k: v for k, v in _APPROVAL_V1.items() if k != "schema_version" or not without_version
    }
    old = decode(Approval, json.dumps(payload).encode())
    assert isinstance(old, Approval)
    assert old.action_id == "act-0123456789abcdef01234567"
    assert old.schema_version == 1  # its signature covers the version-1 fields
    assert (old.decision, old.by, old.reason) == (ApprovalDecision.REJECT, "sre", "false positive")


def test_an_approval_is_sent_as_version_2_without_command_id():
    new = Approval(action_id="act-0123456789abcdef01234567", decision=ApprovalDecision.REJECT,
                   by="sre", reason="false positive", ts=T0)  # fmt: skip
    payload = json.loads(encode(new))
    assert payload["schema_version"] == 2 and "command_id" not in payload
    assert payload["action_id"] == "act-0123456789abcdef01234567"
    old = decode(Approval, json.dumps(_APPROVAL_V1).encode())
    assert old.model_copy(update={"schema_version": 2, "key_id": None, "signature": None}) == new
    assert TOPICS["approvals"].key == "action_id"


def test_action_id_wins_over_a_stray_command_id():
    payload = json.loads(
        encode(Approval(action_id="act-new1", decision=ApprovalDecision.APPROVE, by="s", ts=T0))
    )
    payload["command_id"] = "act-old1"
    assert decode(Approval, json.dumps(payload).encode()).action_id == "act-new1"


def _gpu(**kw: object) -> dict:
    return {"index": 0, "temperature_c": 60, "power_w": 300, "sm_clock_mhz": 1400,
            "utilization_pct": 90} | kw  # fmt: skip


@pytest.mark.parametrize(
    ("model", "doc"),
    [
        # what the code stores bounds every numeric field (issue 22 items 2 and 5)
        ("step", {"step": 1 << 53}),
        ("sample", {"local_rank": 1 << 16}),
        ("sample", {"pp_stage": 1 << 31}),
        ("sample", {"dp_group": 1 << 31}),
        ("sample", {"tp_group": 1 << 31}),
        ("sample", {"compute_s": 1e7}),
        ("health", {"gpus": [_gpu(index=i) for i in range(65)]}),  # GPUs per node
        ("health", {"gpus": [_gpu(index=64)]}),
        ("health", {"gpus": [_gpu(ecc_uncorrected=1 << 63)]}),
        ("health", {"gpus": [_gpu(xid_codes=[1 << 32])]}),
        ("health", {"gpus": [_gpu(xid_codes=[79] * 65)]}),
        ("health", {"nic_errors": 1 << 63}),
        ("health", {"interval_s": 1e6}),
        ("event", {"kind": "phase", "phase": "eval", "expected_s": 7 * 86400}),
        ("event", {"kind": "phase", "phase": "eval", "step": 1 << 53}),
        ("event", {"kind": "start", "nodes": ["n"] * 65_537}),  # nodes per job
    ],
)
def test_every_numeric_field_is_bounded_by_what_the_code_stores(model: str, doc: dict) -> None:
    base = {
        "step": json.loads(encode(step_telemetry())),
        "health": {"node": "n0", "ts": "2026-01-01T00:00:00Z"},
        "event": {"job_id": "j", "kind": "start", "ts": "2026-01-01T00:00:00Z"},
    }
    if model == "sample":
        full = base["step"]
        full["samples"][0] |= doc
        target: type = StepTelemetry
    else:
        full = base[model] | doc
        target = {"step": StepTelemetry, "health": NodeHealth, "event": JobEvent}[model]
    with pytest.raises(ValidationError):
        target.model_validate_json(json.dumps(full))
