"""CPU microseconds per rank-step of the worker's decode (``decode_step``), the step
frames (``StepFrame.from_messages``) and the batch decoder (``decode_steps``), per
message shape (node/rack, rows/columns), on the messages of ``pipeline_throughput.py``.

CPU time (``time.process_time``), best of 7 (the batch decoder: of 3), so that a shared
machine's load moves it less than wall time; run it in two trees in turn
(``cd TREE && PYTHONPATH=$PWD python benchmarks/decode_frame_cpu.py``) and compare the
ratios. Prints one JSON line.
"""

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import pipeline_throughput as pt

from detectors.frame import StepFrame
from pipeline.io.fastdecode import decode_step, decode_steps


def best(f, n, k=7):
    b = 1e9
    for _ in range(k):
        t = time.process_time()
        f()
        b = min(b, time.process_time() - t)
    return round(b / n * 1e6, 3)


def main() -> None:
    out = {}
    shapes = (("node_v1", 128, 1, False), ("node_v3", 128, 1, True),
              ("rack_v2", 512, 8, False), ("rack_v3", 512, 8, True))  # fmt: skip
    for name, nodes, rack, col in shapes:
        m = pt.NodeMessages("b", nodes, rack, col)
        per = len(m.senders)
        values = [v for s in range(4) for v in m.render(s, time.time() - 4 + s)]
        n = 4 * nodes * 8
        out[f"decode_{name}"] = best(lambda vs=values: [decode_step(v) for v in vs], n)
        d = [decode_step(v) for v in values]
        if any(x is None for x in d):
            raise RuntimeError("the fast decoder left benchmark records to pydantic")
        out[f"frame_{name}"] = best(
            lambda d=d, k=per: [StepFrame.from_messages(d[i : i + k]) for i in range(0, len(d), k)],
            n,
        )
        out[f"batch_{name}"] = best(lambda vs=values: decode_steps(vs), n, 3)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
