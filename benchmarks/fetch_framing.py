"""Decode + frame per rank-step, record by record against a fetch at once (issue 40 item 3).

In one process, on the pipeline benchmark's message templates (node messages of 8
ranks, v1 and v3; rack messages of 8 nodes x 8 ranks, v2 and v3): the per-record path
(``decode_step`` each record, ``StepFrame.from_messages`` of each step) beside the
worker's fetch path (``decode_fetch`` of each step's records, then the frame), best of
``--repeat``. Prints JSON (keys ``<kind>_per_record`` / ``<kind>_per_fetch``, µs a
rank-step) and the ratios the issue asks for.

    nice -n 10 python benchmarks/fetch_framing.py
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline_throughput import NodeMessages

from detectors.frame import StepFrame
from pipeline.io.fastdecode import decode_step
from pipeline.io.fetchcolumns import decode_fetch


def per_record(steps: list[list[bytes]]) -> None:
    for values in steps:
        StepFrame.from_messages([decode_step(v) for v in values])  # type: ignore[misc]


def per_fetch(steps: list[list[bytes]]) -> None:
    for values in steps:
        decoded = decode_fetch(values)
        if any(d is None for d in decoded):
            raise RuntimeError("the fast path left benchmark records to pydantic")
        StepFrame.from_messages(decoded)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    out: dict[str, float] = {}
    kinds = (("node_v1", 128, 1, False, 30), ("node_v3", 128, 1, True, 30),
             ("rack_v2", 2048, 8, False, 4), ("rack_v3", 2048, 8, True, 4))  # fmt: skip
    for name, nodes, rack, columnar, n_steps in kinds:
        messages = NodeMessages("bench-job", nodes, rack, columnar)
        t0 = time.time() - n_steps
        steps = [messages.render(s, t0 + s) for s in range(n_steps)]
        for path, fn in (("per_record", per_record), ("per_fetch", per_fetch)):
            best = math.inf
            for _ in range(args.repeat):
                start = time.perf_counter()
                fn(steps)
                best = min(best, time.perf_counter() - start)
            out[f"{name}_{path}"] = best / (n_steps * nodes * 8) * 1e6
            print(f"{name} {path}: {out[f'{name}_{path}']:.3f} us a rank-step", flush=True)
    out["columnar_fetch_ratio_rack_v3_to_node_v1"] = (
        out["rack_v3_per_fetch"] / out["node_v1_per_record"]
    )
    out["columnar_fetch_ratio_node_v3_to_node_v1"] = (
        out["node_v3_per_fetch"] / out["node_v1_per_record"]
    )
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
