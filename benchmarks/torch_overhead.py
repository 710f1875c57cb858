"""The PyTorch integration's overhead on a real DDP job (issue 25 item 7).

Runs ``tests/integration/torch_job.py`` under torchrun (gloo, CPU, 4 ranks as 2
emulated nodes, one thread per rank) alternately without (``--plain``) and with the
integration (``watch``: comm hook, data-loader wrapper, thread-CPU clock, node
aggregator publishing to an embedded broker, rank 0's command listener and the
per-step command exchange), ``--pairs`` times, the same steps each run. Reports
steady-state steps/s of each run (the training loop after its first ``--warmup``
steps, whose one-off costs are given apart: connecting, the first send, the listener
joining its group), the with/without ratio per pair, CPU per step of all threads and
of the training threads, and from inside the job ``record_step``'s cost per call and
the guard's own time at step boundaries. ``--write`` puts the table in BENCHMARKS.md.

    python benchmarks/torch_overhead.py --pairs 5 --write
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
from pipeline.io.kafka import create_topics
from pipeline.io.settings import load_settings
from pipeline.tools.up import UpOptions, build_plan

JOB = Path(__file__).resolve().parents[1] / "tests" / "integration" / "torch_job.py"


def run_once(
    env: dict[str, str],
    tmp: Path,
    steps: int,
    plain: bool,
    tag: str,
    extra: tuple[str, ...] = (),
    *,
    batch: int = 512,
    warmup: int = 0,
) -> dict[str, Any]:
    """One torchrun of the job: ``steps`` steps of which the first ``warmup`` are timed
    apart (their one-off costs: connections, the first send, the listener's join)."""
    out = tmp / f"out-{tag}"
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
        "--nproc-per-node", "4", str(JOB), "--steps", str(steps), "--ckpt-every", str(steps + 1),
        "--ckpt-dir", str(tmp / f"ck-{tag}"), "--out", str(out), "--batch", str(batch),
        "--warmup", str(warmup),
    ]  # fmt: skip
    if plain:
        argv.append("--plain")
    argv += extra
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"torchrun failed ({done.returncode}):\n{done.stderr[-3000:]}")
    ranks = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    wall = max(r["wall_s"] for r in ranks)
    timed = ranks[0]["timed_steps"]
    if timed <= 0 or any(r["timed_steps"] != timed for r in ranks):
        raise SystemExit(f"ranks timed {[r['timed_steps'] for r in ranks]} steps, not {timed}")
    doc: dict[str, Any] = {"steps_per_s": timed / wall, "step_s": wall / timed}
    doc["warmup_s"] = max(r["warmup_s"] for r in ranks)
    doc["cpu_process_s"] = sum(r["cpu_process_s"] for r in ranks) / timed
    doc["cpu_main_s"] = sum(r["cpu_main_s"] for r in ranks) / timed
    if not plain:
        recorded = sum(r["recorded"] for r in ranks)
        doc["record_us"] = 1e6 * sum(r["record_s"] for r in ranks) / recorded
        doc["record_max_us"] = 1e6 * max(r["record_max_s"] for r in ranks)
        doc["boundary_us"] = 1e6 * sum(r["overhead_s"] for r in ranks) / recorded
    return doc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=110, help="steps per run, warm-up included")
    p.add_argument("--warmup", type=int, default=10, help="first steps timed apart")
    p.add_argument(
        "--batch",
        type=int,
        default=2880,
        help="samples per rank and step (2880: about 0.25 s steps on 2 idle cores)",
    )
    p.add_argument("--write", action="store_true", help="write the table to BENCHMARKS.md")
    args = p.parse_args()
    import torch

    with tempfile.TemporaryDirectory(prefix="stepguard-torch-bench-") as d:
        tmp = Path(d)
        with TansuBroker(log_dir=tmp / "tansu") as broker:
            settings = load_settings(
                {}, kafka_bootstrap=broker.bootstrap, broker_flavor="tansu", state_dir=tmp
            )
            # the topics the services create under `stepguard up` (the first run on a
            # fresh broker without them cost the ranks ~100 ms of CPU a step, measured)
            create_topics(settings)
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
                pair = {plain: run_once(env, tmp, args.steps, plain, f"{i}{int(plain)}",
                                        batch=args.batch, warmup=args.warmup)
                        for plain in order}  # fmt: skip
                rows.append((pair[True], pair[False]))
                ratio = pair[False]["steps_per_s"] / pair[True]["steps_per_s"]
                print(f"pair {i}: plain {pair[True]['steps_per_s']:.3f} steps/s, with "
                      f"{pair[False]['steps_per_s']:.3f} ({ratio:.3f}), record_step "
                      f"{pair[False]['record_us']:.0f} us, CPU/step "
                      f"{1e3 * pair[True]['cpu_process_s']:.0f} -> "
                      f"{1e3 * pair[False]['cpu_process_s']:.0f} ms", flush=True)  # fmt: skip

    ratios = [w["steps_per_s"] / b["steps_per_s"] for b, w in rows]
    lines = [
        "## PyTorch integration overhead (`benchmarks/torch_overhead.py`)",
        "",
        "A real DDP job (`tests/integration/torch_job.py`: gloo, CPU, torchrun with 4 ranks "
        "as 2 emulated nodes, one thread each, an MLP) run alternately without and with "
        "`watch()` (comm hook, loader wrapper, thread-CPU clock, in-process node aggregators "
        "publishing to an embedded broker, rank 0's command listener, the per-step command "
        f"exchange); steady-state steps/s of the training loop after its first {args.warmup} "
        f"steps (their wall time is the *first steps* column: the one-off costs), the same "
        f"steps each run. *CPU/step*: all threads of the 4 ranks (the ranks' training "
        f"threads alone in brackets), ms per step.",
        "",
        "| pair | step (s) without | steps/s without | steps/s with | ratio | first steps "
        "(s) without / with | CPU/step without (ms) | CPU/step with (ms) | record_step "
        "mean (µs) | record_step max (µs) | guard at boundary (µs/step) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, (b, w) in enumerate(rows):
        lines.append(
            f"| {i} | {b['step_s']:.3f} | {b['steps_per_s']:.3f} | {w['steps_per_s']:.3f} | "
            f"{w['steps_per_s'] / b['steps_per_s']:.3f} | {b['warmup_s']:.2f} / "
            f"{w['warmup_s']:.2f} | {1e3 * b['cpu_process_s']:.0f} "
            f"({1e3 * b['cpu_main_s']:.0f}) | {1e3 * w['cpu_process_s']:.0f} "
            f"({1e3 * w['cpu_main_s']:.0f}) | {w['record_us']:.0f} | "
            f"{w['record_max_us']:.0f} | {w['boundary_us']:.0f} |"
        )
    env_doc = environment(command_line(), ("torch", "kafka-python"))
    lines += [
        "",
        f"Median ratio (with / without) {statistics.median(ratios):.3f} over {len(rows)} "
        f"pairs of {args.steps} steps ({args.warmup} of warm-up), {args.batch} samples per "
        f"rank and step.",
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
