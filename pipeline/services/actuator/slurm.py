"""The Slurm executor: drains that respect their owners, resumes of stepguard's own, requeues.

=============  ===========================================================================
Command        What :class:`SlurmExecutor` does (``scontrol``/``squeue``, argument lists)
=============  ===========================================================================
ISOLATE        per target: reads the node (``scontrol show node X``); a node already
               drained, down or failed is left as it is (its reason untouched);
               otherwise ``scontrol update NodeName=X State=DRAIN Reason=...`` with
               :func:`drain_reason` (``stepguard: <cause> (incident <key>)``), then
               reads it back
RESTART        only for jobs stepguard was told are Slurm jobs (:class:`SlurmJobs`):
               ``scontrol requeuehold``, ``scontrol update JobId=N ExcNodeList=...``
               (the job's own exclusions plus the targets), ``scontrol release``; a
               pending job only gains the exclusions. Other jobs' RESTARTs are not
               handled here (the job controller takes them)
resume         ``stepguard resume-node X``: ``State=RESUME`` only of a node whose reason
               is stepguard's own (``--force``: any, logged as a warning)
=============  ===========================================================================

Ownership is the reason: a drain is stepguard's when its reason begins with
:data:`OWNER_PREFIX`. Slurm itself keeps no owner (a second DRAIN replaces the reason,
RESUME clears anyone's drain), so the executor reads before it writes; between the
read and the write (milliseconds) an administrator's drain can still be replaced.

Results. Each node's outcome is a typed :class:`Isolation` (:class:`IsolateOutcome`); the
command's result is SUCCEEDED when every target is out of service, whoever took it out
(the job must not use it either way), and its detail names each node's outcome:
``node-3: drained (stepguard: ...)``, ``node-4: already isolated by someone else
(IDLE+DRAIN: admin: bad fan)``, ``node-5: already drained by stepguard (...)``. A
failing ``scontrol`` is FAILED; a bad node name, or a RESTART target outside the Slurm
job's allocation, is REFUSED (nothing runs). RESTART is SUCCEEDED once the job is back
in the queue with the exclusions set (:class:`Requeue`); that is the relaunch the worker
acts on.

Reason length: ``slurmctld`` keeps any length, but slurmdbd's event table stores a
node's reason in a ``tinytext`` (255 bytes), so reasons are cut to
:data:`REASON_MAX_BYTES`, keeping the incident key at the end.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from pipeline.io.errors import ConfigError
from pipeline.services.actuator.base import (
    ExecutionError,
    Executor,
    InvalidNodeName,
    validate_node_name,
)
from schemas import Command, CommandKind

__all__ = [
    "OWNER_PREFIX",
    "REASON_MAX_BYTES",
    "IsolateOutcome",
    "Isolation",
    "NodeNotInJob",
    "NodeState",
    "Requeue",
    "Resume",
    "ResumeOutcome",
    "ResumeRefused",
    "SlurmExecutor",
    "SlurmJobs",
    "drain_reason",
    "parse_node",
]

log = logging.getLogger(__name__)

#: A drain whose reason begins with this is stepguard's own.
OWNER_PREFIX = "stepguard:"
#: slurmdbd stores a node's reason in a tinytext column: 255 bytes.
REASON_MAX_BYTES = 255
_REASON_UNSAFE = re.compile(r"[^A-Za-z0-9 ._:/,=+#%()-]")
_SLURM_JOB_ID = re.compile(r"^[0-9]{1,10}(_[0-9]{1,10})?$")
_REASON_STAMP = re.compile(r" \[[^\[\]]*@[^\[\]]*\]$")  # " [root@2026-12-01T21:29:05]"
#: state words that mean the node is out of service (``IDLE+DRAIN``, ``DOWN*``, ``FAIL``)
_OUT_OF_SERVICE = frozenset({"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING"})
_REQUEUE_STATES = frozenset({"RUNNING", "SUSPENDED", "CONFIGURING"})


class ResumeRefused(ExecutionError):
    """``resume-node`` of a node stepguard did not drain (``--force`` overrides)."""


class NodeNotInJob(InvalidNodeName):
    """A RESTART target the Slurm job does not run on: a wrong job mapping; refused."""


class IsolateOutcome(StrEnum):
    """What ISOLATE did with one node."""

    DRAINED = "drained"
    #: drained by stepguard before (its reason is stepguard's): left as it is
    ALREADY_OURS = "already drained by stepguard"
    #: drained, down or failed by someone else: neither state nor reason touched
    ISOLATED_BY_OTHER = "already isolated by someone else"


class ResumeOutcome(StrEnum):
    """What ``resume-node`` did."""

    RESUMED = "resumed"
    #: resumed with ``--force`` although someone else had isolated it
    FORCED = "resumed (forced)"
    #: the node was in service: nothing to do
    NOT_ISOLATED = "not isolated"


@dataclass(frozen=True, slots=True)
class NodeState:
    """A node as ``scontrol show node`` shows it."""

    name: str
    #: e.g. ``IDLE``, ``IDLE+DRAIN``, ``DOWN+NOT_RESPONDING``
    state: str
    #: the reason without Slurm's ``[user@time]`` stamp; ``None``: no reason
    reason: str | None

    @property
    def out_of_service(self) -> bool:
        """Drained, draining, down or failed."""
        words = {w.rstrip("*~#!%$@^-") for w in self.state.upper().split("+")}
        return bool(words & _OUT_OF_SERVICE)

    @property
    def ours(self) -> bool:
        """Its reason is stepguard's."""
        return self.reason is not None and self.reason.startswith(OWNER_PREFIX)

    def describe(self) -> str:
        return f"{self.state}: {self.reason}" if self.reason else self.state


