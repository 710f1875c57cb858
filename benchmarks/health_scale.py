"""Health cost per report as the job grows (issue 40, item 4).

A job of N nodes x 8 GPUs (the simulator, health every step so that every step is a
health round) is driven through :class:`~detectors.job.JobDetection` as a worker drives
it while the job's steps lag its health: each round's N reports arrive
(``on_health``: beyond ``max_held_health``, 4,096 by default, the oldest are processed
at once), then a tick half a second after the round's time (a worker's tick; one at
the round's own time would find the clock there already and release nothing) releases
the rest, then the step's frame.
Timed: the ``on_health`` calls and the tick, per report (the frames are not timed).

Two paths, same job, same run:

- **new**: a report updates its node's presence and signals; the job-wide clock check
  (hang, presence over every node, the grader's sweep) runs once per call;
- **per-report clock** (the path before issue 40): every report a tick or an overflow
  releases checks the clock at once (:class:`PerReportClock`, which the unit test
  ``tests/unit/detectors/test_health_scale.py`` holds to the same alerts). It costs a
  sweep of every node per report (quadratic per round: 80 s a round at 4,096 nodes
  here), so it is timed on the first ``--old-sample`` reports of one round, on a job
  warmed up on the new path.

Target: cost per report at 8,192 nodes <= 2x its cost at 512 (new path).

Usage::

    python benchmarks/health_scale.py --quick             # < 1 min
    python benchmarks/health_scale.py --write-md          # 3 rounds, old sample of 256
    python benchmarks/health_scale.py --sizes 512,1024 --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from _common import command_line, environment, write_section

from detectors.job import JobDetection
from pipeline.tools.simulator import Scenario, simulate
from pipeline.tools.simulator.job import SimEvent
from schemas import Alert, NodeHealth

SIZES = (512, 4096, 8192)
TARGET_RATIO = 2.0  #: cost per report at the largest size / at the smallest, at most
TICK_AFTER_S = 0.5  #: the tick that releases a round comes this long after its reports
WARM_ROUNDS = 6  #: past the hardware detector's warm-up (5 reports per GPU)


class PerReportClock(JobDetection):
    """The path before issue 40: the clock checked after every report released."""

    def _health(self, hts: float, msg: NodeHealth, *, tick: bool) -> list[Alert]:
        return super()._health(hts, msg, tick=tick) + self._check_clock()


def job_events(nodes: int, rounds: int, seed: int = 7) -> list[SimEvent]:
    """The simulated job's events: a health round of every node at each step."""
    sc = Scenario.model_validate(
        {
            "name": f"health-scale-{nodes}",
            "nodes": nodes,
            "steps": WARM_ROUNDS + rounds,
            "seed": seed,
            "health_interval_steps": 1,
            "warmup_steps": 0,
        }
    )
    return list(simulate(sc))


def run(events: Sequence[SimEvent], rounds: int, old_sample: int) -> dict[str, Any]:
    """Drive ``events``: warm-up rounds, ``rounds`` timed rounds on the new path, then,
    if ``old_sample``, the last round's first ``old_sample`` reports timed on the
    per-report clock (the same detector, switched: the old path costs a sweep of every
    node per report, so a sample of a round shows its cost per report). The new path's
    cost per report is that of its best round (this machine's cores are shared: the
    best round is the one least disturbed)."""
    det = JobDetection(next(ev.frame.job_id for ev in events if ev.frame is not None))
    first_timed = len(events) - rounds - (1 if old_sample else 0)
    new: list[float] = []
    old: list[float] = []
    for i, ev in enumerate(events):
        hs = ev.health
        if old_sample and i == len(events) - 1:
            det.__class__ = PerReportClock
            hs = hs[:old_sample]
        t0 = time.perf_counter()
        for h in hs:
            det.on_health(h)
        if hs:
            det.tick(max(h.ts.timestamp() for h in hs) + TICK_AFTER_S)
        if det.held_health:
            raise RuntimeError(f"the tick left {det.held_health} reports of a round held")
        dt = time.perf_counter() - t0
        if i >= first_timed and hs:
            (old if isinstance(det, PerReportClock) else new).append(1e6 * dt / len(hs))
        if ev.frame is not None:
            det.on_frame(ev.frame)
    out = {"new": {"us_per_report": round(min(new), 1), "rounds": len(new)}}
    if old:
        out["per_report_clock"] = {"us_per_report": round(old[0], 1), "reports": old_sample}
    return out


