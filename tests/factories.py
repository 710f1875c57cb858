"""One valid instance of every message model, and Hypothesis strategies for them."""

from __future__ import annotations

import base64
import hashlib
from datetime import UTC, datetime, timedelta
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import strategies as st
from pydantic import SecretStr

from pipeline.io.telemetry_auth import NodeKeys, TelemetryProver, derive_node_key
from pipeline.io.trust import SigningKey, job_controller_key_id
from schemas import (
    Acknowledgement,
    AckOutcome,
    ActionRecord,
    ActionState,
    ActuatorMode,
    Alert,
    AlertKind,
    AlertState,
    Approval,
    ApprovalDecision,
    Command,
    CommandKind,
    CommandResult,
    CommandStatus,
    ControlMessage,
    DeadLetter,
    EndReason,
    Evidence,
    FaultKind,
    FaultTruth,
    GpuHealth,
    Grade,
    JobEvent,
    JobEventKind,
    Message,
    NodeHealth,
    Phase,
    RankSample,
    RecommendedAction,
    StepTelemetry,
    command_id,
    episode_fingerprint,
)
from schemas.telemetry import MAX_RANKS_PER_JOB


# -- signing keys --------------------------------------------------------------------------
def test_key(key_id: str) -> SigningKey:
    """A fixed Ed25519 key derived from its id (tests only: anyone can derive it)."""
    seed = hashlib.sha256(f"stepguard-test-key:{key_id}".encode()).digest()
    return SigningKey(key_id, Ed25519PrivateKey.from_private_bytes(seed))


test_key.__test__ = False  # type: ignore[attr-defined]  # not a test for pytest

#: one key per role, as a deployment has them
ACTUATOR_KEY, WORKER_KEY, OPERATOR_KEY = test_key("act-1"), test_key("wrk-1"), test_key("op-1")
EXECUTOR_KEY = test_key("exe-1")


def job_controller_key(job: str) -> SigningKey:
    """The test controller key of ``job`` (a job controller's key id binds it to its job)."""
    return test_key(job_controller_key_id(job))


JOB_CONTROLLER_KEY = job_controller_key("job-1")


def job_controller_settings(job: str) -> dict[str, Any]:
    """Settings updates that make a listener ``job``'s controller (its own key)."""
    key = job_controller_key(job)
    return {
        "job_controller_private_key": SecretStr(key.private_text()),
        "job_controller_public_keys": key.public_text(),
    }


ROLE_KEYS = {
    "actuator": ACTUATOR_KEY, "worker": WORKER_KEY, "operator": OPERATOR_KEY,
    "executor": EXECUTOR_KEY, "job_controller": JOB_CONTROLLER_KEY,
}  # fmt: skip
_ROLES = ("actuator", "worker", "operator", "executor", "job_controller")


def key_settings(roles: tuple[str, ...] = _ROLES) -> dict[str, Any]:
    """Settings updates that give each role its test key (private and public)."""
    out: dict[str, Any] = {}
    for role in roles:
        key = ROLE_KEYS[role]
        out[f"{role}_private_key"] = SecretStr(key.private_text())
        out[f"{role}_public_keys"] = key.public_text()
    return out


def key_env(roles: tuple[str, ...] = _ROLES) -> dict[str, str]:
    """The same as ``STEPGUARD_*`` environment variables (for service processes), with
    the tests' cluster telemetry secret (a worker checks telemetry proofs with it)."""
    return {
        f"STEPGUARD_{name.upper()}": v.get_secret_value() if isinstance(v, SecretStr) else v
        for name, v in (key_settings(roles) | telemetry_settings()).items()
    }


# -- telemetry proofs ----------------------------------------------------------------------
#: the tests' cluster telemetry secret (fixed: anyone can derive it; tests only)
TELEMETRY_SECRET = base64.b64encode(hashlib.sha256(b"stepguard-test-telemetry").digest()).decode()


def telemetry_settings() -> dict[str, Any]:
    """Settings updates that give a worker (or a simulator) the test cluster secret."""
    return {"telemetry_auth": "on", "telemetry_secret": SecretStr(TELEMETRY_SECRET)}


def node_key(node: str) -> bytes:
    """``node``'s key under the test cluster secret."""
    return derive_node_key(base64.b64decode(TELEMETRY_SECRET), node)


def node_settings(*nodes: str) -> dict[str, Any]:
    """Settings updates of a producer holding only ``nodes``' keys (no cluster secret)."""
    text = ",".join(f"{n}={base64.b64encode(node_key(n)).decode()}" for n in nodes)
    return {"telemetry_auth": "on", "telemetry_secret": None,
            "telemetry_node_keys": SecretStr(text)}  # fmt: skip


