"""The actuator: confirmed alerts become signed, idempotent commands within guardrails.

- :mod:`~pipeline.policy` — the pure decision logic (episodes, modes,
  guardrails, spare pool);
- :mod:`~pipeline.actuator.service` — the Kafka loop (``stepguard actuator``);
- :mod:`~pipeline.actuator.signing` — Ed25519 signatures (per role) and command checks;
- :mod:`~pipeline.actuator.executors` — dry-run, Slurm and webhook executors.

The job-controller executor lives in :mod:`pipeline.listener` (imported by training
code).
"""

from pipeline.policy import Outcome, Policy, PolicyParams, action_id

__all__ = ["Outcome", "Policy", "PolicyParams", "action_id"]
