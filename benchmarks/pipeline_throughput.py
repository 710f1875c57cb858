"""Pipeline throughput and latency: exporter hook, bare consumer, Faust, the worker.

Measures, on a real broker (embedded Tansu unless --bootstrap / STEPGUARD_KAFKA_BOOTSTRAP):

- ``exporter_call_us``: mean cost of one ``StepExporter.record_step`` call;
- ``bare_consumer_msgs_per_s``: aiokafka reading the steps topic, no decoding;
- ``faust_per_event_baseline_per_s``: a Faust agent that only counts events;
- ``worker_rank_steps_per_s``: ``stepguard worker`` scoring a pre-filled steps topic
  (one job of 128 nodes x 8 ranks), measured from its Prometheus counter, faster than
  real time; ``worker_rank_steps_per_s_128k`` the same for one job of 16,384 nodes
  (128k ranks: a real-time job needs 131,072 rank-steps/s at 1 step/s);
- ``latency_p50_s`` / ``latency_p99_s``: 16k ranks (2048 nodes x 8) at 1 step/s in real
  time, wall time at scoring minus the step's end (the worker's latency histogram);
- ``worker_peak_rss_mb``: the worker's peak RSS (VmHWM) over both worker runs.

Targets: >= 50k rank-steps/s per worker; p99 <= 1 s at 16k ranks x 1 step/s; the hook
<= 20 us per call. Writes the section between the ``pipeline_throughput`` markers of
BENCHMARKS.md and, with ``--json PATH``, the numbers as JSON.

    .venv/bin/python benchmarks/pipeline_throughput.py --quick --json /tmp/pt.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import time
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _common import write_section  # noqa: E402

from pipeline.client import StepExporter  # noqa: E402
from pipeline.io.embedded import TansuBroker, free_port  # noqa: E402
from pipeline.io.kafka import create_topics, make_producer, registry_of  # noqa: E402
from pipeline.io.settings import Settings, load_settings  # noqa: E402
from pipeline.io.trust import ephemeral_keys  # noqa: E402
from schemas import RankSample, StepTelemetry, encode  # noqa: E402


def node_message(job: str, node: int, step: int, ts: float, gpus: int = 8) -> bytes:
    samples = tuple(
        RankSample(
            rank=node * gpus + g, local_rank=g, step_time_s=1.0,
            compute_s=0.85 + 0.001 * ((node * 31 + g * 7 + step) % 11),
            comm_wait_s=0.1, data_wait_s=0.01, loss=2.5, grad_norm=1.0,
        )
        for g in range(gpus)
    )  # fmt: skip
    t = datetime.fromtimestamp(ts, UTC)
    return encode(
        StepTelemetry(
            job_id=job, node=f"node-{node:05d}", step=step,
            ts_start=datetime.fromtimestamp(ts - 1.0, UTC), ts_end=t, samples=samples,
        )
    )  # fmt: skip


class NodeMessages:
    """Pre-encoded node messages for the real-time latency run.

    The load generator shares the machine's cores with the broker and the worker;
    building 2,048 pydantic messages a second would take CPU from what is measured
    (on a cluster every node encodes its own). Each node gets one template per value of
    the compute-time pattern, rendered with the step and its times.
    """

    _T = 1_800_000_007.0

    def __init__(self, job: str, nodes: int) -> None:
        end = datetime.fromtimestamp(self._T, UTC).strftime("%Y-%m-%dT%H:%M:%SZ").encode()
        start = datetime.fromtimestamp(self._T - 1, UTC).strftime("%Y-%m-%dT%H:%M:%SZ").encode()
        self.templates = [
            [
                node_message(job, node, k, self._T)
                .replace(b'"step":%d,' % k, b'"step":%(step)d,')
                .replace(start, b"%(start)s")
                .replace(end, b"%(end)s")
                for k in range(11)
            ]
            for node in range(nodes)
        ]

    def render(self, step: int, ts: float) -> list[bytes]:
        """Every node's message for ``step`` ending at ``ts`` (times formatted once)."""
        fmt = "%Y-%m-%dT%H:%M:%S.%fZ"
        args = {
            b"step": step,
            b"start": datetime.fromtimestamp(ts - 1.0, UTC).strftime(fmt).encode(),
            b"end": datetime.fromtimestamp(ts, UTC).strftime(fmt).encode(),
        }
        return [variants[step % 11] % args for variants in self.templates]


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
        record(i >> 3, i & 7, 1.0, 0.85, 0.1, 0.01, local_rank=i & 7, loss=2.5)
    elapsed = time.perf_counter() - t0
    exporter.close(timeout=30)
    return elapsed / calls * 1e6