@dataclass(frozen=True, slots=True)
class Isolation:
    """One node's ISOLATE outcome and the node as it is afterwards."""

    node: str
    outcome: IsolateOutcome
    after: NodeState

    def describe(self) -> str:
        if self.outcome is IsolateOutcome.DRAINED:
            return f"{self.node}: drained ({self.after.reason})"
        return f"{self.node}: {self.outcome.value} ({self.after.describe()})"


@dataclass(frozen=True, slots=True)
class Resume:
    """What ``resume-node`` did with a node that had ``before`` state."""

    node: str
    outcome: ResumeOutcome
    before: NodeState
    #: the node read back after the update (``None``: nothing was updated)
    after: NodeState | None = None

    def describe(self) -> str:
        if self.outcome is ResumeOutcome.NOT_ISOLATED:
            return f"{self.node} is not isolated ({self.before.state}): nothing to resume"
        now = f", now {self.after.state}" if self.after is not None else ""
        return f"{self.outcome.value} {self.node} (was {self.before.describe()}{now})"


@dataclass(frozen=True, slots=True)
class Requeue:
    """A RESTART carried out as Slurm does it."""

    slurm_job: str
    #: the job's state before (``RUNNING``: requeued; ``PENDING``: exclusions only)
    state: str
    excluded: tuple[str, ...]

    def describe(self) -> str:
        exc = ",".join(self.excluded) or "unchanged"
        if self.state in _REQUEUE_STATES:
            return f"Slurm job {self.slurm_job} requeued (was {self.state}), ExcNodeList={exc}"
        return f"Slurm job {self.slurm_job} still {self.state}: not requeued, ExcNodeList={exc}"


def drain_reason(cause: str | None, incident: str, command_id: str) -> str:
    """The drain reason: ownership, cause and incident, within :data:`REASON_MAX_BYTES`.

    >>> drain_reason("hardware: GPU 2: fatal XID 79", "1a2b3c4d5e6f7a8b9c0d", "cmd-1")
    'stepguard: hardware: GPU 2: fatal XID 79 (incident 1a2b3c4d5e6f)'
    >>> len(drain_reason("x" * 1000, "1a2b3c4d5e6f", "cmd-1"))
    255
    >>> drain_reason(None, "ff00", "cmd-9; reboot")
    'stepguard: isolated by command cmd-9_ reboot (incident ff00)'
    """
    text = " ".join((cause or f"isolated by command {command_id}").split())
    text = _REASON_UNSAFE.sub("_", text)
    tail = f" (incident {re.sub(r'[^A-Za-z0-9]', '', incident)[:12]})"
    room = REASON_MAX_BYTES - len(OWNER_PREFIX) - 1 - len(tail)
    if len(text) > room:
        text = text[: room - 3].rstrip() + "..."
    return f"{OWNER_PREFIX} {text}{tail}"


def parse_node(name: str, text: str) -> NodeState:
    """A node from ``scontrol show node NAME`` (several lines; the reason on its own).

    >>> out = '''NodeName=node-3 Arch=x86_64 CoresPerSocket=1
    ...    State=IDLE+DRAIN ThreadsPerCore=1 TmpDisk=0 Weight=1
    ...    Reason=bad fan | State=IDLE [root@2026-12-01T21:29:05]
    ... '''
    >>> parse_node("node-3", out)
    NodeState(name='node-3', state='IDLE+DRAIN', reason='bad fan | State=IDLE')
    """
    lines = text.splitlines()
    if not lines or not re.match(rf"NodeName={re.escape(name)}(\s|$)", lines[0]):
        raise ExecutionError(f"scontrol show node {name}: unexpected output {text[:200]!r}")
    state = reason = None
    for line in lines[1:]:
        stripped = line.strip()
        if stripped.startswith("Reason="):  # the reason is free text: never read into
            reason = _REASON_STAMP.sub("", stripped[len("Reason=") :])
            break
        found = re.search(r"(?:^|\s)State=(\S+)", stripped)
        if found and state is None:
            state = found.group(1)
    if state is None:
        raise ExecutionError(f"scontrol show node {name}: no State in {text[:200]!r}")
    return NodeState(name, state, reason if reason not in (None, "", "(null)") else None)


