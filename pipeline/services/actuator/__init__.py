"""The actuator: confirmed alerts become signed, idempotent commands within guardrails.

- :mod:`~pipeline.policy` — the pure decision logic (episodes, modes,
  guardrails, spare pool);
- :mod:`~pipeline.services.actuator.service` — the Kafka loop (``stepguard actuator``);
- :mod:`~pipeline.io.trust` — Ed25519 signatures (per role) and command checks;
- :mod:`~pipeline.services.actuator.kinds` — the executor kinds, the one list the
  command line, ``stepguard up`` and docs/actuator.md follow;
- :mod:`~pipeline.services.actuator.executors` — dry-run and webhook executors, the
  builder of each kind and the runner that feeds every executor;
- :mod:`~pipeline.services.actuator.slurm` — the Slurm executor (drains it owns, resumes,
  requeues); :mod:`~pipeline.services.actuator.base` — what every executor shares;
- :mod:`~pipeline.services.actuator.kubernetes` — the Kubernetes executor (cordon, taint,
  provenance, evictions; :mod:`.kube_nodes` decides what it writes and whose a node's
  state is, :mod:`.kube_dra` the DRA device taints).

The job-controller executor lives in :mod:`pipeline.client.listener` (imported by training
code).
"""

from pipeline.policy import Outcome, Policy, PolicyParams, action_id

__all__ = ["Outcome", "Policy", "PolicyParams", "action_id"]
