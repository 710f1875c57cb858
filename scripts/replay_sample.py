"""Write the sample of ``stepguard replay`` (docs/samples/replay-straggler.jsonl): the
project's simulator plays docs/samples/replay-straggler.yaml, and every node's step is
written as the StepTelemetry its exporter would have sent, timings rounded to 0.1 ms
(an exporter's precision) and only tokens said of the work, to keep the file small.

    python scripts/replay_sample.py [OUT]
"""

from __future__ import annotations

import sys
from pathlib import Path

from pipeline.tools.simulator import Scenario, simulate

HERE = Path(__file__).resolve().parent.parent / "docs" / "samples"
_TIMINGS = ("step_time_s", "compute_s", "comm_wait_s", "data_wait_s", "loss", "grad_norm")


def main(out: Path) -> int:
    sc = Scenario.from_yaml(HERE / "replay-straggler.yaml")
    lines = []
    for ev in simulate(sc):
        if ev.frame is None:
            continue
        for msg in ev.frame.to_messages():
            samples = tuple(
                s.model_copy(
                    update={
                        "flops": None,  # tokens say the work here: flops would grow the file
                        **{
                            k: round(getattr(s, k), 4)
                            for k in _TIMINGS
                            if getattr(s, k) is not None
                        },
                    }
                )
                for s in msg.samples
            )
            lines.append(
                msg.model_copy(update={"samples": samples}).model_dump_json(exclude_defaults=True)
            )
    out.write_text("\n".join(lines) + "\n")
    print(f"{out}: {len(lines)} step messages, {out.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "replay-straggler.jsonl"))