class SlurmJobs:
    """Which stepguard jobs are Slurm jobs, and their Slurm job ids.

    Told by the operator, never by a topic: ``STEPGUARD_SLURM_JOBS`` pairs
    (``llm-7=1234``), and ``STEPGUARD_SLURM_JOB_PREFIX`` for jobs named after their Slurm
    job (the prefix ``slurm-`` makes ``slurm-1234`` Slurm job 1234: what a training
    script launched by ``sbatch`` names its job from ``$SLURM_JOB_ID``).

    >>> jobs = SlurmJobs.parse("llm-7=1234, llm-8=1240_3", prefix="slurm-")
    >>> jobs.slurm_id("llm-7"), jobs.slurm_id("slurm-99"), jobs.slurm_id("slurm-x")
    ('1234', '99', None)
    >>> SlurmJobs.parse("llm-7=12;reboot")
    Traceback (most recent call last):
    ...
    pipeline.io.errors.ConfigError: slurm_jobs: '12;reboot' is not a Slurm job id
    """

    def __init__(self, pairs: dict[str, str] | None = None, prefix: str = "") -> None:
        self.pairs = dict(pairs or {})
        self.prefix = prefix

    @classmethod
    def parse(cls, text: str, prefix: str = "") -> SlurmJobs:
        pairs: dict[str, str] = {}
        for part in text.split(","):
            if not part.strip():
                continue
            job, sep, slurm_id = (x.strip() for x in part.partition("="))
            if not sep or not job:
                raise ConfigError(f"slurm_jobs: expected job=slurm_job_id, got {part!r}")
            if not _SLURM_JOB_ID.match(slurm_id):
                raise ConfigError(f"slurm_jobs: {slurm_id!r} is not a Slurm job id")
            pairs[job] = slurm_id
        return cls(pairs, prefix)

    def slurm_id(self, job_id: str) -> str | None:
        """The Slurm job id of ``job_id``, or ``None``: not a Slurm job."""
        if job_id in self.pairs:
            return self.pairs[job_id]
        if self.prefix and job_id.startswith(self.prefix):
            rest = job_id[len(self.prefix) :]
            return rest if _SLURM_JOB_ID.match(rest) else None
        return None