def signed_headers(logical: str, msg: Message, value: bytes) -> list[tuple[str, bytes]]:
    """The proof headers a deployment's producer of ``msg`` (encoded as ``value``) sends:
    its nodes' proofs under the test cluster secret and, for lifecycle, its job's test
    controller key."""
    job = getattr(msg, "job_id", None)
    controller = job_controller_key(job) if isinstance(job, str) and job else None
    nodes = NodeKeys(secret=base64.b64decode(TELEMETRY_SECRET))
    return TelemetryProver(nodes, controller).headers(logical, msg, value)


def proofs(value: bytes, *nodes: str) -> list[tuple[str, bytes]]:
    """The proof headers of ``value`` by each of ``nodes`` (their test keys)."""
    return NodeKeys(keys={n: node_key(n) for n in nodes}).proofs(value, nodes)


#: The tests' clock: noon UTC two days before today (36-60 h ago, so an hour of steps
#: after it is still in the past and within the clock-skew rule), never a fixed date
T0 = datetime.now(UTC).replace(hour=12, minute=0, second=0, microsecond=0) - timedelta(days=2)


def step_telemetry(
    job: str = "job-1", node: str = "node-0", step: int = 5, ranks: int = 8, first_rank: int = 0
):
    return StepTelemetry(
        job_id=job,
        node=node,
        step=step,
        ts_start=T0 + timedelta(seconds=step),
        ts_end=T0 + timedelta(seconds=step, milliseconds=450),
        samples=tuple(
            RankSample(
                rank=r, local_rank=r % 8, dp_group=r // 8, pp_stage=0, tp_group=r // 8,
                phase=Phase.TRAIN, step_time_s=0.45, compute_s=0.38, comm_wait_s=0.05,
                data_wait_s=0.02, loss=2.5, grad_norm=1.1,
            )
            for r in range(first_rank, first_rank + ranks)
        ),
    )  # fmt: skip


def samples() -> dict[str, Message]:
    fp = episode_fingerprint("job-1", "straggler", "node-3", 27, 100)
    cid = command_id([fp], "isolate", ["node-3"])
    aid = "act-0123456789abcdef01234567"
    return {
        "steps": step_telemetry(),
        "health": NodeHealth(
            job_id="job-1", node="node-0", ts=T0, interval_s=10,
            gpus=tuple(
                GpuHealth(index=i, temperature_c=61.5, power_w=420, sm_clock_mhz=1980,
                          utilization_pct=97, ecc_corrected=3, xid_codes=(), nvlink_errors=0)
                for i in range(8)
            ),
            nic_errors=1, nic_retransmits=12,
        ),
        "decisions": Alert(
            fingerprint=fp, seq=0, kind=AlertKind.STRAGGLER, grade=Grade.WARNING,
            state=AlertState.FIRING, job_id="job-1", node="node-3", rank=27, step=104,
            started_at=T0, ts=T0 + timedelta(seconds=4),
            evidence=Evidence(metric="compute_s", value=0.46, peer_median=0.38, baseline=0.38,
                              deviation=9.3, trend=0.001, detail="high compute, low comm wait"),
            recommended_action=RecommendedAction.REPLACE_AT_CHECKPOINT,
            summary="rank 27 on node-3 is 21% slower than its stage peers",
        ),
        "commands": Command(
            command_id=cid, kind=CommandKind.ISOLATE, job_id="job-1", targets=("node-3",),
            replacements=("spare-0",), reason=(fp,), mode=ActuatorMode.AUTO, issued_at=T0,
            expires_at=T0 + timedelta(minutes=5),
        ),
        "results": CommandResult(
            command_id=cid, job_id="job-1", executor="dry-run",
            status=CommandStatus.SUCCEEDED, detail="ok", ts=T0,
        ),
        "approvals": Approval(
            action_id=aid, decision=ApprovalDecision.APPROVE, by="sre@example.com", ts=T0
        ),
        "control": ControlMessage(
            change_id="chg-1", mode=ActuatorMode.APPROVE, guard_max_isolations=2,
            by="sre@example.com", reason="canary", ts=T0,
        ),
        "actions": ActionRecord(
            action_id=aid, state=ActionState.HELD, job_id="job-1",
            mode=ActuatorMode.APPROVE, reason=(fp,), summary="replace node-3", ts=T0,
        ),
        "acks": Acknowledgement(
            subject=aid, request="approval", source_topic="x.stepguard.approvals",
            partition=0, offset=3, outcome=AckOutcome.APPLIED, state=ActionState.APPROVED,
            by="sre@example.com", commands=(cid,), mode=ActuatorMode.APPROVE, ts=T0,
        ),
        "deadletter": DeadLetter(
            source_topic="x.steps", partition=2, offset=41, key=b"job-1",
            raw=b"\x00\xffnot json", error="bad", ts=T0,
        ),
        "truth": FaultTruth(
            scenario="demo", job_id="job-1", fault_id="f1", kind=FaultKind.STRAGGLER,
            node="node-3", rank=27, onset_step=100, end_step=400, magnitude=0.2,
        ),
        "lifecycle": JobEvent(
            job_id="job-1", kind=JobEventKind.END, reason=EndReason.COMPLETED, ts=T0,
            step=400, run="attempt-2", source="node-0",
        ),
    }  # fmt: skip


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)
_times = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
_pos = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
_any_float = st.floats(allow_nan=True, allow_infinity=True)


