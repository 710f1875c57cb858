"""Detector throughput: rank-steps scored per second per core, and memory per rank.

For jobs of 1k, 16k and 128k ranks (8 GPUs per node, 4 pipeline stages, one slow
rank), frames are synthesised with numpy (no simulator) and scored single-threaded:

- **peer**: ``PeerDetector.score_frame`` alone (robust peer statistics of one step);
- **full**: ``DetectorSuite.process_step`` (peer scores, per-rank temporal baselines,
  CUSUM / smoothed creep, missing ranks, divergence, grading, then learning).

Memory per tracked rank: the ``DetectorSuite`` written by ``pipeline.io.statecodec`` (the
worker's changelog snapshot, before compression)
divided by the ranks, and the bytes ``tracemalloc`` sees retained by a suite after
its warm-up, divided by the ranks.

Everything runs in one thread (the numpy operations used — sorting, partitioning,
elementwise arithmetic — do not multithread), so the figures are per core.

Usage::

    python benchmarks/detector_throughput.py                  # prints a markdown table
    python benchmarks/detector_throughput.py --json out.json --write-md
    python benchmarks/detector_throughput.py --sizes 1024,16384 --seconds 0.5
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import platform
import sys
import time
import tracemalloc
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from _common import write_section

from detectors.engine import DetectorSuite
from detectors.frame import StepFrame
from detectors.steps.peer import PeerDetector
from pipeline.io import statecodec

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS_MD = ROOT / "BENCHMARKS.md"
SIZES = (1024, 16384, 131072)
TARGET_PEER = 500_000
WARMUP_STEPS = 25  # past the suite's per-rank warm-up, so every stage is active


def synth_frames(n_ranks: int, count: int, seed: int = 0) -> list[StepFrame]:
    """``count`` synchronous steps of an ``n_ranks`` job: 8 GPUs per node, tensor
    parallel inside a node, 4 pipeline stages (stage 3 is 20 % heavier), 1.5 % noise,
    rank 5 20 % slow from the 10th step."""
    rng = np.random.default_rng(seed)
    rank = np.arange(n_ranks)
    stage = (rank // 8) % 4
    stage_f = np.where(stage == 3, 1.2, 1.0)
    static = 1.0 + 0.01 * rng.standard_normal(n_ranks)
    nodes = tuple(f"node-{i:05d}" for i in range(n_ranks // 8))
    frames = []
    ts = 1.7e9
    for step in range(count):
        compute = 0.9 * static * stage_f * (1.0 + 0.015 * rng.standard_normal(n_ranks))
        if step >= 10:
            compute[5] *= 1.2
        data = 0.01 * np.exp(0.3 * rng.standard_normal(n_ranks))
        busy = compute + data
        step_time = float(busy.max()) + 0.06
        ts += step_time
        frames.append(
            StepFrame.from_arrays(
                "bench",
                step,
                ts,
                compute,
                step_time - busy,
                data,
                pp_stage=stage,
                dp_group=rank // 32,
                node_names=nodes,
                loss=np.where(stage == 3, 2.5, np.nan),
                grad_norm=np.full(n_ranks, 1.0),
            )
        )
    return frames


def _cycle(frames: Sequence[StepFrame], step: int, dt_s: float) -> StepFrame:
    f = frames[step % len(frames)]
    return dataclasses.replace(f, step=step, ts=1.7e9 + dt_s * step)


def bench_size(n_ranks: int, seconds: float, pool: int = 8) -> dict[str, Any]:
    frames = synth_frames(n_ranks, max(pool, 12))
    tail = frames[10:]  # the steps with the slow rank
    peer = PeerDetector()
    # peer stage
    peer.score_frame(tail[0])
    done, t0 = 0, time.perf_counter()
    while True:
        peer.score_frame(tail[done % len(tail)])
        done += 1
        el = time.perf_counter() - t0
        if el >= seconds and done >= 3:
            break
    peer_rate = done * n_ranks / el
    # full suite: warm up (untimed), then time
    mon = DetectorSuite("bench")
    step = 0
    for _ in range(WARMUP_STEPS):
        mon.process_step(_cycle(tail, step, 1.0))
        step += 1
    done, t0 = 0, time.perf_counter()
    while True:
        mon.process_step(_cycle(tail, step, 1.0))
        step += 1
        done += 1
        el = time.perf_counter() - t0
        if el >= seconds and done >= 3:
            break
    full_rate = done * n_ranks / el
    snapshot = len(statecodec.dumps(mon, level=0))
    # retained memory of a fresh suite after its warm-up
    inputs = [_cycle(tail, s, 1.0) for s in range(WARMUP_STEPS)]
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    mon2 = DetectorSuite("bench")
    for f in inputs:
        mon2.process_step(f)
    retained = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return {
        "peer": round(peer_rate),
        "full": round(full_rate),
        "snapshot_bytes_per_rank": round(snapshot / n_ranks, 1),
        "tracemalloc_bytes_per_rank": round(retained / n_ranks, 1),
        "full_ms_per_step": round(1000.0 * n_ranks / full_rate, 2),
        "peer_ms_per_step": round(1000.0 * n_ranks / peer_rate, 2),
    }


def environment() -> dict[str, Any]:
    import river

    return {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "versions": {"numpy": np.__version__, "river": river.__version__},
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def markdown(result: dict[str, Any]) -> str:
    env = result["machine"]
    lines = [
        "## Detector throughput",
        "",
        f"`python benchmarks/detector_throughput.py` — {result['date']}; {env['platform']}, "
        f"{env['cpus']} CPUs, one core used; Python {env['python']}, numpy "
        f"{result['versions']['numpy']}, river {result['versions']['river']}.",
        "",
        "Rank-steps scored per second on one core. *peer*: robust peer statistics of a "
        "step (`PeerDetector.score_frame`); *full*: `DetectorSuite.process_step` with the "
        "per-rank temporal baselines, creep detection, grading and learning. Memory per "
        "tracked rank: the suite's state snapshot (statecodec, uncompressed) / ranks, and "
        "bytes retained after warm-up "
        "(tracemalloc) / ranks.",
        "",
        "| ranks | peer rank-steps/s | full rank-steps/s | peer ms/step | full ms/step "
        "| snapshot B/rank | tracemalloc B/rank |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for n, r in result["rank_steps_per_s"].items():
        b = result["bytes_per_rank"][n]
        lines.append(
            f"| {int(n):,} | {r['peer']:,} | {r['full']:,} | {r['peer_ms_per_step']} | "
            f"{r['full_ms_per_step']} | {b['snapshot']} | {b['tracemalloc']} |"
        )
    worst = min(r["peer"] for r in result["rank_steps_per_s"].values())
    ok = "met" if worst >= TARGET_PEER else "**not met**"
    lines += [
        "",
        f"Target >= {TARGET_PEER:,} rank-steps/s/core for the peer stage: {ok} (lowest {worst:,}).",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="ranks per job")
    ap.add_argument("--seconds", type=float, default=2.0, help="timed seconds per stage")
    ap.add_argument("--json", type=Path, help="write the results as JSON here")
    ap.add_argument("--write-md", action="store_true", help="update BENCHMARKS.md")
    ap.add_argument("--md", type=Path, default=BENCHMARKS_MD, help="markdown file")
    args = ap.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    result: dict[str, Any] = {"rank_steps_per_s": {}, "bytes_per_rank": {}}
    for n in sizes:
        print(f"{n} ranks ...", file=sys.stderr, flush=True)
        r = bench_size(n, args.seconds)
        result["rank_steps_per_s"][str(n)] = {
            "peer": r["peer"],
            "full": r["full"],
            "peer_ms_per_step": r["peer_ms_per_step"],
            "full_ms_per_step": r["full_ms_per_step"],
        }
        result["bytes_per_rank"][str(n)] = {
            "snapshot": r["snapshot_bytes_per_rank"],
            "tracemalloc": r["tracemalloc_bytes_per_rank"],
        }
    result.update(environment())
    result["target_peer_rank_steps_per_s"] = TARGET_PEER
    md = markdown(result)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    if args.write_md:
        write_section("detector_throughput", md, args.md)
    print(md)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
