"""Pipeline throughput and latency: exporter hook, bare consumer, Faust, the worker.

Measures, on a real broker (embedded Tansu unless --bootstrap / STEPGUARD_KAFKA_BOOTSTRAP):

- baselines of the same run: ``detector_full_rank_steps_per_s`` (the detection core on
  one core, 1,024 ranks), ``bare_consumer_msgs_per_s`` (aiokafka reading the steps
  topic, no decoding), ``faust_per_event_baseline_per_s`` (a Faust agent that counts);
- ``exporter_call_us``: mean cost of one ``StepExporter.record_step`` call;
- ``worker_rank_steps_per_s``: ``stepguard worker`` scoring a pre-filled steps topic
  (one job of 128 nodes x 8 ranks, node messages), from its Prometheus counter;
  ``worker_rank_steps_per_s_rack`` the same job in rack messages of ``--rack`` nodes;
  ``worker_rank_steps_per_s_128k`` the same for one job of 16,384 nodes (131,072 ranks)
  in node messages (skip with ``--no-node-128k``), ``..._128k_rack`` in rack messages
  of ``--rack`` nodes (StepTelemetry version 2);
- ``latency_p50_s`` / ``latency_p99_s``: 16k ranks (2048 nodes x 8) at 1 step/s in real
  time, wall time at scoring minus the step's end (the worker's latency histogram);
  ``latency_128k_rack_*`` the same for 131,072 ranks in rack messages;
- ``worker_peak_rss_mb`` / ``..._128k``: the worker's peak RSS (VmHWM);
- columnar telemetry (StepTelemetry version 3, issue 40), keys with ``columnar``:
  ``columnar_decode_frame_us_per_rank_step_rack`` (the worker's decode and step frames
  per rank-step, rack messages of ``--rack`` nodes) beside
  ``columnar_baseline_decode_frame_us_per_rank_step_node`` (today's node messages, same
  run) and their ratio; ``core_rank_steps_per_s[_rack]_columnar``;
  ``worker_rank_steps_per_s_columnar`` (128 nodes x 8 ranks, columnar node messages),
  ``worker_rank_steps_per_s_128k_rack_columnar``; ``--columnar-only`` runs just these,
  each beside its baseline (``columnar_baseline_*``) in the same run, and
  ``columnar_breakdown_us_{rack_v3,rack_v2,node_v3,node_v1}``: the core's µs a
  rank-step by part (decode, auth, frame, assembly, detection, other; the worker's
  ``*_cpu_us`` less the core's total is Faust, the consumer and the broker's fetch);
- ``workers_2_rank_steps_per_s`` / ``workers_1_...``: two workers on two partitions
  against one. Not run on the embedded broker (``--no-two-workers`` is implied there):
  Tansu expires a stopped member's session whatever its timeout, and the run hangs in
  the rebalance that follows.

Every record is dated from now; the run stops with an error when the worker
dead-letters or refuses one (a rate over thrown-away records is not a rate).
Targets (issue 26): >= 300k rank-steps/s and >= 1/8 of the slower baseline; a
131,072-rank job at >= 1 step/s with p99 <= 2 s; p99 <= 1 s at 16k ranks; the hook
<= 20 us per call. ``--batch-max 1`` runs the workers one record per call (the
per-record path) for a before/after in the same conditions. Writes the section between
the ``pipeline_throughput`` markers of BENCHMARKS.md and, with ``--json PATH``, the
numbers as JSON.

    .venv/bin/python benchmarks/pipeline_throughput.py --quick --json /tmp/pt.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import cores_busy, environment, write_section  # noqa: E402
from detector_throughput import bench_size  # noqa: E402

from pipeline.agents.rack import merge_nodes  # noqa: E402
from pipeline.client import StepExporter  # noqa: E402
from pipeline.io.embedded import TansuBroker, free_port  # noqa: E402
from pipeline.io.kafka import create_topics, make_producer, registry_of  # noqa: E402
from pipeline.io.settings import Settings, load_settings  # noqa: E402
from pipeline.io.telemetry_auth import NodeKeys, TelemetryVerifier  # noqa: E402
from pipeline.io.trust import ephemeral_keys  # noqa: E402
from pipeline.services.worker.records import partition_for  # noqa: E402
from schemas import TOPICS, RankSample, StepTelemetry, encode  # noqa: E402

#: the benchmark's cluster telemetry secret: every message carries its nodes' proofs
#: (as exporters and rack aggregators send them), and the workers verify them, unless
#: a row measures the worker without authentication (``AUTH["on"] = False``), or the
#: proof headers carried but not checked (``AUTH["check"] = False``: what the header's
#: transport costs apart from the check)
BENCH_SECRET = os.urandom(32)
BENCH_KEYS = NodeKeys(secret=BENCH_SECRET)
AUTH = {"on": True, "check": True}


def node_model(
    job: str, node: int, step: int, ts: float, gpus: int = 8, version: int = 1
) -> StepTelemetry:
    samples = tuple(
        RankSample(
            rank=node * gpus + g, local_rank=g, step_time_s=1.0,
            compute_s=0.85 + 0.001 * ((node * 31 + g * 7 + step) % 11),
            comm_wait_s=0.1, data_wait_s=0.01, loss=2.5, grad_norm=1.0,
        )
        for g in range(gpus)
    )  # fmt: skip
    t = datetime.fromtimestamp(ts, UTC)
    return StepTelemetry(
        schema_version=version, job_id=job, node=f"node-{node:05d}", step=step,
        ts_start=datetime.fromtimestamp(ts - 1.0, UTC), ts_end=t, samples=samples,
    )  # fmt: skip


def node_message(job: str, node: int, step: int, ts: float, gpus: int = 8) -> bytes:
    return encode(node_model(job, node, step, ts, gpus))


class NodeMessages:
    """Pre-encoded steps messages for the prefill and the real-time latency run.

    The load generator shares the machine's cores with the broker and the worker;
    building 2,048 pydantic messages a second would take CPU from what is measured
    (on a cluster every node encodes its own). Each sender gets one template per value
    of the compute-time pattern, rendered with the step and its times. ``rack`` > 1:
    one StepTelemetry version 2 per ``rack`` nodes (what ``stepguard export-rack``
    sent before issue 40), else one per node (version 1); ``columnar``: version 3
    instead, the samples as columns (what both send now).
    """

    def __init__(self, job: str, nodes: int, rack: int = 1, columnar: bool = False) -> None:
        self.columnar = columnar
        # any whole second works as the template's time: every render replaces it
        self._T = float(int(time.time()) - 7)
        end = datetime.fromtimestamp(self._T, UTC).strftime("%Y-%m-%dT%H:%M:%SZ").encode()
        start = datetime.fromtimestamp(self._T - 1, UTC).strftime("%Y-%m-%dT%H:%M:%SZ").encode()
        self.templates = [
            [
                self._message(job, group, k, rack)
                .replace(b'"step":%d,' % k, b'"step":%(step)d,')
                .replace(start, b"%(start)s")
                .replace(end, b"%(end)s")
                for k in range(11)
            ]
            for group in range(0, nodes, rack)
        ]
        #: the nodes each sender's message speaks for (its proofs)
        self.senders = [
            [f"node-{group:05d}"] if rack == 1 else
            [f"rack-{group // rack:05d}"] + [f"node-{n:05d}" for n in range(group, group + rack)]
            for group in range(0, nodes, rack)
        ]  # fmt: skip

    def _message(self, job: str, first: int, step: int, rack: int) -> bytes:
        if rack == 1:
            return encode(node_model(job, first, step, self._T, version=3 if self.columnar else 1))
        models = [node_model(job, n, step, self._T) for n in range(first, first + rack)]
        return encode(merge_nodes(models, f"rack-{first // rack:05d}", columnar=self.columnar))

    def render(self, step: int, ts: float) -> list[bytes]:
        """Every sender's message for ``step`` ending at ``ts`` (times formatted once)."""
        fmt = "%Y-%m-%dT%H:%M:%S.%fZ"
        args = {
            b"step": step,
            b"start": datetime.fromtimestamp(ts - 1.0, UTC).strftime(fmt).encode(),
            b"end": datetime.fromtimestamp(ts, UTC).strftime(fmt).encode(),
        }
        return [variants[step % 11] % args for variants in self.templates]

    def send(self, producer: Any, topic: str, key: bytes, step: int, ts: float) -> int:
        """Send every sender's message for ``step``, with its nodes' proofs (when
        ``AUTH["on"]``); returns how many."""
        values = self.render(step, ts)
        for value, nodes in zip(values, self.senders, strict=True):
            if AUTH["on"]:
                headers = BENCH_KEYS.proofs(value, nodes)
                producer.send(topic, key=key, value=value, headers=headers)
            else:
                producer.send(topic, key=key, value=value)
        return len(values)


