"""The PyTorch integration's overhead on a real DDP job (issue 25 item 7).

Runs ``tests/integration/torch_job.py`` under torchrun (gloo, CPU, 4 ranks as 2
emulated nodes, one thread per rank) alternately without (``--plain``) and with the
integration (``watch``: comm hook, data-loader wrapper, thread-CPU clock, node
aggregator publishing to an embedded broker, rank 0's command listener and the
per-step command exchange), ``--pairs`` times, the same steps each run. Reports
steps/s of each run (the training loop only, not torch's start), the with/without
ratio per pair, and from inside the job ``record_step``'s cost per call and the
guard's own time at step boundaries. ``--write`` puts the table in BENCHMARKS.md.

    python benchmarks/torch_overhead.py --pairs 3 --steps 60 --write
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import command_line, environment, write_section
from pipeline.io.embedded import TansuBroker
from pipeline.io.settings import load_settings
from pipeline.tools.up import UpOptions, build_plan

JOB = Path(__file__).resolve().parents[1] / "tests" / "integration" / "torch_job.py"


def run_once(
    env: dict[str, str], tmp: Path, steps: int, plain: bool, tag: str, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    out = tmp / f"out-{tag}"
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc-per-node", "4", str(JOB), "--steps", str(steps), "--ckpt-every", str(steps + 1),
        "--ckpt-dir", str(tmp / f"ck-{tag}"), "--out", str(out),
    ]  # fmt: skip
    if plain:
        argv.append("--plain")
    argv += extra
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"torchrun failed ({done.returncode}):\n{done.stderr[-3000:]}")
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    wall = max(r["wall_s"] for r in ranks)
    doc: dict[str, Any] = {"steps_per_s": steps / wall, "step_s": wall / steps}
    doc["cpu_process_s"] = sum(r["cpu_process_s"] for r in ranks) / steps
    doc["cpu_main_s"] = sum(r["cpu_main_s"] for r in ranks) / steps
    if not plain:
        recorded = sum(r["recorded"] for r in ranks)
        doc["record_us"] = 1e6 * sum(r["record_s"] for r in ranks) / recorded
        doc["record_max_us"] = 1e6 * max(r["record_max_s"] for r in ranks)
        doc["boundary_us"] = 1e6 * sum(r["overhead_s"] for r in ranks) / recorded
    return doc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--write", action="store_true", help="write the table to BENCHMARKS.md")
    args = p.parse_args()
    import torch

    with tempfile.TemporaryDirectory(prefix="stepguard-torch-bench-") as d:
        tmp = Path(d)
        with TansuBroker(log_dir=tmp / "tansu") as broker:
            settings = load_settings(
                {}, kafka_bootstrap=broker.bootstrap, broker_flavor="tansu", state_dir=tmp
            )
            # the environment `stepguard up --job` gives a job: broker, job id, keys
            job = f"bench-{uuid.uuid4().hex[:6]}"  # its controller key is bound to it
            plan = build_plan(settings, UpOptions(job=job, nodes="node-a,node-b"), {})
            env = {k: v for k, v in os.environ.items() if not k.startswith("STEPGUARD_")}
            env |= plan.shell_env | plan.job_env
            env |= {"STEPGUARD_RANKS_PER_NODE": "2", "OMP_NUM_THREADS": "1",
                    "PYTHONPATH": str(Path(__file__).resolve().parents[1])}  # fmt: skip
            rows = []
            for i in range(args.pairs):
                order = (True, False) if i % 2 == 0 else (False, True)  # alternate
                pair = {plain: run_once(env, tmp, args.steps, plain, f"{i}{int(plain)}")
                        for plain in order}  # fmt: skip
                rows.append((pair[True], pair[False]))
                ratio = pair[False]["steps_per_s"] / pair[True]["steps_per_s"]
                print(f"pair {i}: plain {pair[True]['steps_per_s']:.3f} steps/s, with "
                      f"{pair[False]['steps_per_s']:.3f} ({ratio:.3f}), record_step "
                      f"{pair[False]['record_us']:.0f} us", flush=True)  # fmt: skip

    ratios = [w["steps_per_s"] / b["steps_per_s"] for b, w in rows]
    lines = [
        "## PyTorch integration overhead (`benchmarks/torch_overhead.py`)",
        "",
        "A real DDP job (`tests/integration/torch_job.py`: gloo, CPU, torchrun with 4 ranks "
        "as 2 emulated nodes, one thread each, an MLP) run alternately without and with "
        "`watch()` (comm hook, loader wrapper, thread-CPU clock, in-process node aggregators "
        "publishing to an embedded broker, rank 0's command listener, the per-step command "
        "exchange); steps/s of the training loop, the same steps each run.",
        "",
        "| pair | step (s) without | steps/s without | steps/s with | ratio | record_step "
        "mean (µs) | record_step max (µs) | guard at boundary (µs/step) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, (b, w) in enumerate(rows):
        lines.append(
            f"| {i} | {b['step_s']:.3f} | {b['steps_per_s']:.3f} | {w['steps_per_s']:.3f} | "
            f"{w['steps_per_s'] / b['steps_per_s']:.3f} | {w['record_us']:.0f} | "
            f"{w['record_max_us']:.0f} | {w['boundary_us']:.0f} |"
        )
    env_doc = environment(command_line(), ("torch", "kafka-python"))
    lines += [
        "",
        f"Median ratio (with / without) {statistics.median(ratios):.3f} over {len(rows)} "
        f"pairs of {args.steps} steps.",
        "",
        f"{env_doc['date']}; {env_doc['machine']}; python {env_doc['versions']['python']}, "
        f"torch {torch.__version__}, kafka-python {env_doc['versions']['kafka-python']}; "
        f"`{env_doc['command']}`.",
    ]
    text = "\n".join(lines)
    print(text)
    if args.write:
        write_section("torch-overhead", text)


if __name__ == "__main__":
    main()
