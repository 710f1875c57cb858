"""What a worker keeps of a job through a takeover and the job's end (BENCHMARKS.md,
"Chaos soak", worker RSS): Python's traced memory (tracemalloc) of ``WorkerDetection`` alone,
no Faust or broker (their buffers are bounded by their settings).

``--jobs`` jobs of ``--nodes`` nodes x 8 ranks are played on core A for 30 steps, taken
over by core B from their snapshots (as after A's SIGKILL), played 30 more steps there
and ended. Prints the traced MB before the jobs, with them on A, after the takeover, on
B, and after every job ended::

    .venv/bin/python benchmarks/worker_state_memory.py --jobs 12 --nodes 32
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.services.worker.state import CoreTopics, WorkerDetection
from schemas import (
    EndReason,
    JobEvent,
    JobEventKind,
    RankSample,
    StepTelemetry,
    encode,
)

STEP_S = 1.3
#: Step 0's event time: the jobs' ~80 s of records (62 steps, then the end) lie an hour
#: and more before now, never ahead of the wall clock.
T0 = datetime.now(UTC).replace(microsecond=0) - timedelta(hours=1, seconds=STEP_S * 62)


def step_record(job: str, step: int, node: int) -> bytes:
    ts = T0 + timedelta(seconds=STEP_S * step)
    samples = tuple(
        RankSample(rank=node * 8 + g, local_rank=g, step_time_s=STEP_S,
                   compute_s=1.0 + 0.001 * ((node * 8 + g + step) % 5), comm_wait_s=0.25,
                   data_wait_s=0.01)
        for g in range(8)
    )  # fmt: skip
    end = ts + timedelta(seconds=STEP_S)
    msg = StepTelemetry(job_id=job, node=f"n{node}", step=step, ts_start=ts, ts_end=end,
                        samples=samples)  # fmt: skip
    return encode(msg)


def traced_mb() -> float:
    gc.collect()
    return round(tracemalloc.get_traced_memory()[0] / 2**20, 2)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=12)
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--json", type=Path, help="write the numbers here too")
    args = ap.parse_args()
    jobs = [f"job{j}" for j in range(args.jobs)]
    topics = CoreTopics("steps", "health", "jobs", lifecycle="lifecycle")
    wall = [1000.0]
    table: dict[str, bytes] = {}
    offset = 0

    def play(core: WorkerDetection, steps: range) -> None:
        nonlocal offset
        for step in steps:
            wall[0] = 1000.0 + STEP_S * (step + 1)
            for job in jobs:
                for node in range(args.nodes):
                    out = core.handle_step(0, offset, job.encode(), step_record(job, step, node),
                                           offset, table.get)  # fmt: skip
                    offset += 1
                    if out.snapshot is not None:
                        table[job] = out.snapshot

    tracemalloc.start(1)
    before = traced_mb()
    a = WorkerDetection(topics, 1, clock=lambda: wall[0])
    play(a, range(30))
    on_a = traced_mb()
    del a  # SIGKILLed: only the table (the changelog) survives
    b = WorkerDetection(topics, 1, clock=lambda: wall[0])
    adopted = sum(b.adopt(job, table[job], {0}) for job in jobs)
    after_takeover = traced_mb()
    play(b, range(30, 60))
    on_b = traced_mb()
    for i, job in enumerate(jobs):
        end = JobEvent(job_id=job, kind=JobEventKind.END, reason=EndReason.COMPLETED,
                       ts=T0 + timedelta(seconds=STEP_S * 61))  # fmt: skip
        b.handle_job_record(0, i, job.encode(), encode(end), "lifecycle", None, table.get)
    for second in range(62):  # an end takes effect once no step contradicted it for 60 s
        wall[0] += 1.0
        for i, job in enumerate(jobs):
            rec = b.tick_record(job)
            if rec is None:
                continue
            out = b.handle_job_record(0, 1000 + second * len(jobs) + i, job.encode(), rec[1],
                                      "tick", None, table.get)  # fmt: skip
            if out.tombstone:
                table.pop(job, None)
    r = {
        "jobs": args.jobs, "ranks_per_job": args.nodes * 8, "adopted": adopted,
        "jobs_left": len(b.jobs), "traced_mb_before": before, "with_jobs_on_a": on_a,
        "after_takeover_on_b": after_takeover, "on_b_30_steps_later": on_b,
        "after_all_ended": traced_mb(),
    }  # fmt: skip
    print(json.dumps(r, indent=2))
    if args.json:
        args.json.write_text(json.dumps(r, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