def fresh(settings: Settings) -> Settings:
    tag = uuid.uuid4().hex[:8]
    return settings.model_copy(update={"topic_prefix": f"b{tag}.", "consumer_group": f"b{tag}"})


# -- exporter hook ---------------------------------------------------------------------
def bench_exporter(settings: Settings, calls: int) -> float:
    exporter = StepExporter.direct(
        settings, job_id="bench", node="n0", ranks_per_node=8, queue_size=calls + 10,
        register_atexit=False,
    )  # fmt: skip
    record = exporter.record_step
    t0 = time.perf_counter()
    for i in range(calls):
        record(i >> 3, i & 7, step_time_s=1.0, compute_s=0.85, comm_wait_s=0.1,
               data_wait_s=0.01, local_rank=i & 7, loss=2.5)  # fmt: skip
    elapsed = time.perf_counter() - t0
    exporter.close(timeout=30)
    return elapsed / calls * 1e6


# -- prefill + bare consumer -----------------------------------------------------------
def prefill(
    settings: Settings, job: str | list[str], nodes: int, steps: int, rack: int = 1,
    columnar: bool = False,
) -> int:  # fmt: skip
    """``steps`` steps of ``nodes`` nodes of each job, step by step (jobs interleaved)."""
    create_topics(settings)
    producer = make_producer(settings)
    topic = registry_of(settings).name("steps")
    jobs = [job] if isinstance(job, str) else job
    messages = [NodeMessages(j, nodes, rack, columnar) for j in jobs]
    # dated from now: the last step ends now, so no record is ahead of the worker's
    # clock (the clock-skew rule dead-letters those) however long the prefill takes
    t0 = time.time() - steps
    n = 0
    for step in range(steps):
        for j, msgs in zip(jobs, messages, strict=True):
            n += msgs.send(producer, topic, j.encode(), step, t0 + step)
    producer.flush(timeout=120)
    producer.close()
    return n


def bench_bare_consumer(settings: Settings, expected: int) -> float:
    from aiokafka import AIOKafkaConsumer

    async def run() -> float:
        consumer = AIOKafkaConsumer(
            registry_of(settings).name("steps"), bootstrap_servers=settings.kafka_bootstrap,
            group_id=None, auto_offset_reset="earliest", enable_auto_commit=False,
            max_partition_fetch_bytes=8 * 1024 * 1024,
        )  # fmt: skip
        await consumer.start()
        got, t0 = 0, None
        try:
            while got < expected:
                batches = await consumer.getmany(timeout_ms=1000, max_records=10000)
                if t0 is None and batches:
                    t0 = time.perf_counter()
                got += sum(len(v) for v in batches.values())
        finally:
            await consumer.stop()
        return got / (time.perf_counter() - (t0 or time.perf_counter()))

    return asyncio.run(run())


# -- the worker's core without Faust ---------------------------------------------------
def bench_core(
    nodes: int, steps: int, rack: int = 1, auth: bool = False, cpu_out: list[float] | None = None,
    columnar: bool = False,
) -> float:  # fmt: skip
    """Rank-steps/s of :class:`WorkerDetection` alone (decode, assembly, detection, snapshots)
    on pre-encoded records, in this process: what the worker would do without Faust.
    ``auth``: each record carries its nodes' proofs and the core verifies them; with
    ``cpu_out``, this process's CPU microseconds per message are appended to it."""
    from pipeline.services.worker.state import CoreTopics, WorkerDetection

    messages = NodeMessages("core-job", nodes, rack, columnar)
    t0 = time.time() - steps
    values = [v for step in range(steps) for v in messages.render(step, t0 + step)]
    senders = messages.senders * steps
    headers = [
        BENCH_KEYS.proofs(v, n) if auth else None for v, n in zip(values, senders, strict=True)
    ]
    check = TelemetryVerifier(NodeKeys(secret=BENCH_SECRET)) if auth else None
    core = WorkerDetection(CoreTopics("s", "h", "j"), 1, max_clock_skew_s=300.0,
                           telemetry=check)  # fmt: skip
    scored, letters = 0, 0
    records = [(k, b"core-job", v, headers[k]) for k, v in enumerate(values)]
    start, cpu = time.perf_counter(), time.process_time()
    for at in range(0, len(records), FETCH):  # fetches, as the worker reads them
        for out in core.handle_steps(0, records[at : at + FETCH], token=None):
            scored += out.rank_steps
            letters += len(out.dead_letters)
    elapsed = time.perf_counter() - start
    if cpu_out is not None:
        cpu_out.append((time.process_time() - cpu) / len(values) * 1e6)
    if letters or not scored:
        raise RuntimeError(f"the core dead-lettered {letters} records, scored {scored}")
    return scored / elapsed


#: records a fetch of the core benchmarks (the worker's default ``worker_batch_max``)
FETCH = 1000