# -- prefill + bare consumer -----------------------------------------------------------
def prefill(settings: Settings, job: str, nodes: int, steps: int) -> int:
    create_topics(settings)
    producer = make_producer(settings)
    topic = registry_of(settings).name("steps")
    messages = NodeMessages(job, nodes)
    t0 = 1_800_000_000.0
    n = 0
    for step in range(steps):
        for value in messages.render(step, t0 + step):
            producer.send(topic, key=job.encode(), value=value)
            n += 1
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
class WorkerProc:
    def __init__(self, settings: Settings, tmp: Path) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEPGUARD_")} | {
            "STEPGUARD_KAFKA_BOOTSTRAP": settings.kafka_bootstrap,
            "STEPGUARD_BROKER_FLAVOR": settings.broker_flavor,
            "STEPGUARD_TOPIC_PREFIX": settings.topic_prefix,
            "STEPGUARD_CONSUMER_GROUP": settings.consumer_group,
            "STEPGUARD_WORKER_METRICS_PORT": str(self.port),
            "STEPGUARD_WORKER_DATA_DIR": str(tmp / f"w-{settings.consumer_group}"),
            "STEPGUARD_WORKER_SESSION_TIMEOUT_S": "6",
        }
        # the worker signs its alerts and verifies commands: throwaway keys
        keys = ephemeral_keys(settings, "bench", ("worker", "actuator"))
        for name, value in keys.items():
            secret = value.get_secret_value() if hasattr(value, "get_secret_value") else value
            env[f"STEPGUARD_{name.upper()}"] = secret
        self.log = (tmp / f"worker-{settings.consumer_group}.log").open("wb")
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


def bench_worker_throughput(settings: Settings, nodes: int, steps: int, tmp: Path):
    prefill(settings, "bench-job", nodes, steps)
    total = (steps - 2) * nodes * 8  # the last steps wait for a later one to complete
    w = WorkerProc(settings, tmp)
    try:
        t_first = None
        v = 0.0
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            v = w.value("stepguard_worker_rank_steps_total")
            if v > 0 and t_first is None:
                t_first, v_first = time.perf_counter(), v
            if v >= total:
                break
            time.sleep(0.05)
        if t_first is None or v < total:
            raise RuntimeError(f"worker scored {v} of {total} rank-steps")
        rate = (v - v_first) / (time.perf_counter() - t_first)
        return rate, w.peak_rss_mb()
    finally:
        w.stop()


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


