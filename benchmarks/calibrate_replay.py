"""Calibration replay speed: rank-steps per second through ``stepguard calibrate``,
beside the detector's own speed on the same records.

One simulated job (a straggler, 8 GPUs per node) is archived into a fresh chDB
database through the archiver's row mapping (``pipeline.tools.calibrate.seed``), then:

- **load**: ``archived_jobs`` reads it back (steps into frames, health, labels);
- **detector**: ``DetectorSuite.process_step`` + ``tick`` on the loaded frames, nothing
  else (the detector_throughput approach, on the same records: the same-run baseline);
- **detector + health**: the same plus ``process_health`` of the job's health reports
  before the step they precede (what the detectors themselves cost on these records);
- **replay**: ``pipeline.tools.calibrate.replay.replay`` (the detection core with health, commands,
  lifecycle, clock ticks across gaps) and judging against the labels, one process;
- **grid**: ``calibrate`` over a grid of settings with 1 and with N spawned processes,
  wall time including the processes' start: what a user waits for.

Usage::

    python benchmarks/calibrate_replay.py                 # writes BENCHMARKS.md
    python benchmarks/calibrate_replay.py --nodes 16 --steps 120 --no-md   # quick look
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from _common import command_line, cores_busy, environment, write_section

from detectors.config import DetectorConfig
from detectors.engine import DetectorSuite
from pipeline.services.archive.backend import ChdbBackend
from pipeline.services.archive.migrations import migrate
from pipeline.tools.calibrate.archive import archived_jobs
from pipeline.tools.calibrate.grid import calibrate
from pipeline.tools.calibrate.replay import replay, score_job
from pipeline.tools.calibrate.seed import seed_job
from pipeline.tools.simulator import Scenario

GRID = {"straggler_warning": [0.03, 0.05, 0.08], "hang_factor": [2.0, 3.0]}


def _best_of(n: int, fn) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def run(nodes: int, steps: int, processes: int, repeats: int) -> dict:  # type: ignore[type-arg]
    sc = Scenario.model_validate({
        "name": f"bench-{nodes}n", "nodes": nodes, "steps": steps, "seed": 7,
        "faults": [{"kind": "straggler", "node": 3, "gpu": 2, "onset_step": steps // 2,
                    "magnitude": 0.1}],
    })  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="stepguard-calbench-") as tmp:
        backend = ChdbBackend(Path(tmp), database="calbench")
        migrate(backend)
        t0 = time.perf_counter()
        seed_job(backend, sc)
        seed_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        (job,) = archived_jobs(backend)
        load_s = time.perf_counter() - t0
        backend.close()
    rs = job.rank_steps
    cfg = DetectorConfig()

    def detector_only() -> None:
        mon = DetectorSuite(job.job_id, cfg)
        for f in job.frames:
            mon.process_step(f)
            mon.tick(f.ts)

    health = sorted(job.health, key=lambda h: h.ts)

    def detector_and_health() -> None:
        mon = DetectorSuite(job.job_id, cfg)
        i = 0
        for f in job.frames:
            while i < len(health) and health[i].ts.timestamp() <= f.ts:
                mon.process_health(health[i])
                i += 1
            mon.process_step(f)
            mon.tick(f.ts)

    det_s = _best_of(repeats, detector_only)
    det_h_s = _best_of(repeats, detector_and_health)
    replay_s = _best_of(repeats, lambda: score_job(job, replay(job, cfg)))
    points = 1 + 6  # the running settings + the grid
    grid_wall = {}
    for procs in sorted({1, processes}):
        t0 = time.perf_counter()
        result = calibrate([job], GRID, processes=procs)
        grid_wall[procs] = time.perf_counter() - t0
        assert len(result.points) == points
    return {
        "ranks": sc.n_ranks, "steps": len(job.frames), "rank_steps": rs,
        "health_reports": len(job.health), "seed_s": round(seed_s, 2),
        "load_rank_steps_per_s": round(rs / load_s),
        "detector_rank_steps_per_s": round(rs / det_s),
        "replay_rank_steps_per_s": round(rs / replay_s),
        "detector_health_rank_steps_per_s": round(rs / det_h_s),
        "replay_over_detector": round(det_s / replay_s, 3),
        "replay_over_detector_health": round(det_h_s / replay_s, 3),
        "grid_points": points,
        "grid_rank_steps_per_s": {p: round(points * rs / w) for p, w in grid_wall.items()},
        "grid_wall_s": {p: round(w, 2) for p, w in grid_wall.items()},
    }  # fmt: skip


def markdown(results: list[dict], env: dict) -> str:  # type: ignore[type-arg]
    procs = sorted({p for r in results for p in r["grid_rank_steps_per_s"]})
    lines = [
        "## Calibration replay",
        "",
        f"`{env['command']}` — {env['date']}; {env['machine']}; "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items()) + ".",
        "",
        "One simulated job with a straggler archived into chDB, read back by "
        "`stepguard calibrate`'s loader, then replayed. *detector*: `DetectorSuite.process_step`"
        " + `tick` alone on the same loaded frames (the same-run baseline, as in the "
        "detector throughput section); *detector + health*: the same with the job's health "
        "reports (`process_health`); *replay*: the "
        "detection core driven as calibrate drives it (health held and released, clock "
        "ticks across gaps) plus judging the alerts; *grid*: `calibrate` over the running "
        "settings + 6 grid points, wall time including spawning the processes. Best of "
        "the repeats; the machine was shared with other work, so absolute figures are "
        "noisy while the ratios are measured back to back"
        + (f" (the machine's cores busy during the run, other work included: "
           f"{env['cores_busy']})." if "cores_busy" in env else "."),
        "",
        "| ranks | rank-steps | load rank-steps/s | detector rank-steps/s | replay rank-steps/s "
        "| detector + health rank-steps/s | replay / detector | replay / (detector + health) | "
        + " | ".join(f"grid ({p} proc) rank-steps/s" for p in procs) + " |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|" + "---:|" * len(procs),
    ]  # fmt: skip
    for r in results:
        lines.append(
            f"| {r['ranks']:,} | {r['rank_steps']:,} | {r['load_rank_steps_per_s']:,} | "
            f"{r['detector_rank_steps_per_s']:,} | {r['replay_rank_steps_per_s']:,} | "
            f"{r['detector_health_rank_steps_per_s']:,} | {r['replay_over_detector']:.2f} | "
            f"{r['replay_over_detector_health']:.2f} | "
            + " | ".join(f"{r['grid_rank_steps_per_s'].get(p, 0):,}" for p in procs)
            + " |"
        )
    big = max(results, key=lambda r: r["ranks"])
    lines += [
        "",
        f"At {big['ranks']:,} ranks a replay runs at {big['replay_over_detector_health']:.2f} "
        "of the detectors' own speed on the same steps and health reports: the driver "
        "(event-time merge, held health, clock ticks, judging) adds little; the health "
        "reports (`process_health`, 8 GPUs a node every 10 steps) are most of the "
        f"difference to the steps-only figure ({big['replay_over_detector']:.2f}). The "
        "grid's wall time includes spawning its processes and shipping the jobs to them "
        "once; on a machine whose cores are busy with other work more processes do not "
        "help, on an idle one each replays its own settings in parallel.",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", default="8,128", help="comma-separated job sizes (nodes)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--processes", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--no-md", action="store_true", help="do not write BENCHMARKS.md")
    args = ap.parse_args()
    env = environment(command_line(), ("numpy", "river", "chdb", "pydantic"))
    results = []
    before = cores_busy()
    for n in (int(x) for x in args.nodes.split(",")):
        r = run(n, args.steps, args.processes, args.repeats)
        print(json.dumps(r))
        results.append(r)
    after = cores_busy()
    if before is not None and after is not None and after[1] > before[1]:
        busy = (after[0] - before[0]) / (after[1] - before[1]) * (os.cpu_count() or 1)
        env["cores_busy"] = f"{busy:.2f} of {os.cpu_count()}"
    md = markdown(results, env)
    print(md)
    if args.json:
        args.json.write_text(json.dumps({"env": env, "results": results}, indent=2) + "\n")
    if not args.no_md:
        write_section("calibrate_replay", md)


if __name__ == "__main__":
    main()
