"""The cost of the archive's value check on the insert path (issue 39, finding 4).

Both backends check every insert against the table's column types before sending it
(:func:`pipeline.services.archive.refusals.refused_value`): chDB's Arrow path would
store a DateTime past 2106 as 2106 and cut a FixedString without a word. This times
the check alone on the steps table's columns of an archiver batch (numpy arrays,
checked whole by min and max), without a broker or ClickHouse, so that the figure
does not drown in a busy host's noise the way an end-to-end run does.

    python benchmarks/archive_value_check.py [--messages 5000] [--repeat 30]
"""

from __future__ import annotations

import argparse
import statistics
import time
from datetime import UTC, datetime, timedelta

import numpy as np

from pipeline.services.archive.refusals import refused_value
from pipeline.services.archive.rows import ingest_version, step_rows
from schemas import Phase, RankSample, StepTelemetry, encode

#: the steps table's column types after migration 013 (``received`` is the server's)
STEPS_TYPES = {
    "job_id": "String", "run": "String", "step": "UInt64", "node": "String",
    "rank": "UInt32", "local_rank": "UInt16", "dp_group": "UInt32", "pp_stage": "UInt32",
    "tp_group": "UInt32",
    "phase": "Enum8('warmup' = 0, 'train' = 1, 'eval' = 2, 'checkpoint' = 3)",
    "step_time_s": "Float64", "compute_s": "Float64", "comm_wait_s": "Float64",
    "data_wait_s": "Float64", "loss": "Nullable(Float64)", "grad_norm": "Nullable(Float64)",
    "ts": "DateTime('UTC')", "ts_ms": "UInt64", "ver": "UInt64",
}  # fmt: skip


def _message(node: int, step: int, now: datetime) -> StepTelemetry:
    """One node's step of 8 ranks, dated from now."""
    at = now - timedelta(minutes=10) + timedelta(seconds=step)
    return StepTelemetry(
        job_id="job-bench", node=f"n{node}", step=step, ts_start=at,
        ts_end=at + timedelta(milliseconds=450),
        samples=tuple(
            RankSample(rank=r, local_rank=r % 8, dp_group=0, pp_stage=0, tp_group=r // 8,
                       phase=Phase.TRAIN, step_time_s=0.45, compute_s=0.38, comm_wait_s=0.05,
                       data_wait_s=0.02, loss=2.5, grad_norm=1.1)
            for r in range(8 * node, 8 * node + 8)
        ),
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=5000, help="StepTelemetry of 8 ranks")
    parser.add_argument("--repeat", type=int, default=30)
    args = parser.parse_args()
    now = datetime.now(UTC)
    values = [encode(_message(i % 512, i // 512, now)) for i in range(args.messages)]
    decoded = step_rows(values)
    rows = len(decoded.row_value)
    columns = {**decoded.columns, "ver": ingest_version(np.arange(rows, dtype=np.int64))}
    assert refused_value("steps", columns, STEPS_TYPES) is None
    runs = []
    for _ in range(args.repeat):
        began = time.perf_counter()
        refused_value("steps", columns, STEPS_TYPES)
        runs.append(time.perf_counter() - began)
    median = statistics.median(runs)
    print(
        f"refused_value on a steps insert of {rows} rows ({len(columns)} columns): "
        f"median {median * 1e3:.3f} ms, {median / rows * 1e9:.1f} ns a row "
        f"(min {min(runs) / rows * 1e9:.1f}, max {max(runs) / rows * 1e9:.1f}; {args.repeat} runs)"
    )


if __name__ == "__main__":
    main()