class SlurmExecutor(Executor):
    """ISOLATE as a drain stepguard owns, RESTART as a requeue (see the module docstring).

    ``squeue`` defaults to the one beside ``scontrol`` when ``scontrol`` is a path.
    """

    name = "slurm"

    def __init__(
        self,
        scontrol: str = "scontrol",
        timeout_s: float = 30.0,
        *,
        squeue: str | None = None,
        jobs: SlurmJobs | None = None,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        self.scontrol = scontrol
        beside = os.path.join(os.path.dirname(scontrol), "squeue")
        self.squeue = squeue or (beside if os.sep in scontrol else "squeue")
        self.timeout_s = timeout_s
        self.jobs = jobs or SlurmJobs()

    def handles(self, cmd: Command) -> bool:
        if cmd.kind is CommandKind.ISOLATE:
            return True
        return cmd.kind is CommandKind.RESTART and self.jobs.slurm_id(cmd.job_id) is not None

    def execute(self, cmd: Command) -> str:
        if cmd.kind is CommandKind.RESTART:
            return self.requeue(cmd).describe()
        return "; ".join(i.describe() for i in self.isolate(cmd))

    # -- nodes ---------------------------------------------------------------------------
    def node(self, name: str) -> NodeState:
        """Read one node (``scontrol show node NAME``)."""
        name = validate_node_name(name)
        return parse_node(name, self._run(self.scontrol, "show", "node", name))

    def isolate(self, cmd: Command) -> list[Isolation]:
        """Drain every target that is in service; leave the others (and their reasons)."""
        nodes = [validate_node_name(n) for n in cmd.targets]  # all or nothing
        if not nodes:
            raise ExecutionError("ISOLATE without targets")
        incident = cmd.incident or (cmd.reason[0] if cmd.reason else cmd.command_id)
        reason = drain_reason(cmd.cause, incident, cmd.command_id)
        out = []
        for node in nodes:
            before = self.node(node)
            if before.out_of_service:
                mine = before.ours
                kind = IsolateOutcome.ALREADY_OURS if mine else IsolateOutcome.ISOLATED_BY_OTHER
                out.append(Isolation(node, kind, before))
                continue
            self._update_node(node, "DRAIN", reason)
            after = self.node(node)
            if not (after.out_of_service and after.ours):
                raise ExecutionError(f"drained {node} but it reads back as {after.describe()}")
            out.append(Isolation(node, IsolateOutcome.DRAINED, after))
        return out

    def resume(self, node: str, *, force: bool = False) -> Resume:
        """Put back a node stepguard drained; ``force``: whoever isolated it (logged).

        Raises :class:`ResumeRefused` for a node someone else isolated without ``force``,
        and :class:`ExecutionError` when the node, read back after the update, is still
        out of service.
        """
        before = self.node(node)
        if not before.out_of_service:
            return Resume(node, ResumeOutcome.NOT_ISOLATED, before)
        if not before.ours and not force:
            raise ResumeRefused(
                f"{node} was isolated by someone else ({before.describe()}): not resuming "
                "it (--force overrides)"
            )
        if not before.ours:
            log.warning("resume-node --force: resuming %s, isolated by someone else (%s)",
                        node, before.describe())  # fmt: skip
        self._update_node(node, "RESUME", None)
        after = self.node(node)  # what took effect, not what was asked
        if after.out_of_service:
            raise ExecutionError(
                f"scontrol accepted State=RESUME but {node} is still out of service "
                f"({after.describe()})"
            )
        outcome = ResumeOutcome.RESUMED if before.ours else ResumeOutcome.FORCED
        log.info("%s %s (was %s)", outcome.value, node, before.describe())
        return Resume(node, outcome, before, after)

    # -- jobs ----------------------------------------------------------------------------
    def requeue(self, cmd: Command) -> Requeue:
        """Requeue the command's Slurm job, excluding its targets (see the module doc)."""
        slurm_job = self.jobs.slurm_id(cmd.job_id)
        if slurm_job is None:
            raise ExecutionError(f"{cmd.job_id} is not a Slurm job (STEPGUARD_SLURM_JOBS)")
        targets = [validate_node_name(n) for n in cmd.targets]
        state, nodes, excluded = self._job(slurm_job)
        if state in _REQUEUE_STATES:
            running_on = set(self._hostnames(nodes))
            if outside := [n for n in targets if n not in running_on]:
                raise NodeNotInJob(
                    f"Slurm job {slurm_job} ({cmd.job_id}) does not run on "
                    f"{','.join(outside)} (it runs on {nodes}): not requeued"
                )
        elif state != "PENDING":
            raise ExecutionError(f"Slurm job {slurm_job} is {state}: nothing to restart")
        exclude = tuple(dict.fromkeys([*self._hostnames(excluded), *targets]))
        requeue = state in _REQUEUE_STATES
        if requeue:  # held while pending: it cannot start before the exclusions are set
            self._run(self.scontrol, "requeuehold", slurm_job)
        problem = None
        if targets:
            try:
                self._run(self.scontrol, "update", f"JobId={slurm_job}",
                          f"ExcNodeList={','.join(exclude)}")  # fmt: skip
            except ExecutionError as exc:
                problem = exc
        if requeue:  # never left held, even when the exclusions failed
            self._run(self.scontrol, "release", slurm_job)
        if problem is not None:
            raise ExecutionError(
                f"Slurm job {slurm_job} {'requeued' if requeue else 'pending'} without its "
                f"exclusions ({','.join(exclude)}): {problem}"
            ) from problem
        return Requeue(slurm_job, state, exclude if targets else ())

    def _job(self, slurm_job: str) -> tuple[str, str, str]:
        """State, node list and excluded nodes (``squeue``: fields no user writes)."""
        out = self._run(self.squeue, "-h", "-j", slurm_job, "-o", "%i|%T|%N|%x").strip()
        rows = [r.split("|") for r in out.splitlines()]
        for row in rows:
            if len(row) == 4 and row[0] == slurm_job:
                return row[1], row[2], row[3]
        raise ExecutionError(f"squeue knows no Slurm job {slurm_job}: {out[:200]!r}")

    def _hostnames(self, hostlist: str) -> list[str]:
        if not hostlist or hostlist == "(null)":
            return []
        return self._run(self.scontrol, "show", "hostnames", hostlist).split()

    # -- running -------------------------------------------------------------------------
    def _update_node(self, node: str, state: str, reason: str | None) -> None:
        argv = ["update", f"NodeName={node}", f"State={state}"]
        if reason is not None:
            argv.append(f"Reason={reason}")
        self._run(self.scontrol, *argv)

    def _run(self, exe: str, *args: str) -> str:
        argv: Sequence[str] = [exe, *args]
        try:
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ExecutionError(f"{exe} failed: {exc}") from exc
        if proc.returncode != 0:
            raise ExecutionError(
                f"{os.path.basename(exe)} {' '.join(args[:3])} exited {proc.returncode}: "
                f"{proc.stderr.strip()[:300]}"
            )
        return proc.stdout