def bench_latency(settings: Settings, nodes: int, seconds: int, tmp: Path):
    create_topics(settings)
    w = WorkerProc(settings, tmp)
    producer = make_producer(settings, linger_ms=2)
    topic = registry_of(settings).name("steps")
    job = "latency-job"
    messages = NodeMessages(job, nodes)
    try:
        # warm the worker up (Faust start, group join) before the clock starts
        deadline = time.monotonic() + 120
        step = 0
        while w.value("stepguard_worker_steps_total") < 3 and time.monotonic() < deadline:
            now = time.time()
            for value in messages.render(step, now):
                producer.send(topic, key=job.encode(), value=value)
            producer.flush()
            step += 1
            time.sleep(1.0)
        base = w.scrape()
        t_next = time.monotonic()
        for _ in range(seconds):
            t_next += 1.0
            now = time.time()  # every rank of the synchronous job ends the step now
            for value in messages.render(step, now):
                producer.send(topic, key=job.encode(), value=value)
            producer.flush()
            step += 1
            time.sleep(max(0.0, t_next - time.monotonic()))
        # let the last steps complete (two later steps release them)
        time.sleep(2.5)
        end = w.scrape()
        name = "stepguard_worker_step_latency_seconds"
        text = _diff_hist(base, end, name)
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
    ok = "✅"
    bad = "❌"
    rows = [
        ("worker rank-steps/s (1 worker, 128 nodes x 8 ranks)",
         f"{r['worker_rank_steps_per_s']:,.0f}", ">= 50,000",
         ok if r["worker_rank_steps_per_s"] >= 50_000 else bad),
        ("worker rank-steps/s (1 worker, one job of 16,384 nodes x 8 ranks)",
         f"{r['worker_rank_steps_per_s_128k']:,.0f}", "", ""),
        ("latency p50 at 16k ranks x 1 step/s (s)", f"{r['latency_p50_s']:.3f}", "", ""),
        ("latency p99 at 16k ranks x 1 step/s (s)", f"{r['latency_p99_s']:.3f}", "<= 1.0",
         ok if r["latency_p99_s"] <= 1.0 else bad),
        ("exporter record_step (µs/call)", f"{r['exporter_call_us']:.2f}", "<= 20",
         ok if r["exporter_call_us"] <= 20 else bad),
        ("worker peak RSS (MB)", f"{r['worker_peak_rss_mb']:.0f}", "", ""),
        ("bare aiokafka consumer (msgs/s)", f"{r['bare_consumer_msgs_per_s']:,.0f}", "", ""),
        ("Faust agent, count only (events/s)", f"{r['faust_per_event_baseline_per_s']:,.0f}",
         "", ""),
    ]  # fmt: skip
    body = [
        "## Pipeline throughput (`benchmarks/pipeline_throughput.py`)",
        "",
        f"Run {r['run_at']} on {r['broker']} ({r['mode']}, {os.cpu_count()} CPUs): "
        f"`{r['command']}`. One message = one node's 8 ranks for one step.",
        "",
        "| metric | value | target | |",
        "|---|---|---|---|",
        *[f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows],
        "",
        "Latency is wall time when the worker scores a step minus the step's end time "
        "(every node's message sent at that moment, pre-encoded so the load generator "
        "does not take the worker's CPU); it includes the producer, the broker, Faust, "
        "decoding, step assembly and detection. "
        f"The worker handles {r['worker_rank_steps_per_s'] / 8:,.0f} node messages/s, "
        f"{r['worker_rank_steps_per_s'] / 8 / r['faust_per_event_baseline_per_s']:.2f} x "
        "the events/s of a Faust agent that only counts them on the same broker (stock "
        "asyncio loop; the worker runs on uvloop) "
        f"({r['faust_per_event_baseline_per_s']:,.0f}/s; a bare aiokafka consumer reads "
        f"{r['bare_consumer_msgs_per_s']:,.0f}/s): Faust's per-record machinery, not "
        "detection, sets the pace. A job is one partition, so one worker scores all of a "
        "job: at 128k ranks (16,384 node messages per step) it keeps up with "
        f"{r['worker_rank_steps_per_s_128k'] / 131_072:.2f} steps/s; faster or larger "
        "jobs need more ranks per message (rack-level aggregation), not more workers.",
    ]
    write_section("pipeline_throughput", "\n".join(body), path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: under 3 minutes")
    ap.add_argument("--json", type=Path, help="write the numbers here")
    ap.add_argument("--bootstrap", default=os.environ.get("STEPGUARD_KAFKA_BOOTSTRAP", ""))
    ap.add_argument("--markdown", type=Path, default=ROOT / "BENCHMARKS.md")
    args = ap.parse_args()
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
        results: dict = {"broker": where, "mode": "quick" if args.quick else "full"}
        results["command"] = "python benchmarks/pipeline_throughput.py " + " ".join(sys.argv[1:])
        results["run_at"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
        print("exporter hook ...", flush=True)
        results["exporter_call_us"] = bench_exporter(fresh(base), calls)
        print("worker throughput ...", flush=True)
        s = fresh(base)
        rate, rss1 = bench_worker_throughput(s, 128, steps, tmp)
        results["worker_rank_steps_per_s"] = rate
        print("worker throughput at 128k ranks ...", flush=True)
        big_steps = 8 if args.quick else 30
        rate_big, rss_big = bench_worker_throughput(fresh(base), 16_384, big_steps, tmp)
        results["worker_rank_steps_per_s_128k"] = rate_big
        print("bare consumer and Faust baseline ...", flush=True)
        results["bare_consumer_msgs_per_s"] = bench_bare_consumer(s, 128 * steps)
        results["faust_per_event_baseline_per_s"] = bench_faust(s, 128 * steps, tmp)
        print("latency at 16k ranks x 1 step/s ...", flush=True)
        p50, p99, rss2 = bench_latency(fresh(base), 2048, seconds, tmp)
        results |= {"latency_p50_s": p50, "latency_p99_s": p99}
        results["worker_peak_rss_mb"] = max(rss1, rss2, rss_big)
    finally:
        if broker is not None:
            broker.stop()
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    write_markdown(results, args.markdown)


if __name__ == "__main__":
    main()