@st.composite
def step_telemetry_st(draw: st.DrawFn) -> StepTelemetry:
    n = draw(st.integers(1, 8))
    ranks = draw(
        st.lists(st.integers(0, MAX_RANKS_PER_JOB - 1), min_size=n, max_size=n, unique=True)
    )
    start = draw(_times)
    return StepTelemetry(
        job_id=draw(_text),
        node=draw(_text),
        run=draw(st.just("") | _text),
        step=draw(st.integers(0, 1 << 40)),
        ts_start=start,
        ts_end=start + timedelta(seconds=draw(st.floats(0, 1e4))),
        samples=tuple(
            RankSample(
                rank=r,
                local_rank=draw(st.integers(0, 64)),
                pp_stage=draw(st.integers(0, 64)),
                phase=draw(st.sampled_from(Phase)),
                step_time_s=draw(_pos),
                compute_s=draw(_pos),
                comm_wait_s=draw(_pos),
                data_wait_s=draw(_pos),
                loss=draw(st.none() | _any_float),
                grad_norm=draw(st.none() | _any_float),
            )
            for r in ranks
        ),
    )


@st.composite
def alert_st(draw: st.DrawFn) -> Alert:
    return Alert(
        fingerprint=draw(st.text("0123456789abcdef", min_size=8, max_size=64)),
        seq=draw(st.integers(0, 1000)),
        kind=draw(st.sampled_from(AlertKind)),
        grade=draw(st.sampled_from(Grade)),
        state=draw(st.sampled_from(AlertState)),
        job_id=draw(_text),
        node=draw(st.none() | _text),
        rank=draw(st.none() | st.integers(0, 9999)),
        step=draw(st.none() | st.integers(0, 1 << 40)),
        started_at=draw(_times),
        ts=draw(_times),
        evidence=Evidence(
            metric=draw(_text),
            value=draw(st.floats(allow_nan=False, allow_infinity=False)),
            deviation=draw(_pos),
            peer_median=draw(st.none() | _pos),
        ),
        recommended_action=draw(st.sampled_from(RecommendedAction)),
        summary=draw(st.text(max_size=50)),
    )


@st.composite
def dead_letter_st(draw: st.DrawFn) -> DeadLetter:
    return DeadLetter(
        source_topic=draw(_text),
        partition=draw(st.integers(-1, 100)),
        offset=draw(st.integers(-1, 1 << 50)),
        key=draw(st.none() | st.binary(max_size=20)),
        raw=draw(st.binary(max_size=200)),
        error=draw(st.text(max_size=50)),
        ts=draw(_times),
    )


@st.composite
def command_st(draw: st.DrawFn) -> Command:
    return Command(
        command_id=draw(st.text("abcdef0123456789-", min_size=4, max_size=64)),
        kind=draw(st.sampled_from(CommandKind)),
        job_id=draw(_text),
        targets=tuple(draw(st.lists(_text, max_size=4))),
        reason=tuple(draw(st.lists(_text, max_size=3))),
        mode=draw(st.sampled_from(ActuatorMode)),
        issued_at=draw(_times),
        checkpoint_step=draw(st.none() | st.integers(0, 1 << 40)),
    )


ANY_MESSAGE = st.one_of(step_telemetry_st(), alert_st(), dead_letter_st(), command_st())


def metric_sum(text: str, name: str) -> float:
    """The sum of every sample of metric ``name`` in a Prometheus text exposition:
    exactly that metric (``stepguard_worker_jobs`` is not ``..._jobs_by_state``), every
    label set, or only the series ``name`` spells out with its labels."""
    total = 0.0
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, _, value = line.rpartition(" ")
        if series == name or series.split("{", 1)[0] == name:
            total += float(value)
    return total
