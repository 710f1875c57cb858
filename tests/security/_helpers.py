"""Small builders the security tests share: a worker core fed a healthy 8-node job,
signed and unsigned commands and results, and a hardware report."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from pipeline.io.trust import SigningKey, sign
from pipeline.services.worker.state import CoreTopics, WorkerDetection
from schemas import (
    ActuatorMode,
    Command,
    CommandKind,
    CommandResult,
    CommandStatus,
    GpuHealth,
    NodeHealth,
    RankSample,
    StepTelemetry,
    encode,
)
from tests.clock import day_start
from tests.factories import ACTUATOR_KEY, job_controller_key, test_key

T0 = day_start()
TOPICS = CoreTopics("steps", "health", "jobs", commands="commands", lifecycle="lifecycle",
                    results="results")  # fmt: skip
STEP_S = 1.3
#: an attacker's key under a real key id: well-formed, wrong
FORGER = test_key("attacker")


def impostor(key: SigningKey) -> SigningKey:
    """The attacker's private key presented under ``key``'s id."""
    return SigningKey(key.key_id, FORGER.private)


class Clock:
    """The worker's wall clock, moved by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def step_msg(step: int, node: int, job: str = "j", t0: datetime = T0) -> bytes:
    """Node ``node``'s telemetry of ``step`` in a run that started at ``t0``."""
    samples = tuple(
        RankSample(rank=node * 8 + g, local_rank=g, step_time_s=STEP_S,
                   compute_s=1.0 + 0.001 * ((node * 8 + g + step) % 5),
                   comm_wait_s=0.2, data_wait_s=0.01)
        for g in range(8)
    )  # fmt: skip
    ts = t0 + timedelta(seconds=STEP_S * step)
    return encode(
        StepTelemetry(
            job_id=job,
            node=f"n{node}",
            step=step,
            ts_start=ts,
            ts_end=ts + timedelta(seconds=STEP_S),
            samples=samples,
        )
    )


#: the controller key of job ``j`` (what its training process signs results with)
JOB_J_KEY = job_controller_key("j")


def worker(clock: Clock | None = None, **kw: object) -> WorkerDetection:
    """A worker that holds the actuator's and the job controllers' public keys only."""
    args: dict[str, object] = {"command_keys": ACTUATOR_KEY.verifier(),
                               "result_keys": JOB_J_KEY.verifier()}  # fmt: skip
    if clock is not None:
        args["clock"] = clock
    return WorkerDetection(TOPICS, 8, **(args | kw))  # type: ignore[arg-type]


def feed(core: WorkerDetection, steps: range, offset: int = 0, t0: datetime = T0) -> list:
    """Every node's telemetry of ``steps`` of a run that started at ``t0``; the alerts
    it raised."""
    alerts = []
    for s in steps:
        for n in range(8):
            alerts += core.handle_step(0, offset, b"j", step_msg(s, n, t0=t0), token=offset).alerts
            offset += 1
    return alerts


def command(kind: CommandKind, targets: tuple[str, ...] = (), key: SigningKey | None = None,
            cid: str = "cmd-1") -> Command:  # fmt: skip
    now = datetime.now(UTC)
    cmd = Command(command_id=cid, kind=kind, job_id="j", targets=targets, reason=("fp",),
                  mode=ActuatorMode.AUTO, issued_at=now,
                  expires_at=now + timedelta(minutes=5))  # fmt: skip
    return cmd if key is None else sign(cmd, key)


def result(cid: str = "cmd-1", key: SigningKey | None = None,
           status: CommandStatus = CommandStatus.SUCCEEDED) -> CommandResult:  # fmt: skip
    res = CommandResult(command_id=cid, job_id="j", executor="job-controller", status=status,
                        ts=datetime.now(UTC))  # fmt: skip
    return res if key is None else sign(res, key)


def ecc_report(node: str, at: datetime) -> bytes:
    """An uncorrectable ECC error: critical at once."""
    gpu = GpuHealth(index=0, temperature_c=60, power_w=300, sm_clock_mhz=1400,
                    utilization_pct=90, ecc_uncorrected=1)  # fmt: skip
    return encode(NodeHealth(job_id="j", node=node, ts=at, gpus=(gpu,)))
