"""What ``stepguard calibrate`` reads from the archive: each job's records and labels.

Records: the job's steps (assembled back into one :class:`~detectors.frame.StepFrame`
per run and step), its health reports (and those of its nodes archived without a
job), commands, command results and lifecycle events, everything the detection core
takes. Labels, strongest first when several speak of one incident:

=============  ===========================================================================
``truth``      the simulator's injected faults (``fault_truth``): a job that has them is
               *fully labelled*, so any other alert in it is a false positive
``label``      ``stepguard label INCIDENT --true|--false`` (the latest verdict)
``approval``   a human approved (true) or rejected (false) the action an incident led to
               (an approval an operator signed, of an action record the actuator signed)
``outcome``    a command the incident led to (signed by the actuator) was carried out
               (succeeded) and nobody objected: weak evidence that it was real
=============  ===========================================================================

Rows that cannot be read back as records (a value outside a message's bounds) are
counted in :attr:`ArchivedJob.skipped` and left out, never fatal.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import numpy.typing as npt

from detectors.frame import StepFrame, optional_columns
from pipeline.io.errors import ConfigError
from pipeline.services.archive.backend import ArchiveBackend
from pipeline.tools.calibrate.labels import incident_labels
from schemas import Command, CommandResult, GpuHealth, JobEvent, NodeHealth
from schemas.telemetry import FIELDS, OPTIONAL_FIELDS

__all__ = [
    "LABEL_SOURCES",
    "ArchivedJob",
    "Label",
    "archived_jobs",
    "job_ids",
    "load_job",
]

#: Label sources, strongest first (see the module docstring).
LABEL_SOURCES: tuple[str, ...] = ("truth", "label", "approval", "outcome")
#: Fault kinds that stop the whole job: a job-level hang alert meanwhile is neither
#: right nor wrong about the culprit (it does not name it).
_STOPPING = frozenset({"crash", "ecc_storm"})


@dataclass(frozen=True, slots=True)
class Label:
    """One thing that did or did not happen: a fault (``truth`` True) or a false alarm."""

    source: str  #: one of LABEL_SOURCES
    ref: str  #: fault id or incident id
    kind: str  #: fault kind (truth) or alert kind (the others)
    node: str | None  #: the culprit, None for the whole job
    onset_step: int
    end_step: int | None  #: last step it lasted (None: to the end)
    truth: bool
    magnitude: float | None = None

    def window(self, last_step: int, grace: int) -> tuple[int, float]:
        """Steps in which an alert speaks of it: a fault from its onset to its end plus
        ``grace``; a judged incident ``grace`` steps either side of its alerts (a replay
        under other settings may fire earlier or later)."""
        lo = self.onset_step if self.source == "truth" else self.onset_step - grace
        if self.end_step is None:
            return lo, math.inf
        return lo, min(self.end_step, max(last_step, self.end_step)) + grace

    @property
    def stops_job(self) -> bool:
        return self.truth and self.kind in _STOPPING


@dataclass(slots=True)
class ArchivedJob:
    """One job as the archive has it, ready to replay. Plain data (it travels to the
    worker processes of a calibration)."""

    job_id: str
    frames: list[StepFrame]
    health: list[NodeHealth]
    commands: list[Command]
    results: list[CommandResult]
    events: list[JobEvent]
    labels: list[Label]
    fully_labelled: bool
    skipped: int = 0
    label_counts: dict[str, int] = field(default_factory=dict)

    @property
    def rank_steps(self) -> int:
        return sum(f.n_ranks for f in self.frames)

    @property
    def last_step(self) -> int:
        return max((f.step for f in self.frames), default=-1)


def _since_ms(since: datetime | None) -> int:
    return 0 if since is None else int(since.timestamp() * 1000)


def job_ids(backend: ArchiveBackend, since: datetime | None = None) -> list[str]:
    """Jobs with steps archived at or after ``since`` (every job when None)."""
    _, rows = backend.query(
        f"SELECT DISTINCT job_id FROM {backend.database}.steps "
        "WHERE ts_ms >= {since:UInt64} ORDER BY job_id",
        {"since": _since_ms(since)},
    )
    return [str(r[0]) for r in rows]


# -- records ---------------------------------------------------------------------------


def _step_arrays() -> dict[str, str]:
    """name -> the groupArray of a steps column: one per RankSample field
    (:data:`~schemas.telemetry.FIELDS`), a nullable one as its null mask and its values
    (0 where null); the work each rank said came with migration 014."""
    out: dict[str, str] = {}
    for name, f in FIELDS.items():
        if f.kind == "phase":
            out[name] = f"groupArray(CAST({name} AS Int8))"
        elif f.kind in ("signal", "optional"):
            value = name if f.kind == "signal" else f"toFloat64({name})"
            out[f"{name}_null"] = f"groupArray(isNull({name}))"
            out[name] = f"groupArray(ifNull({value}, 0))"
        else:
            out[name] = f"groupArray({name})"
    return out


#: One row per (run, step): the step's ranks as arrays (a row per rank costs a Python
#: tuple per rank-step on the way out of the backend; an array per step does not).
_ARRAYS = _step_arrays()
_STEP_ARRAYS = ", ".join(_ARRAYS.values())


def _work(nulls: Any, values: Any, order: Any) -> npt.NDArray[np.float64] | None:
    """A work column of a step: None when no rank said it, NaN where one did not."""
    unsaid = np.asarray(nulls, dtype=bool)[order]
    if unsaid.all():
        return None
    out = _floats(values)[order]
    out[unsaid] = np.nan
    return out


def _floats(values: Any) -> npt.NDArray[np.float64]:
    # NaN, inf: null or text in the JSON of some formats; numpy reads all of them
    return np.asarray([math.nan if v is None else v for v in values], dtype=np.float64)


def _frames(backend: ArchiveBackend, job: str, max_rank_steps: int) -> list[StepFrame]:
    db = backend.database
    _, count = backend.query(
        f"SELECT count() FROM {db}.steps FINAL WHERE job_id = {{job:String}}", {"job": job}
    )
    n = int(count[0][0]) if count else 0
    if n > max_rank_steps:
        raise ConfigError(
            f"job {job}: {n} rank-steps archived, over --max-rank-steps={max_rank_steps}; "
            "calibrate on fewer or shorter jobs (--job) or raise the limit"
        )
    _, rows = backend.query(
        f"SELECT run, step, max(ts_ms), {_STEP_ARRAYS} FROM {db}.steps FINAL "
        "WHERE job_id = {job:String} GROUP BY run, step ORDER BY run, step",
        {"job": job},
    )
    frames = []
    for row in rows:
        r = dict(zip(_ARRAYS, row[3:], strict=True))
        rank = np.asarray(r["rank"], dtype=np.int64)
        order = np.argsort(rank, kind="stable")  # groupArray keeps no order of its own

        def col(name: str, dtype: Any, order: Any = order, r: Any = r) -> Any:
            return np.asarray(r[name], dtype=dtype)[order]

        names, node_idx = np.unique(np.asarray(r["node"], dtype=str)[order], return_inverse=True)
        ts = int(row[2]) / 1000.0
        cols: dict[str, Any] = {}
        for name, f in FIELDS.items():
            if f.kind == "int":
                cols[name] = rank[order] if name == "rank" else col(name, np.int32)
            elif f.kind == "phase":
                cols[name] = col(name, np.int8)
            elif f.kind == "time":
                cols[name.removesuffix("_s")] = _floats(r[name])[order]
            elif f.kind == "signal":
                null = col(f"{name}_null", bool)
                cols[name], cols[f"has_{name}"] = _floats(r[name])[order], ~null
                cols[name][null] = np.nan
        said = {w: _work(r[f"{w}_null"], r[w], order) for w in OPTIONAL_FIELDS}
        frames.append(
            StepFrame(
                job_id=job, step=int(row[1]), ts=ts,
                # the archive keeps the end of a step only: its start is its wall time back
                ts_start=ts - float(cols["step_time"].max()),
                nodes=tuple(str(x) for x in names), node_idx=node_idx.astype(np.int32),
                **cols, **optional_columns(said),
            )
        )  # fmt: skip
    frames.sort(key=lambda f: (f.ts, f.step))
    return frames


def _at(ms: Any) -> datetime:
    return datetime.fromtimestamp(int(ms) / 1000.0, UTC)


def _health(
    backend: ArchiveBackend, job: str, frames: Sequence[StepFrame]
) -> tuple[list[NodeHealth], int]:
    """The job's health reports, and those archived without a job from its nodes during
    its time span (node agents that do not know the job)."""
    if not frames:
        return [], 0
    nodes = {n for f in frames for n in f.nodes}
    lo = int(min(f.ts_start for f in frames) * 1000)
    hi = int(max(f.ts for f in frames) * 1000) + 3_600_000
    _, rows = backend.query(
        "SELECT job_id, node, ts_ms, gpu, temperature_c, power_w, sm_clock_mhz, "
        "utilization_pct, ecc_corrected, ecc_uncorrected, xid_codes, throttle_reasons, "
        f"nvlink_errors, nic_errors, nic_retransmits, interval_s FROM {backend.database}.health "
        "FINAL WHERE job_id = {job:String} OR (job_id = '' AND ts_ms >= {lo:UInt64} AND "
        "ts_ms <= {hi:UInt64}) ORDER BY ts_ms, node, gpu",
        {"job": job, "lo": lo, "hi": hi},
    )
    groups: dict[tuple[str, int], list[tuple[Any, ...]]] = defaultdict(list)
    for r in rows:
        if r[0] == job or r[1] in nodes:
            groups[(str(r[1]), int(r[2]))].append(r)
    out, skipped = [], 0
    for (node, ms), rs in groups.items():
        first = rs[0]
        try:
            gpus = tuple(
                GpuHealth(
                    index=r[3], temperature_c=r[4], power_w=r[5], sm_clock_mhz=r[6],
                    utilization_pct=r[7], ecc_corrected=r[8], ecc_uncorrected=r[9],
                    xid_codes=tuple(r[10]), throttle_reasons=tuple(r[11]), nvlink_errors=r[12],
                )
                for r in rs
            )  # fmt: skip
            out.append(
                NodeHealth(
                    job_id=job, node=node, ts=_at(ms), interval_s=first[15], gpus=gpus,
                    nic_errors=first[13], nic_retransmits=first[14],
                )
            )  # fmt: skip
        except ValueError:
            skipped += 1
    return out, skipped


def _commands(backend: ArchiveBackend, job: str) -> tuple[list[Command], list[CommandResult], int]:
    db, p = backend.database, {"job": job}
    _, crows = backend.query(
        "SELECT command_id, kind, targets, replacements, reason, mode, ts_ms "
        # only what the actuator signed: the worker obeys nothing else
        f"FROM {db}.commands FINAL WHERE job_id = {{job:String}} AND signed = 1 "
        "ORDER BY ts_ms, command_id",
        p,
    )
    _, rrows = backend.query(
        # results a result writer's key signed, in the order they counted (at_ms)
        "SELECT command_id, executor, status, ts_ms FROM "
        f"{db}.command_results FINAL WHERE job_id = {{job:String}} AND signed != 0 "
        "ORDER BY at_ms, ts_ms, command_id",
        p,
    )
    cmds, results, skipped = [], [], 0
    for r in crows:
        try:
            cmds.append(
                Command(
                    command_id=r[0], kind=r[1], job_id=job, targets=tuple(r[2]),
                    replacements=tuple(r[3]), reason=tuple(r[4]), mode=r[5], issued_at=_at(r[6]),
                )
            )  # fmt: skip
        except ValueError:
            skipped += 1
    for r in rrows:
        try:
            results.append(
                CommandResult(command_id=r[0], job_id=job, executor=r[1], status=r[2], ts=_at(r[3]))
            )
        except ValueError:
            skipped += 1
    return cmds, results, skipped


def _events(backend: ArchiveBackend, job: str) -> tuple[list[JobEvent], int]:
    _, rows = backend.query(
        "SELECT event_id, kind, step, phase, expected_s, reason, run, ts_ms FROM "
        f"{backend.database}.job_events FINAL WHERE job_id = {{job:String}} "
        "ORDER BY ts_ms, event_id",
        {"job": job},
    )
    out, skipped = [], 0
    for r in rows:
        try:
            out.append(
                JobEvent(
                    event_id=r[0], job_id=job, kind=r[1], step=None if r[2] < 0 else r[2],
                    phase=r[3] or None, expected_s=r[4] or None, reason=r[5] or None,
                    run=r[6], ts=_at(r[7]),
                )
            )  # fmt: skip
        except ValueError:
            skipped += 1
    return out, skipped


# -- labels ----------------------------------------------------------------------------


def _truth(backend: ArchiveBackend, job: str) -> list[Label]:
    _, rows = backend.query(
        "SELECT fault_id, kind, node, onset_step, end_step, magnitude FROM "
        f"{backend.database}.fault_truth FINAL WHERE job_id = {{job:String}} AND is_trap = 0 "
        "ORDER BY onset_step, fault_id",
        {"job": job},
    )
    return [
        Label("truth", str(r[0]), str(r[1]), str(r[2]) or None, int(r[3]),
              None if int(r[4]) < 0 else int(r[4]), True, float(r[5]))
        for r in rows
    ]  # fmt: skip


def _has_truth(backend: ArchiveBackend, job: str) -> bool:
    _, rows = backend.query(
        f"SELECT count() FROM {backend.database}.fault_truth WHERE job_id = {{job:String}}",
        {"job": job},
    )
    return bool(rows and int(rows[0][0]) > 0)


@dataclass(frozen=True, slots=True)
class _Incident:
    incident: str
    kind: str
    node: str | None
    first_step: int
    last_step: int


def _incidents(backend: ArchiveBackend, job: str) -> tuple[dict[str, _Incident], dict[str, str]]:
    """The job's incidents (firing alerts grouped by ``incident``) and fingerprint ->
    incident."""
    _, rows = backend.query(
        "SELECT fingerprint, any(incident), any(kind), any(node), min(step), max(step) FROM "
        f"{backend.database}.alerts FINAL WHERE job_id = {{job:String}} AND incident != '' "
        "AND state = 'firing' GROUP BY fingerprint ORDER BY fingerprint",
        {"job": job},
    )
    incidents: dict[str, _Incident] = {}
    of: dict[str, str] = {}
    for fp, inc, kind, node, first, last in rows:
        of[str(fp)] = str(inc)
        seen = incidents.get(inc)
        lo, hi = max(int(first), 0), max(int(last), 0)
        if seen is not None:
            lo, hi = min(lo, seen.first_step), max(hi, seen.last_step)
        incidents[str(inc)] = _Incident(str(inc), str(kind), str(node) or None, lo, hi)
    return incidents, of


def _human(
    backend: ArchiveBackend, job: str, sources: Sequence[str]
) -> tuple[list[Label], dict[str, int]]:
    """Labels of the job's incidents from labels, approvals and outcomes (one per
    incident: the strongest source speaks)."""
    incidents, incident_of = _incidents(backend, job)
    if not incidents:
        return [], {}
    verdict: dict[str, tuple[int, bool, str]] = {}  # incident -> (rank, truth, source)

    def say(incident: str | None, truth: bool, source: str) -> None:
        if incident is None or incident not in incidents:
            return
        rank = LABEL_SOURCES.index(source)
        old = verdict.get(incident)
        # a stronger source wins; within one source a rejection outweighs an approval
        if old is None or rank < old[0] or (rank == old[0] and not truth):
            verdict[incident] = (rank, truth, source)

    db, p = backend.database, {"job": job}
    if "label" in sources:
        for lab in incident_labels(backend, [job]):
            say(lab.incident, lab.verdict, "label")
    if "approval" in sources:
        _, rows = backend.query(
            # only what the actuator and the operators signed (migration 010): a forged
            # rejection would otherwise teach calibration that a real fault was benign
            f"SELECT a.reason, p.decision FROM (SELECT action_id, any(reason) AS reason FROM "
            f"{db}.actions FINAL WHERE job_id = {{job:String}} AND signed != 0 "
            f"GROUP BY action_id) AS a ANY "
            f"INNER JOIN (SELECT command_id AS action_id, argMax(decision, ts_ms) AS decision "
            f"FROM {db}.approvals FINAL WHERE signed != 0 AND command_id IN (SELECT action_id "
            f"FROM {db}.actions WHERE job_id = {{job:String}}) GROUP BY command_id) AS p "
            "USING (action_id) ORDER BY a.action_id",
            p,
        )
        for reason, decision in rows:
            for fp in reason:
                say(incident_of.get(fp), decision == "approve", "approval")
    if "outcome" in sources:
        _, rows = backend.query(
            f"SELECT reason FROM {db}.commands FINAL WHERE job_id = {{job:String}} AND "
            # the command's last signed result (by at_ms, never by the writer's own
            # ts: one dated ten years ahead must not win) says it succeeded
            f"signed = 1 AND command_id IN (SELECT command_id FROM (SELECT command_id, "
            "argMax(status, at_ms) AS last_status "
            f"FROM {db}.command_results FINAL WHERE job_id = {{job:String}} AND signed != 0 "
            "AND status != 'accepted' GROUP BY command_id) WHERE last_status = 'succeeded') "
            "ORDER BY command_id",
            p,
        )
        for (reason,) in rows:
            for fp in reason:
                say(incident_of.get(fp), True, "outcome")
    labels, counts = [], defaultdict(int)
    for inc, (_, truth, source) in sorted(verdict.items()):
        i = incidents[inc]
        labels.append(Label(source, inc, i.kind, i.node, i.first_step, i.last_step, truth))
        counts[source] += 1
    return labels, dict(counts)


def load_job(
    backend: ArchiveBackend,
    job: str,
    *,
    sources: Sequence[str] = LABEL_SOURCES,
    max_rank_steps: int = 10_000_000,
) -> ArchivedJob:
    """Everything calibration needs of ``job``."""
    unknown = set(sources) - set(LABEL_SOURCES)
    if unknown:
        raise ConfigError(f"--labels: unknown source(s) {sorted(unknown)}; known {LABEL_SOURCES}")
    frames = _frames(backend, job, max_rank_steps)
    health, skipped_h = _health(backend, job, frames)
    commands, results, skipped_c = _commands(backend, job)
    events, skipped_e = _events(backend, job)
    labels: list[Label] = []
    counts: dict[str, int] = {}
    full = "truth" in sources and _has_truth(backend, job)
    if "truth" in sources:
        labels += _truth(backend, job)
        counts["truth"] = len(labels)
    human, human_counts = _human(backend, job, sources)
    labels += human
    counts.update(human_counts)
    return ArchivedJob(
        job_id=job, frames=frames, health=health, commands=commands, results=results,
        events=events, labels=labels, fully_labelled=full,
        skipped=skipped_h + skipped_c + skipped_e, label_counts=counts,
    )  # fmt: skip


def archived_jobs(
    backend: ArchiveBackend,
    jobs: Sequence[str] | None = None,
    since: datetime | None = None,
    *,
    sources: Sequence[str] = LABEL_SOURCES,
    max_rank_steps: int = 10_000_000,
    progress: Callable[[str], None] | None = None,
) -> list[ArchivedJob]:
    """The named ``jobs``, or every job with steps since ``since``; jobs without steps
    are left out."""
    names = list(jobs) if jobs else job_ids(backend, since)
    out = []
    budget = max_rank_steps
    for name in names:
        if progress is not None:
            progress(name)
        job = load_job(backend, name, sources=sources, max_rank_steps=budget)
        budget -= job.rank_steps
        if job.frames:
            out.append(job)
    return out