def bench_core_breakdown(
    nodes: int, steps: int, rack: int = 1, columnar: bool = False
) -> dict[str, float]:
    """Where the core's time goes, microseconds per rank-step, on the worker's path
    (``handle_steps`` a fetch at a time, proofs checked): ``decode`` (the fetch's
    records, :func:`~pipeline.io.fetchcolumns.decode_fetch`), ``auth`` (the proofs),
    ``frame`` (``StepFrame.from_messages``), ``detection`` (``on_frame``: the suite),
    ``assembly`` (the rest of ``on_step``: rank ownership and count, the assembler),
    ``other`` (the rest of ``handle_steps``: admission, clocks, snapshots); and
    ``total``. Each part timed by a wrapper around it (a few µs per message)."""
    from detectors.frame import StepFrame
    from detectors.job import JobDetection
    from pipeline.io import telemetry_auth
    from pipeline.services.worker import intake
    from pipeline.services.worker.state import CoreTopics, WorkerDetection

    spent = dict.fromkeys(("decode", "auth", "frame", "detection", "on_step"), 0.0)

    def timed(part: str, fn: Any) -> Any:
        def wrapper(*args: Any, **kw: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                spent[part] += time.perf_counter() - t

        return wrapper

    messages = NodeMessages("core-job", nodes, rack, columnar)
    t0 = time.time() - steps
    values = [v for step in range(steps) for v in messages.render(step, t0 + step)]
    senders = messages.senders * steps
    records = [(k, b"core-job", v, BENCH_KEYS.proofs(v, n))
               for k, (v, n) in enumerate(zip(values, senders, strict=True))]  # fmt: skip
    verifier = telemetry_auth.TelemetryVerifier
    saved = (intake.decode_fetch, verifier.nodes_problem, StepFrame.__dict__["from_messages"],
             JobDetection.on_frame, JobDetection.on_step)  # fmt: skip
    intake.decode_fetch = timed("decode", saved[0])  # type: ignore[assignment]
    telemetry_auth.TelemetryVerifier.nodes_problem = timed("auth", saved[1])  # type: ignore[method-assign]
    StepFrame.from_messages = classmethod(timed("frame", saved[2].__func__))  # type: ignore[method-assign,assignment]
    JobDetection.on_frame = timed("detection", saved[3])  # type: ignore[method-assign]
    JobDetection.on_step = timed("on_step", saved[4])  # type: ignore[method-assign]
    try:
        check = TelemetryVerifier(NodeKeys(secret=BENCH_SECRET))
        core = WorkerDetection(CoreTopics("s", "h", "j"), 1, max_clock_skew_s=300.0,
                               telemetry=check)  # fmt: skip
        scored = 0
        start = time.perf_counter()
        for at in range(0, len(records), FETCH):
            for out in core.handle_steps(0, records[at : at + FETCH], token=None):
                scored += out.rank_steps
        total = time.perf_counter() - start
    finally:
        intake.decode_fetch = saved[0]
        telemetry_auth.TelemetryVerifier.nodes_problem = saved[1]  # type: ignore[method-assign]
        StepFrame.from_messages = saved[2]  # type: ignore[method-assign]
        JobDetection.on_frame, JobDetection.on_step = saved[3], saved[4]  # type: ignore[method-assign]
    per = 1e6 / scored
    out = {k: spent[k] * per for k in ("decode", "auth", "frame", "detection")}
    out["assembly"] = (spent["on_step"] - spent["frame"] - spent["detection"]) * per
    out["other"] = (total - spent["decode"] - spent["auth"] - spent["on_step"]) * per
    out["total"] = total * per
    return out


def bench_core_parts(nodes: int, steps: int) -> dict[str, float]:
    """Microseconds per node message of parts of the core, on the same records one
    part at a time: the fast decoder, the step frames alone (``StepFrame.from_messages``
    of each step's decoded messages), and the detection core's ``on_step`` (assembly,
    the frame, the rank count, detection) on decoded records. ``handle_step`` whole
    (all of it plus the worker's offsets, clock checks and snapshots) is
    :func:`bench_core`."""
    from detectors.frame import StepFrame
    from pipeline.io.fastdecode import decode_step
    from pipeline.services.worker.state import CoreTopics, WorkerDetection

    messages = NodeMessages("core-job", nodes)
    t0 = time.time() - steps
    values = [v for step in range(steps) for v in messages.render(step, t0 + step)]
    start = time.perf_counter()
    decoded = [decode_step(v) for v in values]
    decode_s = time.perf_counter() - start
    if any(d is None for d in decoded):
        raise RuntimeError("the fast decoder left benchmark records to pydantic")
    # the frames alone: every step's messages merged (what assembly hands detection)
    start = time.perf_counter()
    for i in range(0, len(decoded), nodes):
        StepFrame.from_messages(decoded[i : i + nodes])
    frame_s = time.perf_counter() - start
    core = WorkerDetection(CoreTopics("s", "h", "j"), 1, max_clock_skew_s=300.0)
    detection = core.state("core-job", lambda _: None).detection
    start = time.perf_counter()
    for d in decoded:
        detection.on_step(d)
    on_step_s = time.perf_counter() - start
    n = len(values) / 1e6
    return {"decode_us": decode_s / n, "frame_us": frame_s / n, "on_step_us": on_step_s / n}


def bench_decode_frame(nodes: int, steps: int, rack: int = 1, columnar: bool = False) -> float:
    """Microseconds per rank-step of the worker's decode (``decode_fetch`` of each
    step's records: version 3 as one block of arrays a step, other versions record by
    record) and the step frames (``StepFrame.from_messages`` of each step's decoded
    messages): what issue 40 takes from per-field Python work to arrays. Raises when
    the fast decoder leaves a record to pydantic (a refused record is not measured)."""
    from detectors.frame import StepFrame
    from pipeline.io.fetchcolumns import decode_fetch

    messages = NodeMessages("core-job", nodes, rack, columnar)
    per_step = len(messages.senders)
    t0 = time.time() - steps
    values = [v for step in range(steps) for v in messages.render(step, t0 + step)]
    best = math.inf
    for _ in range(3):  # the best of three: the machine is shared
        start = time.perf_counter()
        for i in range(0, len(values), per_step):
            decoded = decode_fetch(values[i : i + per_step])
            if any(d is None for d in decoded):
                raise RuntimeError("the fast decoder left benchmark records to pydantic")
            StepFrame.from_messages(decoded)
        best = min(best, time.perf_counter() - start)
    return best / (steps * nodes * 8) * 1e6


def bench_columnar(rack: int) -> dict[str, float]:
    """Issue 40's side-by-side rows, one run: decode + frame per rank-step and the core
    (decode, assembly, detection) on today's messages and on columnar ones."""
    out: dict[str, float] = {}
    node = bench_decode_frame(128, 30)
    col_rack = bench_decode_frame(2048, 4, rack=rack, columnar=True)
    out["columnar_baseline_decode_frame_us_per_rank_step_node"] = node
    out["columnar_baseline_decode_frame_us_per_rank_step_rack"] = bench_decode_frame(
        2048, 4, rack=rack
    )
    out["columnar_decode_frame_us_per_rank_step_node"] = bench_decode_frame(128, 30, columnar=True)
    out["columnar_decode_frame_us_per_rank_step_rack"] = col_rack
    out["columnar_decode_frame_ratio_rack_to_node_path"] = col_rack / node
    out["columnar_baseline_core_rank_steps_per_s"] = bench_core(128, 60)
    out["core_rank_steps_per_s_columnar"] = bench_core(128, 60, columnar=True)
    out["columnar_baseline_core_rank_steps_per_s_rack"] = bench_core(2048, 8, rack=rack)
    out["core_rank_steps_per_s_rack_columnar"] = bench_core(2048, 8, rack=rack, columnar=True)
    for name, nodes, steps, per, columnar in (
        ("columnar_breakdown_us_rack_v3", 2048, 8, rack, True),
        ("columnar_breakdown_us_rack_v2", 2048, 8, rack, False),
        ("columnar_breakdown_us_node_v3", 128, 60, 1, True),
        ("columnar_breakdown_us_node_v1", 128, 60, 1, False),
    ):
        out[name] = bench_core_breakdown(nodes, steps, per, columnar)  # type: ignore[assignment]
    return out


def bench_columnar_worker(base: Settings, rack: int, steps: int, tmp: Path) -> dict[str, float]:
    """:func:`bench_columnar`, then the worker (Faust, the broker) on node messages of
    8 ranks and on the 131,072-rank job in rack messages, today's and columnar, in
    turn on the same broker, with the worker's own CPU microseconds per rank-step
    (``*_cpu_us``: what bounds it when the broker and the load generator share the
    cores); a run whose records the worker refuses raises."""
    out = bench_columnar(rack)
    big = max(10, steps // 20)
    runs = (
        ("columnar_baseline_worker_rank_steps_per_s", 128, steps, 1, False),
        ("worker_rank_steps_per_s_columnar", 128, steps, 1, True),
        ("columnar_baseline_worker_rank_steps_per_s_128k_rack", 16_384, big, rack, False),
        ("worker_rank_steps_per_s_128k_rack_columnar", 16_384, big, rack, True),
    )
    for key, nodes, n_steps, per, columnar in runs:
        print(f"worker: {key} ...", flush=True)
        cpu: list[float] = []
        out[key], _ = bench_worker_throughput(
            fresh(base), nodes, n_steps, tmp, rack=per, cpu_out=cpu, columnar=columnar
        )
        out[key.replace("_per_s", "_cpu_us")] = cpu[0]
    out["columnar_128k_rack_speedup"] = (
        out["worker_rank_steps_per_s_128k_rack_columnar"]
        / out["columnar_baseline_worker_rank_steps_per_s_128k_rack"]
    )
    out["columnar_128k_rack_steps_per_s"] = out["worker_rank_steps_per_s_128k_rack_columnar"] / (
        16_384 * 8
    )
    out["rack"] = rack
    return out


def bench_verify(nodes: int, steps: int, rack: int = 1) -> float:
    """CPU microseconds per steps message that the worker's proof check alone takes
    (the value hashed once, one HMAC per node it speaks for, against its headers)."""
    from pipeline.io.fastdecode import decode_step
    from pipeline.io.telemetry_auth import message_nodes

    messages = NodeMessages("core-job", nodes, rack)
    t0 = time.time() - steps
    values = [v for step in range(steps) for v in messages.render(step, t0 + step)]
    headers = [BENCH_KEYS.proofs(v, n) for v, n in
               zip(values, messages.senders * steps, strict=True)]  # fmt: skip
    views = [decode_step(v) for v in values]
    check = TelemetryVerifier(NodeKeys(secret=BENCH_SECRET))
    start = time.process_time()  # this process's CPU: a shared machine's load aside
    for value, view, proof in zip(values, views, headers, strict=True):
        if check.nodes_problem(proof, value, message_nodes(view)) is not None:
            raise RuntimeError("a benchmark message failed its proof")
    return (time.process_time() - start) / len(values) * 1e6


def bench_auth(base: Settings, steps: int, tmp: Path, rack: int, rounds: int = 3) -> dict:
    """The cost of authenticated telemetry, same run: the proof check alone per message,
    the core with and without proofs (node and rack messages), and the worker on the
    embedded broker with and without (128 nodes x ``steps``, each worker its own freshly
    filled topic). Runs alternate, ``rounds`` of each; the best of each is kept (a
    shared machine's noise only ever slows a run down)."""
    out: dict[str, float] = {}
    out["auth_verify_us_per_message"] = min(bench_verify(128, 60) for _ in range(rounds))
    out["auth_verify_us_per_message_rack"] = min(
        bench_verify(2048, 8, rack=rack) for _ in range(rounds)
    )
    plain, signed, plain_r, signed_r = [], [], [], []
    cpu_core: list[float] = []
    cpu_core_auth: list[float] = []
    for _ in range(rounds):
        plain.append(bench_core(128, 60, cpu_out=cpu_core))
        signed.append(bench_core(128, 60, auth=True, cpu_out=cpu_core_auth))
        plain_r.append(bench_core(2048, 8, rack=rack))
        signed_r.append(bench_core(2048, 8, rack=rack, auth=True))
    out["core_rank_steps_per_s_noauth"], out["core_rank_steps_per_s_auth"] = max(plain), max(signed)
    out["core_rank_steps_per_s_rack_noauth"] = max(plain_r)
    out["core_rank_steps_per_s_rack_auth"] = max(signed_r)
    # this process's CPU per node message in the core, with and without (median)
    out["core_cpu_us_per_message_noauth"] = statistics.median(cpu_core)
    out["core_cpu_us_per_message_auth"] = statistics.median(cpu_core_auth)
    out["auth_core_cpu_cost_pct"] = 100.0 * (
        out["core_cpu_us_per_message_auth"] / out["core_cpu_us_per_message_noauth"] - 1
    )
    # a node message is 8 rank-steps: the core's time per message, and the check's share
    core_us = 8 / out["core_rank_steps_per_s_noauth"] * 1e6
    out["auth_verify_share_of_core_pct"] = 100.0 * out["auth_verify_us_per_message"] / core_us
    worker_plain, worker_signed, cpu_plain, cpu_signed, cpu_carried = [], [], [], [], []
    for _ in range(rounds):
        AUTH["on"] = False
        try:
            worker_plain.append(
                bench_worker_throughput(fresh(base), 128, steps, tmp, cpu_out=cpu_plain)[0]
            )
        finally:
            AUTH["on"] = True
        worker_signed.append(
            bench_worker_throughput(fresh(base), 128, steps, tmp, cpu_out=cpu_signed)[0]
        )
        AUTH["check"] = False  # the headers travel, the worker does not check them
        try:
            bench_worker_throughput(fresh(base), 128, steps, tmp, cpu_out=cpu_carried)
        finally:
            AUTH["check"] = True
    out["worker_cpu_us_per_rank_step_headers_unchecked"] = statistics.median(cpu_carried)
    out["worker_rank_steps_per_s_noauth"] = max(worker_plain)
    out["worker_rank_steps_per_s_auth"] = max(worker_signed)
    out["auth_worker_cost_pct"] = 100.0 * (
        1 - out["worker_rank_steps_per_s_auth"] / out["worker_rank_steps_per_s_noauth"]
    )
    # the worker's own CPU per rank-step (median of the rounds): robust to the load
    out["worker_cpu_us_per_rank_step_noauth"] = statistics.median(cpu_plain)
    out["worker_cpu_us_per_rank_step_auth"] = statistics.median(cpu_signed)
    out["auth_worker_cpu_cost_pct"] = 100.0 * (
        out["worker_cpu_us_per_rank_step_auth"] / out["worker_cpu_us_per_rank_step_noauth"] - 1
    )
    # the check's own CPU per node message (8 rank-steps) against the worker's
    per_message = 8 * out["worker_cpu_us_per_rank_step_noauth"]
    out["auth_verify_share_of_worker_pct"] = 100.0 * out["auth_verify_us_per_message"] / per_message
    return out


# -- faust baseline --------------------------------------------------------------------
FAUST_BASELINE = r"""
import os, sys, time, faust
bootstrap, topic, group, expected, out = sys.argv[1:6]
expected = int(expected)
app = faust.App(group, env={}, broker=f"kafka://{bootstrap}", autodiscover=False,
                web_enabled=False, value_serializer="raw", key_serializer="raw",
                broker_session_timeout=6, consumer_auto_offset_reset="earliest",
                topic_allow_declare=False, datadir=out + ".data")
state = {"n": 0, "t0": None}
@app.agent(app.topic(topic, value_type=bytes, key_type=bytes))
async def count(stream):
    async for _ in stream:
        if state["t0"] is None:
            state["t0"] = time.perf_counter()
        state["n"] += 1
        if state["n"] >= expected:
            rate = state["n"] / (time.perf_counter() - state["t0"])
            open(out, "w").write(str(rate))
            os._exit(0)
faust.Worker(app, loglevel="error", quiet=True).execute_from_commandline()
"""


def bench_faust(settings: Settings, expected: int, tmp: Path) -> float:
    out = tmp / f"faust-{uuid.uuid4().hex[:6]}.txt"
    script = tmp / "faust_baseline.py"
    script.write_text(FAUST_BASELINE)
    topic = registry_of(settings).name("steps")
    proc = subprocess.run(
        [sys.executable, str(script), settings.kafka_bootstrap, topic,
         f"{settings.consumer_group}.faust", str(expected), str(out)],
        check=False, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if not out.exists():
        raise RuntimeError(f"faust baseline failed: {proc.stderr[-2000:]}")
    return float(out.read_text())


# -- the worker ------------------------------------------------------------------------
#: extra settings of every worker started (``--batch-max``)
WORKER_ENV: dict[str, str] = {}


class WorkerProc:
    def __init__(
        self, settings: Settings, tmp: Path, name: str = "", session_timeout_s: float = 6.0
    ) -> None:
        self.port = free_port()
        tag = f"{settings.consumer_group}{name}"
        env = (
            {k: v for k, v in os.environ.items() if not k.startswith("STEPGUARD_")}
            | {
                "STEPGUARD_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
                "STEPGUARD_BROKER_FLAVOR": settings.broker_flavor,
                "STEPGUARD_TOPIC_PREFIX": settings.topic_prefix,
                "STEPGUARD_CONSUMER_GROUP": settings.consumer_group,
                "STEPGUARD_WORKER_METRICS_PORT": str(self.port),
                "STEPGUARD_WORKER_DATA_DIR": str(tmp / f"w-{tag}"),
                "STEPGUARD_WORKER_SESSION_TIMEOUT_S": f"{session_timeout_s:g}",
            }
            | WORKER_ENV
        )
        # telemetry proofs: the cluster secret, or authentication off (logged)
        if AUTH["on"] and AUTH["check"]:
            env["STEPGUARD_TELEMETRY_SECRET"] = base64.b64encode(BENCH_SECRET).decode()
        else:
            env["STEPGUARD_TELEMETRY_AUTH"] = "off"
        # the worker signs its alerts and verifies commands: throwaway keys
        keys = ephemeral_keys(settings, "bench", ("worker", "actuator"))
        for name, value in keys.items():
            secret = value.get_secret_value() if hasattr(value, "get_secret_value") else value
            env[f"STEPGUARD_{name.upper()}"] = secret
        self.log = (tmp / f"worker-{tag}.log").open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline.services.worker"], cwd=ROOT, env=env,
            stdout=self.log, stderr=subprocess.STDOUT,
        )  # fmt: skip

    def scrape(self) -> str:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=2) as r:
                return r.read().decode()
        except OSError:
            return ""

    def value(self, name: str, text: str | None = None) -> float:
        text = self.scrape() if text is None else text
        m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
        return float(m.group(1)) if m else 0.0

    def refusals(self, text: str | None = None) -> dict[str, float]:
        """Dead letters per stage and refused records so far (all should stay 0)."""
        text = self.scrape() if text is None else text
        out = {
            f"dead_letters[{stage}]": float(v)
            for stage, v in re.findall(
                r'^stepguard_worker_dead_letters_total\{stage="([^"]+)"\} (\S+)$', text, re.M
            )
        }
        self.log.flush()
        failed = Path(self.log.name).read_bytes().count(b"] worker failed on ")
        if failed:
            out["records the worker failed on (logged)"] = float(failed)
        for name in ("future_dated", "refused_for_limit", "after_end"):
            m = re.search(rf'^stepguard_worker_state_events\{{event="{name}"\}} (\S+)$', text, re.M)
            if m:
                out[name] = float(m.group(1))
        return {k: v for k, v in out.items() if v > 0}

    def check(self, text: str | None = None) -> None:
        """Fail loudly when the worker dead-lettered or refused any benchmark record:
        a rate over records it threw away is not a rate."""
        bad = self.refusals(text)
        if bad:
            raise RuntimeError(
                f"worker refused benchmark records {bad} (see {self.log.name}): "
                "the figures would be meaningless"
            )

    def cpu_s(self) -> float:
        """CPU seconds the worker process has used (user + system)."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return 0.0
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def peak_rss_mb(self) -> float:
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except OSError:
            return 0.0
        m = re.search(r"VmHWM:\s+(\d+) kB", status)
        return int(m.group(1)) / 1024 if m else 0.0

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def bench_worker_throughput(
    settings: Settings, nodes: int, steps: int, tmp: Path, rack: int = 1, timeout_s: float = 600,
    cpu_out: list[float] | None = None, columnar: bool = False,
):  # fmt: skip
    """Rank-steps/s of one worker over a prefilled backlog, and its peak RSS; with
    ``cpu_out``, the worker's CPU microseconds per rank-step while it scored are
    appended to it (its own time: what a loaded machine's other processes do not
    change)."""
    prefill(settings, "bench-job", nodes, steps, rack, columnar)
    total = (steps - 2) * nodes * 8  # the last steps wait for a later one to complete
    w = WorkerProc(settings, tmp)
    try:
        t_first = None
        v = 0.0
        ready = None  # when it first held its partitions, before it had scored anything
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = w.scrape()
            w.check(text)
            v = w.value("stepguard_worker_rank_steps_total", text)
            held = w.value("stepguard_worker_assigned_partitions", text) >= 1
            if ready is None and held and v == 0:
                ready = (time.perf_counter(), 0.0, w.cpu_s())
            if v > 0 and t_first is None:
                t_first, v_first, cpu_first = time.perf_counter(), v, w.cpu_s()
                if v >= total:
                    # the whole backlog in one batch (a broker that hands it over in a
                    # few large fetches): its counter moved once, so time it from when
                    # it was ready (its first fetch included: a lower bound on its rate)
                    if ready is None:
                        raise RuntimeError("the worker scored the backlog before it was seen ready")
                    t_first, v_first, cpu_first = ready
            if v >= total:
                break
            time.sleep(0.05)
        if t_first is None or v < total:
            w.check()
            raise RuntimeError(f"worker scored {v} of {total} rank-steps in {timeout_s:.0f} s")
        rate = (v - v_first) / (time.perf_counter() - t_first)
        if cpu_out is not None:
            cpu_out.append((w.cpu_s() - cpu_first) / (v - v_first) * 1e6)
        return rate, w.peak_rss_mb()
    finally:
        w.stop()


def _job_on(partition: int, n_partitions: int, stem: str) -> str:
    """A job id the steps topic's default partitioner puts on ``partition``."""
    return next(
        job for i in range(10_000)
        if partition_for(job := f"{stem}-{i}", n_partitions) == partition
    )  # fmt: skip


def bench_two_workers(
    settings: Settings, nodes: int, steps: int, tmp: Path, timeout_s: float = 600
) -> dict[str, Any]:
    """Two jobs of ``nodes`` nodes on two partitions of the steps topic (the first and
    the last, which any assignment of 8 partitions to two members splits), scored by
    one worker and then by two in one consumer group, the same records each time. The
    workers join and settle their assignment before any record is sent, so the rate is
    the steady state, not the rebalance. Then they are stopped (SIGSTOP, within their
    session timeout) while every record is sent, and measured from the moment they go
    on (SIGCONT) until the first is done with its job: each has its whole backlog
    throughout, and the load generator takes none of their CPU (scoring while it still
    sent, they scored at its pace, and a faster worker made the ratio noise)."""
    n_parts = TOPICS["steps"].partitions
    jobs = [_job_on(0, n_parts, "bench-a"), _job_on(n_parts - 1, n_parts, "bench-b")]
    total = len(jobs) * (steps - 2) * nodes * 8
    out: dict[str, Any] = {}
    for n in (1, 2):
        s = fresh(settings)
        create_topics(s)
        # a session timeout that outlasts the prefill, while they are stopped
        workers = [WorkerProc(s, tmp, name=f"-{i}", session_timeout_s=45) for i in range(n)]
        try:
            stable, last, deadline = 0, None, time.monotonic() + 120
            while stable < 6:  # every member assigned, and the assignment settled
                owned = tuple(w.value("stepguard_worker_assigned_partitions") for w in workers)
                stable = stable + 1 if all(owned) and owned == last else 0
                last = owned
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{n} worker(s) never settled: partitions {owned}")
                time.sleep(0.25)
            v_first = sum(w.value("stepguard_worker_rank_steps_total") for w in workers)
            for w in workers:
                w.proc.send_signal(signal.SIGSTOP)
            try:
                prefill(s, jobs, nodes, steps)
            finally:
                for w in workers:
                    w.proc.send_signal(signal.SIGCONT)
            t_first = time.perf_counter()
            busy_first, cpu_first = cores_busy(), [w.cpu_s() for w in workers]
            v = 0.0
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                texts = [w.scrape() for w in workers]
                for w, text in zip(workers, texts, strict=True):
                    w.check(text)
                per = [
                    w.value("stepguard_worker_rank_steps_total", t)
                    for w, t in zip(workers, texts, strict=True)
                ]
                v = sum(per)
                # the window ends when a worker is done with its job: after that one
                # of the two would be idle, which measures the jobs' ends, not scaling
                if v >= total or max(per) >= total / n:
                    break
                time.sleep(0.05)
            if max(per) < total / n:
                raise RuntimeError(f"{n} worker(s) scored {v} of {total} rank-steps")
            elapsed = time.perf_counter() - t_first
            out[f"workers_{n}_rank_steps_per_s"] = (v - v_first) / elapsed
            out[f"workers_{n}_window_s"] = round(elapsed, 2)
            out[f"workers_{n}_shares"] = [round(x / v, 3) for x in per]
            # what the machine had left: its cores busy (broker and load included) and
            # the workers' own share of them, over the measured window
            busy_last = cores_busy()
            if busy_first is not None and busy_last is not None:
                spent = busy_last[0] - busy_first[0]
                out[f"workers_{n}_cores_busy"] = round(
                    spent / (busy_last[1] - busy_first[1]) * (os.cpu_count() or 1), 2
                )
            out[f"workers_{n}_worker_cores"] = round(
                sum(w.cpu_s() - c for w, c in zip(workers, cpu_first, strict=True)) / elapsed, 2
            )
        finally:
            for w in workers:
                w.stop()
    return out


def histogram_quantile(text: str, name: str, q: float) -> float:
    buckets = [
        (float("inf") if le == "+Inf" else float(le), float(c))
        for le, c in re.findall(rf'^{re.escape(name)}_bucket{{le="([^"]+)"}} (\S+)$', text, re.M)
    ]
    buckets.sort()
    total = buckets[-1][1] if buckets else 0.0
    if total == 0:
        return float("nan")
    target, prev_le, prev_c = q * total, 0.0, 0.0
    for le, c in buckets:
        if c >= target:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (target - prev_c) / max(c - prev_c, 1e-12)
        prev_le, prev_c = le, c
    return prev_le


def bench_latency(settings: Settings, nodes: int, seconds: int, tmp: Path, rack: int = 1):
    create_topics(settings)
    w = WorkerProc(settings, tmp)
    producer = make_producer(settings, linger_ms=2)
    topic = registry_of(settings).name("steps")
    job = "latency-job"
    messages = NodeMessages(job, nodes, rack)
    try:
        # warm the worker up before the clock starts: Faust's start and the group join
        # with nothing sent (steps sent meanwhile would wait as a backlog that the timed
        # run then inherits), then a few steps, until it has scored what it can
        deadline = time.monotonic() + 120
        while not w.value("stepguard_worker_assigned_partitions"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker never joined its group (see {w.log.name})")
            time.sleep(0.25)
        step = 0
        while w.value("stepguard_worker_steps_total") < 3 and time.monotonic() < deadline:
            messages.send(producer, topic, job.encode(), step, time.time())
            producer.flush()
            step += 1
            time.sleep(1.0)
        while w.value("stepguard_worker_steps_total") < step - 2 and time.monotonic() < deadline:
            time.sleep(0.25)  # the warm-up's own backlog drained (the last two wait)
        base = w.scrape()
        t_next = time.monotonic()
        for _ in range(seconds):
            t_next += 1.0
            # every rank of the synchronous job ends the step now
            messages.send(producer, topic, job.encode(), step, time.time())
            producer.flush()
            step += 1
            time.sleep(max(0.0, t_next - time.monotonic()))
        # let the last steps complete (two later steps release them)
        time.sleep(2.5)
        end = w.scrape()
        w.check(end)
        name = "stepguard_worker_step_latency_seconds"
        text = _diff_hist(base, end, name)
        if histogram_quantile(text, name, 0.5) != histogram_quantile(text, name, 0.5):
            raise RuntimeError(f"worker scored no step of the latency run (see {w.log.name})")
        return (
            histogram_quantile(text, name, 0.5),
            histogram_quantile(text, name, 0.99),
            w.peak_rss_mb(),
        )
    finally:
        producer.close()
        w.stop()


def _diff_hist(before: str, after: str, name: str) -> str:
    """Bucket counts of ``after`` minus ``before`` (drop the warm-up)."""
    pat = re.compile(rf'^{re.escape(name)}_bucket{{le="([^"]+)"}} (\S+)$', re.M)
    old = dict(pat.findall(before))
    lines = [
        f'{name}_bucket{{le="{le}"}} {float(c) - float(old.get(le, 0))}'
        for le, c in pat.findall(after)
    ]
    return "\n".join(lines)


# -- report ----------------------------------------------------------------------------
def write_markdown(results: dict, path: Path) -> None:
    r = results
    ok, bad = "✅", "❌"
    bare_ranks = r["bare_consumer_msgs_per_s"] * 8  # 8 ranks per node message
    bound = min(bare_ranks, r["detector_full_rank_steps_per_s"])
    worker = r["worker_rank_steps_per_s"]
    rack = r["worker_rank_steps_per_s_128k_rack"]
    rack_small = r.get("worker_rank_steps_per_s_rack")
    node_big = r.get("worker_rank_steps_per_s_128k")
    one, two = r.get("workers_1_rank_steps_per_s"), r.get("workers_2_rank_steps_per_s")
    # seconds per rank-step: the fetch (a bare consumer's, 8 or 8 x rack ranks a record)
    # and the core's without Faust (node messages at 128 nodes, rack messages); the
    # steps topic reaches the worker a fetch per partition at a time, so Faust's
    # per-record path is not on it
    fetch_node = 1.0 / bare_ranks
    fetch_rack = 1.0 / (bare_ranks * r["rack"])
    core_node = 1.0 / r["core_rank_steps_per_s"]
    core_rack = 1.0 / r["core_rank_steps_per_s_rack"]
    pred_node, pred_rack = 1.0 / (fetch_node + core_node), 1.0 / (fetch_rack + core_rack)
    detect = 1.0 / r["detector_full_rank_steps_per_s"]
    parts = r["core_parts_us"]
    floor_us = parts["decode_us"] + parts.get("frame_us", 0.0) + 8e6 * fetch_node
    env = r["environment"]

    def mark(good: bool) -> str:
        return ok if good else bad

    rows = [
        ("worker rank-steps/s (1 worker, 128 nodes x 8 ranks, node messages)",
         f"{worker:,.0f} ({worker / bound:.3f} x bound)", ">= 300,000 and >= 1/8 x bound",
         mark(worker >= 300_000 and worker >= bound / 8)),
        (f"worker rank-steps/s (1 worker, 128 nodes x 8 ranks, {r['rack']} nodes a message)",
         "not run" if rack_small is None else f"{rack_small:,.0f} ({rack_small / worker:.2f} x "
         "node messages)", ">= 300,000", "" if rack_small is None else
         mark(rack_small >= 300_000)),
        ("worker rank-steps/s, one job of 131,072 ranks, node messages",
         "not run" if node_big is None else f"{node_big:,.0f} ({node_big / 131_072:.2f} "
         "steps/s)", "", ""),
        (f"worker rank-steps/s, one job of 131,072 ranks, {r['rack']} nodes a message",
         f"{rack:,.0f} ({rack / 131_072:.2f} steps/s)", ">= 131,072 (1 step/s)",
         mark(rack >= 131_072)),
        ("latency p50 / p99 at 16,384 ranks x 1 step/s, node messages (s)",
         f"{r['latency_p50_s']:.3f} / {r['latency_p99_s']:.3f}", "p99 <= 1.0",
         mark(r["latency_p99_s"] <= 1.0)),
        (f"latency p50 / p99 at 131,072 ranks x 1 step/s, {r['rack']} nodes a message (s)",
         f"{r['latency_128k_rack_p50_s']:.3f} / {r['latency_128k_rack_p99_s']:.3f}",
         "p99 <= 2.0", mark(r["latency_128k_rack_p99_s"] <= 2.0)),
        ("exporter record_step (µs/call)", f"{r['exporter_call_us']:.2f}", "<= 20",
         mark(r["exporter_call_us"] <= 20)),
        ("two workers on two partitions / one worker (2 jobs x 64 nodes x 8 ranks, the "
         "backlog sent while the workers are stopped)",
         "not run (embedded broker: a stopped member's session expires)" if two is None or one
         is None else f"{two / one:.2f} ({two:,.0f} / {one:,.0f} rank-steps/s; shares "
         f"{', '.join(map(str, r['workers_2_shares']))}; measured over "
         f"{r.get('workers_2_window_s', '?')} / {r.get('workers_1_window_s', '?')} s)",
         ">= 1.7", "" if two is None or one is None else mark(two / one >= 1.7)),
        (f"cores busy of {os.cpu_count()} (whole machine) / the workers' own: one "
         "worker; two workers",
         "not run" if two is None or one is None else
         f"{r.get('workers_1_cores_busy', '?')} / {r.get('workers_1_worker_cores', '?')}; "
         f"{r.get('workers_2_cores_busy', '?')} / {r.get('workers_2_worker_cores', '?')}",
         "", ""),
        ("worker peak RSS (MB): 1k-16k ranks / 131,072 ranks",
         f"{r['worker_peak_rss_mb']:.0f} / {r['worker_peak_rss_mb_128k']:.0f}", "", ""),
        ("baseline: bare aiokafka consumer (msgs/s; x 8 ranks)",
         f"{r['bare_consumer_msgs_per_s']:,.0f} ({bare_ranks:,.0f} rank-steps/s)", "", ""),
        ("baseline: detector, full rank-steps/s on one core (1,024 ranks)",
         f"{r['detector_full_rank_steps_per_s']:,.0f}", "", ""),
        ("baseline: the worker's core without Faust, one core (node / rack messages)",
         f"{r['core_rank_steps_per_s']:,.0f} / {r['core_rank_steps_per_s_rack']:,.0f}",
         "", ""),
        ("the core per node message of 8 ranks (µs): decode / the frame alone / detection "
         "core's on_step (assembly, frame, rank count, detection) / handle_step whole",
         f"{r['core_parts_us']['decode_us']:.1f} / "
         f"{r['core_parts_us'].get('frame_us', float('nan')):.1f} / "
         f"{r['core_parts_us']['on_step_us']:.1f} / {8e6 * core_node:.1f}", "", ""),
        ("baseline: Faust agent, count only (events/s)",
         f"{r['faust_per_event_baseline_per_s']:,.0f}", "", ""),
    ]  # fmt: skip
    versions = ", ".join(f"{k} {v}" for k, v in env["versions"].items())
    body = [
        "## Pipeline throughput (`benchmarks/pipeline_throughput.py`)",
        "",
        f"Run {r['run_at']} on {r['broker']} ({r['mode']}), {env['machine']}; {versions}: "
        f"`{r['command']}`. Load average {r['load_average_start']:.1f} at the start, "
        f"{r['load_average_end']:.1f} at the end (the broker, the workers and the load "
        f"generator share {os.cpu_count()} cores); every figure is also given as a "
        "ratio against a baseline measured in the same run. A node message carries one "
        "node's 8 ranks for one step; a rack message (StepTelemetry version 2, "
        f"`stepguard export-rack`) {r['rack']} nodes'. Every record is dated from now, and "
        "the run stops if the worker dead-letters or refuses any. 'bound' = the slower of "
        "(bare consumer x 8 ranks, detector on one core).",
        "",
        "| metric | value | target | |",
        "|---|---|---|---|",
        *[f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows],
        "",
        "Latency is wall time when the worker scores a step minus the step's end time "
        "(every sender's message sent at that moment, pre-encoded so the load generator "
        "does not take the worker's CPU); it includes the producer, the broker, Faust, "
        "decoding, step assembly and detection. "
        f"The worker handles {worker / 8:,.0f} node messages/s. A steps partition "
        "reaches its job agent a fetch at a time (one Faust event per partition and "
        "fetch, `pipeline/services/worker/bulk.py`), so Faust's per-record path is off "
        "the steps: a Faust agent that only counts records manages "
        f"{r['faust_per_event_baseline_per_s']:,.0f} events/s on the same broker, "
        f"{worker / 8 / r['faust_per_event_baseline_per_s']:.2f} x fewer than the worker "
        "scores. The jobs topic (health, commands, lifecycle, ticks) still goes a record "
        "at a time.",
        "",
        "Where the time goes: per record the worker spends what a bare consumer spends "
        "fetching it plus what its core spends without Faust (decode, assembly, "
        "detection, snapshots), one after the other on one core. Those two baselines "
        f"predict {pred_node:,.0f} rank-steps/s for node messages (measured "
        f"{worker:,.0f}, {worker / pred_node:.2f} of it) and {pred_rack:,.0f} for the "
        f"131,072-rank job in rack messages (measured {rack:,.0f}, {rack / pred_rack:.2f}): "
        f"the core's share is {core_node / (fetch_node + core_node):.0%} and "
        f"{core_rack / (fetch_rack + core_rack):.0%}. Within the core on node messages, "
        f"detection alone (the detector baseline, {detect * 1e6:.2f} µs a rank-step) "
        f"is {detect / core_node:.0%} of its {core_node * 1e6:.2f} µs; 300,000 "
        f"rank-steps/s leaves {1e6 / 300_000:.2f} µs a rank-step for everything, "
        f"{1e6 / 300_000 / (detect * 1e6):.2f} x what detection alone takes at 1,024 "
        f"ranks, so {8e6 / 300_000 - 8e6 * detect:.1f} µs a node message for the fetch, "
        "decode, assembly and the worker's bookkeeping, which take "
        f"{8e6 / worker - 8e6 * detect:.1f} µs in this run. Of those, the decode and the "
        "frame alone (each of a rank's 13 fields parsed from JSON into a msgspec struct, "
        "put in a tuple, transposed into a column and converted by numpy: per-field Python "
        f"work) take {parts['decode_us'] + parts.get('frame_us', 0.0):.1f} µs and the "
        f"bare consumer's fetch {8e6 * fetch_node:.1f} µs: {floor_us:.1f} µs a node message "
        f"before detection, assembly or bookkeeping, {floor_us / (8e6 / 300_000):.0%} of "
        "the 300,000 budget (each part timed on its own, one after another). One step a "
        "second at 131,072 "
        "ranks needs fetch and core under a second together; the latency there grows "
        "with the backlog whenever the worker scores slower than the job runs.",
    ]
    write_section("pipeline_throughput", "\n".join(body), path)


class Results(dict):
    """The figures so far, written to ``--json`` after every phase (a long run that is
    stopped keeps what it measured)."""

    path: Path | None = None

    def __setitem__(self, key: str, value: object) -> None:
        super().__setitem__(key, value)
        if self.path is not None:
            self.path.write_text(json.dumps(self, indent=2) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: under 3 minutes")
    ap.add_argument("--json", type=Path, help="write the numbers here")
    ap.add_argument("--bootstrap", default=os.environ.get("STEPGUARD_KAFKA_BOOTSTRAP", ""))
    ap.add_argument("--markdown", type=Path, default=ROOT / "BENCHMARKS.md")
    ap.add_argument("--rack", type=int, default=8, help="nodes per rack-level message")
    ap.add_argument(
        "--no-node-128k", action="store_true",
        help="skip the 128k-rank job in node-level messages (16,384 records a step)",
    )  # fmt: skip
    ap.add_argument(
        "--node-throughput-only", action="store_true",
        help="stop after the baselines and the 128 nodes x 8 ranks worker run",
    )  # fmt: skip
    ap.add_argument(
        "--no-two-workers", action="store_true",
        help="skip the two-workers row (implied on the embedded broker, where it hangs)",
    )  # fmt: skip
    ap.add_argument(
        "--auth-only",
        action="store_true",
        help="only the cost of authenticated telemetry: the core and the worker with and "
        "without proofs, same run (--json keys auth_*, *_auth, *_noauth)",
    )
    ap.add_argument(
        "--auth-steps", type=int, default=0, help="steps of the --auth-only worker runs",
    )  # fmt: skip
    ap.add_argument(
        "--auth-rounds", type=int, default=3,
        help="--auth-only: runs of each kind, alternating (the best of each is kept)",
    )  # fmt: skip
    ap.add_argument(
        "--columnar-only", action="store_true",
        help="only issue 40's side-by-side rows (--json keys *columnar*): decode + frame "
        "and the core on today's messages and on columnar ones (StepTelemetry version 3), "
        "then one worker at 128 nodes x 8 ranks in node messages, columnar and not, and "
        "the 131,072-rank job in rack messages, columnar and not",
    )  # fmt: skip
    ap.add_argument(
        "--batch-max", type=int, default=0,
        help="STEPGUARD_WORKER_BATCH_MAX of the workers (1: one event per call; 0: "
        "the default)",
    )  # fmt: skip
    args = ap.parse_args()
    if args.batch_max:
        WORKER_ENV["STEPGUARD_WORKER_BATCH_MAX"] = str(args.batch_max)
    steps, seconds, calls = (150, 20, 200_000) if args.quick else (600, 60, 1_000_000)
    tmp = Path(os.environ.get("TMPDIR", "/tmp")) / f"sg-bench-{uuid.uuid4().hex[:6]}"
    tmp.mkdir(parents=True)
    broker = None
    if args.bootstrap:
        base = load_settings({}, kafka_bootstrap=args.bootstrap, broker_flavor="kafka")
        where = f"Apache Kafka at {args.bootstrap}"
    else:
        broker = TansuBroker(log_dir=tmp / "tansu").start()
        base = load_settings({}, kafka_bootstrap=broker.bootstrap, broker_flavor="tansu")
        where = "embedded Tansu"
    try:
        results = Results(broker=where, mode="quick" if args.quick else "full")
        results.path = args.json
        results["command"] = "python benchmarks/pipeline_throughput.py " + " ".join(sys.argv[1:])
        results["run_at"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        results["environment"] = environment(
            results["command"], ("faust-streaming", "aiokafka", "msgspec", "numpy", "pydantic")
        )
        results["load_average_start"] = os.getloadavg()[0]
        if args.columnar_only:
            print("columnar telemetry: side by side ...", flush=True)
            for key, value in bench_columnar_worker(base, args.rack, steps, tmp).items():
                results[key] = value
            results["load_average_end"] = os.getloadavg()[0]
            print(json.dumps(results, indent=2))
            if args.json:
                args.json.write_text(json.dumps(results, indent=2) + "\n")
            return
        if args.auth_only:
            print("authenticated telemetry: with and without ...", flush=True)
            for key, value in bench_auth(
                base, args.auth_steps or steps, tmp, args.rack, args.auth_rounds
            ).items():
                results[key] = value
            results["load_average_end"] = os.getloadavg()[0]
            print(json.dumps(results, indent=2))
            if args.json:
                args.json.write_text(json.dumps(results, indent=2) + "\n")
            return
        print("detector baseline (one core) ...", flush=True)
        results["detector_full_rank_steps_per_s"] = bench_size(1024, 2.0)["full"]
        results["core_rank_steps_per_s"] = bench_core(128, 60)
        results["core_rank_steps_per_s_rack"] = bench_core(2048, 8, rack=args.rack)
        results["core_parts_us"] = bench_core_parts(128, 60)
        for key, value in bench_columnar(args.rack).items():
            results[key] = value
        print("exporter hook ...", flush=True)
        results["exporter_call_us"] = bench_exporter(fresh(base), calls)
        print("worker throughput ...", flush=True)
        s = fresh(base)
        rate, rss1 = bench_worker_throughput(s, 128, steps, tmp)
        results["worker_rank_steps_per_s"] = rate
        results["worker_rank_steps_per_s_columnar"], _ = bench_worker_throughput(
            fresh(base), 128, steps, tmp, columnar=True
        )
        print("bare consumer and Faust baseline ...", flush=True)
        results["bare_consumer_msgs_per_s"] = bench_bare_consumer(s, 128 * steps)
        results["faust_per_event_baseline_per_s"] = bench_faust(s, 128 * steps, tmp)
        results["worker_batch_max"] = args.batch_max or "default"
        if args.node_throughput_only:
            return
        print(f"worker throughput, {args.rack} nodes a message ...", flush=True)
        results["worker_rank_steps_per_s_rack"], _ = bench_worker_throughput(
            fresh(base), 128, 8 * steps, tmp, rack=args.rack
        )
        if args.bootstrap and not args.no_two_workers:
            print("one worker, then two, on two partitions ...", flush=True)
            scaling = bench_two_workers(fresh(base), 64, 4 * steps, tmp)
            for key, value in scaling.items():
                results[key] = value
        big_steps = 8 if args.quick else 30
        rss_big = 0.0
        if not args.no_node_128k:
            print("worker throughput at 128k ranks, node messages ...", flush=True)
            rate_big, rss_big = bench_worker_throughput(fresh(base), 16_384, big_steps, tmp)
            results["worker_rank_steps_per_s_128k"] = rate_big
        print(f"worker throughput at 128k ranks, {args.rack} nodes a message ...", flush=True)
        rate_rack, rss_rack = bench_worker_throughput(
            fresh(base), 16_384, 10 if args.quick else 3 * big_steps, tmp, rack=args.rack
        )  # fmt: skip
        results["worker_rank_steps_per_s_128k_rack"] = rate_rack
        print(f"worker throughput at 128k ranks, {args.rack} nodes a message, columns ...")
        results["worker_rank_steps_per_s_128k_rack_columnar"], _ = bench_worker_throughput(
            fresh(base), 16_384, 10 if args.quick else 3 * big_steps, tmp, rack=args.rack,
            columnar=True,
        )  # fmt: skip
        results["rack"] = args.rack
        print("latency at 16k ranks x 1 step/s ...", flush=True)
        p50, p99, rss2 = bench_latency(fresh(base), 2048, seconds, tmp)
        results["latency_p50_s"], results["latency_p99_s"] = p50, p99
        print(f"latency at 128k ranks x 1 step/s, {args.rack} nodes a message ...", flush=True)
        p50r, p99r, rss3 = bench_latency(fresh(base), 16_384, seconds, tmp, rack=args.rack)
        results["latency_128k_rack_p50_s"] = p50r
        results["latency_128k_rack_p99_s"] = p99r
        results["worker_peak_rss_mb"] = max(rss1, rss2, rss_big)
        results["worker_peak_rss_mb_128k"] = max(rss_big, rss_rack, rss3)
        results["load_average_end"] = os.getloadavg()[0]
    finally:
        if broker is not None:
            broker.stop()
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    write_markdown(results, args.markdown)


if __name__ == "__main__":
    main()
