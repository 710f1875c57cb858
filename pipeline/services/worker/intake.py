"""The steps topic's records into their jobs. :class:`StepIntake` owns a step record's
way from bytes to detection: decoded (the msgspec fast path, :mod:`pipeline.io.fastdecode`,
for common telemetry; pydantic for the rest, which writes the dead letter's error),
proven (a record speaks only for the nodes its headers prove), taken by its job
(:class:`~pipeline.services.worker.admission.Admission`), its event time moving the
job's clock (bounded by what the job's frames support, and, while a job taken over
catches up, counted as arrived when its event time says), and handed to the job's
detection; then held until a snapshot covers it
(:class:`~pipeline.services.worker.snapshots.Snapshots`). A fetch's records of one
partition go through together (:meth:`StepIntake.handle_batch`): decoded together (a
job step's columnar messages as one block of arrays, :mod:`pipeline.io.fetchcolumns`),
one outcome per job, whose snapshot is considered once, after its last record.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

from detectors.frame import NodeStep
from pipeline.io.errors import CapacityError
from pipeline.io.fastdecode import decode_step
from pipeline.io.fetchcolumns import decode_fetch
from pipeline.io.telemetry_auth import message_nodes
from pipeline.services.worker.admission import Admission
from pipeline.services.worker.book import JobBook
from pipeline.services.worker.options import WorkerConfig
from pipeline.services.worker.records import Handled, JobState, Load, Record
from pipeline.services.worker.snapshots import Snapshots
from pipeline.services.worker.takeover import Takeover
from schemas import StepTelemetry

__all__ = ["StepIntake"]

log = logging.getLogger(__name__)


class StepIntake:
    """Step records, one or a fetch at a time, into their jobs (module docstring)."""

    def __init__(
        self,
        config: WorkerConfig,
        book: JobBook,
        admission: Admission,
        takeover: Takeover,
        snapshots: Snapshots,
    ) -> None:
        self.max_message_bytes = config.capacity.max_message_bytes
        self.telemetry = config.trust.telemetry
        self.clock = config.clock
        self.book = book
        self.admission = admission
        self.takeover = takeover
        self.snapshots = snapshots
        self._bounds: dict[str, tuple[object, int, float]] = {}

    def handle(self, rec: Record, load: Load) -> Handled:
        """One StepTelemetry record."""
        self.takeover.saw_record()
        taken = self._step(rec, load, None)
        if isinstance(taken, Handled):
            return taken
        st, out = taken
        return self.snapshots.finish(st, out, rec.token)

    def handle_batch(self, records: Iterable[Record], load: Load) -> list[Handled]:
        """A fetch's records of one steps partition in offset order, each as
        :meth:`handle` handles it; but a job's records share one :class:`Handled`, and
        whether its snapshot is due is asked once, after the last of them (the snapshot
        then covers them all). The records share one token (the batch's ticket),
        released once per record."""
        self.takeover.saw_record()
        done: list[Handled] = []
        outs: dict[str, Handled] = {}
        taken: dict[str, tuple[JobState, int]] = {}
        token = None
        self._bounds.clear()  # the fetch's memo of each job's clock bound
        batch = list(records)
        decoded = decode_fetch([rec.value for rec in batch], self.max_message_bytes)
        for rec, msg in zip(batch, decoded, strict=True):
            token = rec.token
            try:
                got = self._step(rec, load, outs, msg)
            except Exception:  # never let one record stop the batch
                log.exception("worker failed on %s", rec.where)
                done.append(Handled(release=[rec.token]))
                continue
            if isinstance(got, Handled):
                done.append(got)
                continue
            st = got[0]
            n = taken[st.job_id][1] if st.job_id in taken else 0
            taken[st.job_id] = (st, n + 1)
        self._bounds.clear()
        for job_id, (st, n) in taken.items():
            done.append(self.snapshots.finish(st, outs[job_id], token, n))
        return done

    def _step(
        self, rec: Record, load: Load, outs: dict[str, Handled] | None,
        msg: NodeStep | Handled | None = None,
    ) -> tuple[JobState, Handled] | Handled:  # fmt: skip
        """Decode (unless the batch did: ``msg``), take and detect one step record: its
        job's state and the Handled it added to (the job's in ``outs``, when a batch
        shares one), or the Handled of a record that goes no further (released, or
        dead-lettered)."""
        value = rec.value
        if outs is None and (value is None or len(value) <= self.max_message_bytes):
            msg = decode_step(value)
        if msg is None:
            msg = self.admission.decoded(StepTelemetry, rec)
        if isinstance(msg, Handled):
            return msg
        if self.telemetry is not None:  # a record speaks only for the nodes it proves
            problem = self.telemetry.nodes_problem(rec.headers, value, message_nodes(msg))
            if problem is not None:
                letter = self.admission.unproven(msg.node, problem, rec)
                return Handled(dead_letters=[letter], release=[rec.token])
        ts = msg.ts_end.timestamp()
        st = self.admission.take(rec, msg.job_id, ts, load)
        if isinstance(st, Handled):
            return st
        out = outs.get(msg.job_id) if outs is not None else None
        if out is None:
            out = Handled(job_id=msg.job_id)
            if outs is not None:
                outs[msg.job_id] = out
        self._move_clock(st, ts, self._bounds if outs is not None else None)
        st.dirty = True
        steps = out.steps
        try:
            out.add(st.detection.on_step(msg))
        except CapacityError as exc:
            self.book.counts.refused += 1
            log.warning("%s refused: %s", rec.where, exc)
            out.dead_letters.append(rec.letter(str(exc), "limit"))
        except Exception as exc:  # a detector bug must not stop the job's other steps
            log.exception("detector failed on %s", rec.where)
            out.dead_letters.append(rec.letter(f"detect: {exc!r}", "detect"))
        st.steps_since_snapshot += out.steps - steps
        return st, out

    def _move_clock(
        self, st: JobState, ts: float, bounds: dict[str, tuple[object, int, float]] | None = None
    ) -> None:
        """A step of event time ``ts`` arrived now: the job's newest event time and the
        wall time it arrived. ``bounds``: a fetch's memo of how far each job's frames
        let its clock go (``clock_at(inf)``), taken again whenever the job's detection
        processed a frame, the only thing in a step record's way that moves it (it cost
        a median of the job's step times per record)."""
        wall = self.clock()
        st.active_wall = wall
        if st.last_event_ts is None or ts >= st.last_event_ts:
            if st.last_event_ts is not None and wall < st.resume_wall:
                # catching up after a takeover (:meth:`Takeover.resume`): a replayed
                # step arrived as long after the one before it as its event time says
                wall = min(wall, st.arrived_wall + (ts - st.last_event_ts))
            # bounded by what the job's frames support (issue 39): one record dated
            # ahead must not move the tick clock
            det = st.detection
            if bounds is None:
                at = det.clock_at(ts)
            else:
                got = bounds.get(st.job_id)
                if got is None or got[0] is not det or got[1] != det.frames:
                    got = bounds[st.job_id] = (det, det.frames, det.clock_at(math.inf))
                at = min(ts, got[2])
            st.last_event_ts = max(st.last_event_ts or ts, at)
            st.arrived_wall = wall
