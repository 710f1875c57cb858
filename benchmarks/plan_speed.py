"""``stepguard plan`` speed: the default sweep's wall time, and simulated GPU-hours per
second of the event-level model beside ``stepguard compare``'s step-level simulation
(the same-run baseline: the policy rules both play, one per step, one per fault).

Usage::

    python benchmarks/plan_speed.py            # writes BENCHMARKS.md
    python benchmarks/plan_speed.py --no-md    # quick look
"""

from __future__ import annotations

import argparse
import time

from _common import command_line, cores_busy, environment, write_section

from pipeline.tools.compare import run_policy
from pipeline.tools.plan import POLICIES, plan_one, sweep
from pipeline.tools.simulator import find_scenario

SWEEP_GPUS = (64, 512, 4096, 16384)
SWEEP_DAYS = (7.0, 21.0, 60.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scenario", default="ci_smoke")
    ap.add_argument("--no-md", action="store_true")
    args = ap.parse_args()
    env = environment(command_line(), ("numpy", "pydantic"))
    busy0 = cores_busy()
    one, swept, step = [], [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        plan_one(1024, 21, 300, replicates=1000)
        one.append(time.perf_counter() - t)
        t = time.perf_counter()
        sweep(SWEEP_GPUS, SWEEP_DAYS, 300, replicates=400)
        swept.append(time.perf_counter() - t)
        sc = find_scenario(args.scenario)
        t = time.perf_counter()
        res = run_policy(sc, "active")
        step.append((time.perf_counter() - t, res.wall_s * sc.n_ranks / 3600))
    busy1 = cores_busy()
    plan_gpu_h = 1000 * len(POLICIES) * 21 * 24 * 1024
    plan_rate = plan_gpu_h / min(one)
    step_s, step_gpu_h = min(step)
    step_rate = step_gpu_h / step_s
    busy = ""
    if busy0 and busy1 and busy1[1] > busy0[1]:
        import os

        share = (busy1[0] - busy0[0]) / (busy1[1] - busy0[1]) * (os.cpu_count() or 1)
        busy = f" (cores busy during the run, other work included: {share:.2f})"
    md = (
        "## Planning speed (`benchmarks/plan_speed.py`)\n\n"
        f"`{env['command']}` — {env['date']}; {env['machine']}; "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items())
        + ".\n\n"
        "Best of the repeats on a shared machine" + busy + ". *plan, one job*: "
        "`plan_one(1024 GPUs, 21 days)`, 1,000 replicates, three policies, the "
        "checkpoint interval searched over 241 values; *default sweep*: `stepguard plan "
        "--sweep-gpus 64,512,4096,16384` (days 7, 21, 60; 400 replicates, 121 intervals); "
        f"*compare*: `run_policy({args.scenario!r}, 'active')`, the step-level simulation "
        "with the detection core (the same-run baseline).\n\n"
        "| run | wall s | simulated GPU-hours/s | ratio to compare |\n|---|---:|---:|---:|\n"
        f"| plan, one job | {min(one):.2f} | {plan_rate:,.0f} | {plan_rate / step_rate:,.0f} |\n"
        f"| default sweep (12 cells) | {min(swept):.2f} | | |\n"
        f"| compare (step level) | {step_s:.2f} | {step_rate:,.1f} | 1 |\n"
    )
    print(md)
    if not args.no_md:
        write_section("plan_speed", md)


if __name__ == "__main__":
    main()
