"""``stepguard compare``: one fault trace under passive, active and hybrid policies.

Every policy plays the same seeded scenario in process (no broker: the question is
what the policy costs, not how the bytes travel):

- **passive**: periodic checkpoints only; the job is relaunched from the last
  checkpoint when it fails: a crashed node after the communication timeout (the
  peers' collectives time out; the scheduler then excludes the dead host), a hang
  once it reaches the communication timeout. Slow nodes are never noticed.
- **active**: stepguard in auto mode: the detection core (``JobDetection``) and the
  actuator's policy act at once, within the same guardrails as production.
- **hybrid**: the same decisions, applied only after a modelled human approval delay.

The three policies are :data:`pipeline.tools.plan.RULES`: ``stepguard plan`` runs the same
rules over thousands of whole-job fault traces at event level, so the two cannot drift.

Lost GPU-hours = (wall time - useful steps x ideal step time) x ranks: everything the
job paid for beyond a perfect run (slow steps, stalls, relaunches, redone steps,
checkpoint saves).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from detectors.job import JobDetection
from pipeline.policy import Policy, PolicyParams
from pipeline.tools.plan import POLICIES, RULES
from pipeline.tools.simulator import Scenario, SimulatedJob
from pipeline.tools.simulator.control import JobController
from schemas import ActuatorMode, Command, CommandKind

__all__ = ["POLICIES", "PolicyResult", "compare", "run_policy"]


@dataclass(frozen=True, slots=True)
class PolicyResult:
    policy: str
    goodput: float
    lost_gpu_hours: float
    mttr_s: float | None  #: mean fault onset -> remedy, over remedied faults
    unremedied_faults: int
    restarts: int
    isolations: int
    false_isolations: int
    checkpoints: int
    checkpoint_overhead_s: float
    wall_s: float
    useful_steps: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _apply(controller: JobController, commands: Sequence[Command], step: int) -> None:
    for cmd in commands:
        if cmd.kind is CommandKind.CHECKPOINT:
            controller.checkpoint(cmd, step)
        elif cmd.kind is CommandKind.ISOLATE:
            controller.isolate(cmd, step)
    controller.queue(list(commands))  # RESTART and ROLLBACK at the next boundary


def run_policy(
    scenario: Scenario,
    policy: str,
    *,
    approval_delay_s: float = 300.0,
    comm_timeout_steps: float = 30.0,
) -> PolicyResult:
    """Play ``scenario`` under one policy and account for what it cost."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
    rules = RULES[policy]
    job = SimulatedJob(scenario)
    controller = JobController(job)
    nominal = job.nominal_step_s
    truth = [t for t in scenario.truth() if not t.is_trap]
    faulty = {t.node for t in truth if t.node}
    onset_ts: dict[str, float] = {}
    remedy_ts: dict[str, float] = {}
    detection = JobDetection(scenario.job) if rules.detects else None
    actuator = Policy(
        PolicyParams(
            mode=ActuatorMode.AUTO, spare_nodes=tuple(job.spare_pool),
            default_job_nodes=scenario.nodes,
        )
    )  # fmt: skip
    delayed: list[tuple[float, int, list[Command]]] = []
    seq = 0
    relaunches_seen = 0
    marked = 0  # controller.applied entries already matched to faults
    for ev in job.events():
        now = datetime.fromtimestamp(ev.ts, UTC)
        for t in truth:
            if t.fault_id not in onset_ts and job.step >= t.onset_step:
                onset_ts[t.fault_id] = ev.ts
        decided: list[Command] = []
        if detection is not None:
            alerts = []
            for h in ev.health:
                alerts += detection.on_health(h)
            if ev.frame is not None:
                alerts += detection.on_frame(ev.frame)
            alerts += detection.tick(ev.ts)
            for a in alerts:
                decided += actuator.on_alert(a, now).commands
            if ev.frame is not None:
                decided += actuator.on_progress(scenario.job, ev.frame.step, now, now).commands
        if decided:
            if rules.human_approval:
                heapq.heappush(delayed, (ev.ts + approval_delay_s, seq, decided))
                seq += 1
            else:
                _apply(controller, decided, job.step)
        while delayed and delayed[0][0] <= ev.ts:
            _apply(controller, heapq.heappop(delayed)[2], job.step)
        if rules.relaunch_on_timeout and job.stalled and job.stall_kind in ("hang", "dead"):
            since = job.stalled_since or ev.ts
            if ev.ts - since >= comm_timeout_steps * nominal:
                dead = job.dead_nodes
                for node in dead:
                    job.isolate(node)
                job.restart(job.last_checkpoint + 1 if job.last_checkpoint is not None else 0)
                controller.relaunches += 1
                controller.applied.append((job.step, "restart", f"after timeout, {dead}"))
        controller.at_boundary()
        if detection is not None and controller.relaunches > relaunches_seen:
            relaunches_seen = controller.relaunches
            detection.relaunched(removed_nodes=job.isolated)
        for _, kind, detail in controller.applied[marked:]:
            if kind in ("isolate", "restart", "rollback"):
                for t in truth:
                    hit = (t.node is not None and t.node in detail) or (
                        t.node is None and kind in ("restart", "rollback")
                    )
                    if hit and t.fault_id in onset_ts and t.fault_id not in remedy_ts:
                        remedy_ts[t.fault_id] = ev.ts
        marked = len(controller.applied)
    g = job.goodput()
    lost = max(0.0, g.wall_s - g.useful_steps * g.ideal_step_s) * scenario.n_ranks / 3600
    delays = [remedy_ts[f] - onset_ts[f] for f in remedy_ts]
    isolated = list(job.isolated)
    return PolicyResult(
        policy=policy, goodput=round(g.fraction, 4), lost_gpu_hours=round(lost, 3),
        mttr_s=round(sum(delays) / len(delays), 1) if delays else None,
        unremedied_faults=len(truth) - len(remedy_ts), restarts=controller.relaunches,
        isolations=len(isolated), false_isolations=sum(1 for n in isolated if n not in faulty),
        checkpoints=len(job.checkpoints),
        checkpoint_overhead_s=round(len(job.checkpoints) * scenario.checkpoint_s, 1),
        wall_s=round(g.wall_s, 1), useful_steps=g.useful_steps,
    )  # fmt: skip


def compare(scenario: Scenario, **kw: float) -> dict[str, PolicyResult]:
    return {p: run_policy(scenario, p, **kw) for p in POLICIES}


def plot(results: dict[str, dict[str, PolicyResult]], path: Path) -> Path:
    """Bars of lost GPU-hours and goodput per policy (one group per setting)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    settings = list(results)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    width = 0.8 / len(POLICIES)
    for i, pol in enumerate(POLICIES):
        xs = [j + i * width for j in range(len(settings))]
        ax1.bar(xs, [results[s][pol].lost_gpu_hours for s in settings], width, label=pol)
        ax2.bar(xs, [results[s][pol].goodput for s in settings], width, label=pol)
    for ax, title in ((ax1, "lost GPU-hours"), (ax2, "goodput")):
        ax.set_xticks([j + width for j in range(len(settings))], settings, fontsize=8)
        ax.set_title(title)
    ax1.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path