def measure(sizes: Sequence[int], rounds: int, old_sample: int) -> dict[str, Any]:
    """Each size: ``rounds`` timed rounds at the largest size, more at smaller ones (as
    many reports timed at each size: a small round is over before the load of a shared
    machine evens out)."""
    out: dict[str, Any] = {}
    for n in sizes:
        t0 = time.perf_counter()
        n_rounds = rounds * max(1, max(sizes) // n)
        events = job_events(n, n_rounds + (1 if old_sample else 0))
        gc.collect()
        gc.freeze()  # the simulated job's records: not traversed by every collection
        sim_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        out[str(n)] = row = run(events, n_rounds, min(old_sample, n))
        del events
        gc.unfreeze()
        print(
            f"{n} nodes: {row} (simulated in {sim_s:.1f}s, run in {time.perf_counter() - t0:.1f}s)",
            file=sys.stderr,
            flush=True,
        )
    return out


def markdown(result: dict[str, Any]) -> str:
    env = result["environment"]
    sizes = list(result["sizes"])
    base = result["sizes"][sizes[0]]["new"]["us_per_report"]
    lines = [
        "## Health cost per report (issue 40)",
        "",
        f"`{env['command']}` — {env['date']}; {env['machine']}; "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items())
        + ".",
        "",
        "A job of N nodes x 8 GPUs, health every step, each round of N reports fed to "
        "`JobDetection.on_health` and released by a tick 0.5 s after the round (the default "
        "hold of 4,096 reports overflows beyond 4,096 nodes), then the step's frame "
        "(untimed). Microseconds per report, reports and tick together, after "
        f"{WARM_ROUNDS} warm-up rounds, the best of {result['rounds']} rounds at the "
        "largest size (as many reports timed at each size: more rounds at smaller ones). "
        "*new*: the clock checked once per call; "
        "*per-report clock*: the path before issue 40, measured in the same run "
        "(`PerReportClock`: every released report checks the clock at once; timed on "
        f"the first {result['old_sample']} reports of one more round, on the same "
        "detector).",
        "",
        "| nodes | new µs/report | x 512 nodes | per-report clock µs/report | old / new |",
        "|---:|---:|---:|---:|---:|",
    ]
    for n in sizes:
        row = result["sizes"][n]
        new = row["new"]["us_per_report"]
        old = row.get("per_report_clock", {}).get("us_per_report")
        lines.append(
            f"| {int(n):,} | {new:,} | {new / base:.2f} | "
            + (f"{old:,} | {old / new:.0f}x |" if old else "not run | |")
        )
    ratio = result["ratio_largest_to_smallest"]
    ok = "met" if ratio <= TARGET_RATIO else "**not met**"
    lines += [
        "",
        f"Target: cost per report at {int(sizes[-1]):,} nodes <= {TARGET_RATIO:g}x its cost "
        f"at {int(sizes[0]):,}: {ok} ({ratio:.2f}x).",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="nodes per job")
    ap.add_argument("--rounds", type=int, default=3, help="timed health rounds at the largest size")
    ap.add_argument(
        "--old-sample",
        type=int,
        default=256,
        help="reports of one round timed on the old path (0: not measured)",
    )
    ap.add_argument("--quick", action="store_true", help="2 rounds; an old sample of 32")
    ap.add_argument("--json", type=Path, help="write the results as JSON here")
    ap.add_argument("--write-md", action="store_true", help="update BENCHMARKS.md")
    args = ap.parse_args(argv)
    sizes = sorted(int(s) for s in args.sizes.split(",") if s.strip())
    rounds, old_sample = args.rounds, args.old_sample
    if args.quick:
        rounds, old_sample = 2, min(old_sample, 32)
    if rounds < 1 or old_sample < 0:
        ap.error("--rounds must be >= 1 and --old-sample >= 0")
    result: dict[str, Any] = {"sizes": measure(sizes, rounds, old_sample)}
    first = result["sizes"][str(sizes[0])]["new"]["us_per_report"]
    last = result["sizes"][str(sizes[-1])]["new"]["us_per_report"]
    result["ratio_largest_to_smallest"] = round(last / first, 3)
    result["target_ratio"] = TARGET_RATIO
    result["old_sample"] = old_sample
    result["rounds"] = rounds
    result["environment"] = environment(command_line(), ("numpy", "pydantic"))
    md = markdown(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if args.write_md:
        write_section("health_scale", md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
