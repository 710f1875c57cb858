"""Archive ingest: telemetry rows/s end to end (broker -> archiver -> ClickHouse) beside
the backend's raw insert rate measured in the same run, on a ClickHouse server and chDB.

    python benchmarks/archive_ingest.py [--quick] [--json PATH] [--clickhouse DSN]
                                        [--kafka HOST:PORT] [--no-write]
                                        [--steps-version 1|2|3]

Without --clickhouse it uses STEPGUARD_TEST_CLICKHOUSE, else measures chDB only.
Without --kafka it starts the embedded Tansu broker. --steps-version: 1 (default) a
node's messages of 8 ranks as rows; 2 a rack aggregator's of 8 nodes (64 ranks) as rows;
3 the same rack messages as columns (what rack aggregators send by default).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from _common import command_line, cores_busy, environment, write_section
from aiokafka import AIOKafkaConsumer

from pipeline.io.embedded import TansuBroker
from pipeline.io.kafka import (
    aiokafka_consumer_config,
    create_topics,
    make_producer,
    publish,
    registry_of,
)
from pipeline.io.settings import load_settings
from pipeline.services.archive import ChdbBackend, ServerBackend, migrate, rows_for
from pipeline.services.archive.archiver import Archiver
from pipeline.services.archive.backend import ArchiveBackend
from pipeline.services.archive.decode_pool import default_decode_processes
from pipeline.services.archive.rows import step_rows
from schemas import RankSample, StepTelemetry, encode

RANKS_PER_NODE = 8
NODES_PER_RACK = 8  # a rack aggregator's message (--steps-version 2 or 3)
REPEATS = 3


def messages(n: int, nodes: int = 64, version: int = 1) -> list[StepTelemetry]:
    """``n`` step messages of a ``nodes``-node job, realistic sizes, one step a second up
    to now (dated from the clock, as every record a service reads): per node (version 1),
    or per rack of :data:`NODES_PER_RACK` nodes, as rows (2) or as columns (3)."""
    per = 1 if version == 1 else NODES_PER_RACK
    senders = nodes // per
    t0 = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=n // senders + 1)
    out = []
    for i in range(n):
        sender, step = i % senders, i // senders
        ts = t0 + timedelta(seconds=step)
        samples = tuple(
            RankSample(
                rank=node * RANKS_PER_NODE + g, local_rank=g, dp_group=node, pp_stage=0,
                step_time_s=0.45, compute_s=0.38 + 0.001 * g, comm_wait_s=0.05,
                data_wait_s=0.02, loss=2.5, grad_norm=1.1,
                node=None if version == 1 else f"node-{node:04d}",
            )
            for node in range(sender * per, sender * per + per)
            for g in range(RANKS_PER_NODE)
        )  # fmt: skip
        name = f"node-{sender:04d}" if version == 1 else f"rack-{sender:03d}"
        out.append(StepTelemetry(schema_version=version, job_id="bench", node=name, step=step,
                                 ts_start=ts, ts_end=ts, samples=samples))  # fmt: skip
    return out


def raw_insert_rate(backend: ArchiveBackend, msgs: list[StepTelemetry], batch: int) -> float:
    """Rows/s of backend.insert alone, from prepared columns (the ceiling): the numpy
    columns ``rows_for`` builds, which is also the archiver's insert path."""
    chunks = [rows_for([(m, 0) for m in msgs[i : i + batch]])["steps"]
              for i in range(0, len(msgs), batch)]  # fmt: skip
    rows = sum(len(c["step"]) for c in chunks)
    t0 = time.perf_counter()
    for cols in chunks:
        backend.insert("steps", cols)
    return rows / (time.perf_counter() - t0)


def decode_rate(values: list[bytes], batch: int) -> float:
    """Rows/s of the archiver's steps decode alone on one core (``step_rows``: bulk
    JSON decode with pydantic's checks, then the steps table's numpy columns)."""
    t0 = time.perf_counter()
    rows = sum(len(step_rows(values[i : i + batch]).row_value)
               for i in range(0, len(values), batch))  # fmt: skip
    return rows / (time.perf_counter() - t0)


#: The steps message as JSONExtract reads it (a probe of "ClickHouse parses the JSON").
_STEP_TUPLE = (
    "Tuple(job_id String, node String, step UInt64, run String, ts_end String, samples "
    "Array(Tuple(rank UInt32, local_rank UInt16, dp_group UInt32, pp_stage UInt32, tp_group "
    "UInt32, phase String, step_time_s Float64, compute_s Float64, comm_wait_s Float64, "
    "data_wait_s Float64, loss Nullable(Float64), grad_norm Nullable(Float64))))"
)


def chdb_parses_rate(chdb: ChdbBackend, values: list[bytes], batch: int) -> float:
    """Rows/s when chDB parses the raw JSON itself (JSONExtract + ARRAY JOIN from an
    Arrow column of the values): no Python decode, and no validation either, so this
    is the ceiling of that design on chDB, not an archive path (18.16 has no
    JSONExtract)."""
    import pyarrow as pa

    db = chdb.database
    sql = (
        f"INSERT INTO {db}.steps (job_id, step, node, run, rank, local_rank, dp_group, "
        "pp_stage, tp_group, phase, step_time_s, compute_s, comm_wait_s, data_wait_s, loss, "
        "grad_norm, ts, ts_ms, ver) SELECT m.1, m.2, m.3, m.4, s.1, s.2, s.3, s.4, s.5, s.6, "
        "s.7, s.8, s.9, s.10, s.11, s.12, toDateTime(t64, 'UTC'), "
        "toUInt64(toUnixTimestamp64Milli(t64)), ver FROM (SELECT JSONExtract(raw, "
        f"'{_STEP_TUPLE}') AS t, tuple(t.job_id, t.step, t.node, t.run) AS m, t.samples AS "
        "samples, parseDateTime64BestEffort(t.ts_end, 3) AS t64, ver "
        "FROM Python(staging)) ARRAY JOIN samples AS s"
    )
    t0 = time.perf_counter()
    rows = 0
    for i in range(0, len(values), batch):
        chunk = values[i : i + batch]
        staging = pa.table(  # noqa: F841 - read by chDB through Python(staging)
            {"raw": pa.array(chunk, type=pa.binary()),
             "ver": pa.array(np.arange(len(chunk), dtype=np.uint64))}
        )  # fmt: skip
        chdb.execute(sql)
        rows += RANKS_PER_NODE * len(chunk)  # version 1: a node's messages
    return rows / (time.perf_counter() - t0)


def consume_rate(settings: Any, n_msgs: int, batch: int, group: str, per_msg: int) -> float:
    """Rows/s of the archiver's consumer alone (aiokafka with the archiver's fetch
    settings, records fetched and dropped), steady state as :func:`archived_rate`."""
    config = aiokafka_consumer_config(settings, group)

    async def run() -> float:
        consumer = AIOKafkaConsumer(registry_of(settings).name("steps"), **config)
        await consumer.start()
        try:
            got = 0
            while got == 0:
                got = sum(map(len, (await consumer.getmany(timeout_ms=500)).values()))
            t1 = time.perf_counter()
            first, idle = got, 0
            while got < n_msgs and idle < 20:
                more = await consumer.getmany(timeout_ms=500, max_records=batch)
                n = sum(map(len, more.values()))
                got, idle = got + n, (idle + 1 if n == 0 else 0)
            return (got - first) * per_msg / (time.perf_counter() - t1)
        finally:
            await consumer.stop()

    return asyncio.run(run())


def publish_all(settings: Any, msgs: list[StepTelemetry]) -> None:
    registry = registry_of(settings)
    create_topics(settings, ["steps", "deadletter"])
    producer = make_producer(settings)
    for m in msgs:
        publish(producer, registry, "steps", m)
    producer.flush()
    producer.close()


def archived_rate(
    settings: Any,
    backend: ArchiveBackend,
    n_msgs: int,
    batch: int,
    group: str,
    decode_processes: int,
    per_msg: int,
) -> tuple[float, float, float | None]:
    """(steady rows/s, seconds to the first batch, cores busy) of a fresh consumer group
    reading the whole topic. Steady is measured from the end of the first batch (group
    join and first fetch excluded) until every row is archived; cores busy is the whole
    machine's (archiver, broker, ClickHouse) over that window."""
    want = n_msgs * per_msg
    archiver = Archiver(settings, backend, topics=["steps"], group_id=group, max_batch=batch,
                        max_wait_s=0.5, decode_processes=decode_processes)  # fmt: skip
    try:
        t0 = time.perf_counter()
        while archiver.poll_batch() == 0 and time.perf_counter() - t0 < 60:
            pass
        archiver.flush()  # the first batch is stored: group join and first fetch are behind
        t1, rows1, cpu1 = time.perf_counter(), archiver.stats.rows, cores_busy()
        idle = 0
        while archiver.stats.fetched < n_msgs and idle < 20:
            idle = idle + 1 if archiver.poll_batch() == 0 else 0
        archiver.flush()  # everything fetched: finish decoding and inserting it
        elapsed, cpu2 = time.perf_counter() - t1, cores_busy()
    finally:
        archiver.close()
    if archiver.stats.rows < want:
        raise SystemExit(f"archived only {archiver.stats.rows} of {want} rows")
    busy = None
    if cpu1 and cpu2 and cpu2[1] > cpu1[1]:
        busy = (cpu2[0] - cpu1[0]) / (cpu2[1] - cpu1[1]) * (os.cpu_count() or 1)
    return (archiver.stats.rows - rows1) / elapsed, t1 - t0, busy


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="40k messages instead of 160k")
    ap.add_argument("--json", type=Path, help="write the figures as JSON here")
    ap.add_argument("--clickhouse", default=os.environ.get("STEPGUARD_TEST_CLICKHOUSE", ""))
    ap.add_argument("--kafka", default=os.environ.get("STEPGUARD_TEST_KAFKA", ""))
    ap.add_argument("--no-write", action="store_true", help="do not touch BENCHMARKS.md")
    ap.add_argument(
        "--decode-processes",
        type=int,
        default=default_decode_processes(),
        help="the archiver's decode processes (default: as `stepguard archiver`)",
    )
    ap.add_argument(
        "--steps-version",
        type=int,
        choices=(1, 2, 3),
        default=1,
        help="1: a node's messages as rows; 2, 3: a rack's, as rows / columns",
    )
    args = ap.parse_args(argv)
    version = args.steps_version
    per_msg = RANKS_PER_NODE * (1 if version == 1 else NODES_PER_RACK)
    n = (40_000 if args.quick else 160_000) * RANKS_PER_NODE // per_msg
    procs = args.decode_processes
    batch = 40_000 // per_msg  # messages per insert: 40k rows
    msgs = messages(n, version=version)
    values = [encode(m) for m in msgs]
    result: dict[str, Any] = {"messages": n, "rows": n * per_msg, "steps_version": version}
    with ExitStack() as stack:
        if args.kafka:
            base = load_settings({}, kafka_bootstrap=args.kafka, broker_flavor="kafka")
        else:
            broker = stack.enter_context(TansuBroker(Path(tempfile.mkdtemp()) / "tansu"))
            base = load_settings({}, kafka_bootstrap=broker.bootstrap, broker_flavor="tansu")
        tag = uuid.uuid4().hex[:8]
        settings = base.model_copy(update={"topic_prefix": f"bench{tag}."})
        publish_all(settings, msgs)  # once: each archived run reads it with a new group
        backends: list[tuple[str, ArchiveBackend]] = []
        chdb = ChdbBackend(Path(tempfile.mkdtemp()) / "chdb", database="bench")
        stack.callback(chdb.close)
        backends.append(("chdb", chdb))
        if args.clickhouse:
            base_dsn = args.clickhouse.rsplit("/", 1)[0]
            server = ServerBackend(f"{base_dsn}/bench_{uuid.uuid4().hex[:8]}", timeout_s=120)
            stack.callback(server.close)
            backends.insert(0, ("server", server))
        for name, backend in backends:
            migrate(backend)
            raws, e2es, inprocs, firsts, decodes, consumes = [], [], [], [], [], []
            parses: list[float] = []
            busies: list[Any] = []  # cores busy per archived run; None off Linux
            for rep in range(REPEATS):  # alternate raw and archived: same conditions
                print(f"[{name}] raw insert of {n * per_msg} rows ...", file=sys.stderr)
                raws.append(raw_insert_rate(backend, msgs, batch))
                backend.execute(f"TRUNCATE TABLE {backend.database}.steps")
                # the archiver's two other stages alone, in the same conditions
                decodes.append(decode_rate(values, batch))
                consumes.append(
                    consume_rate(settings, n, batch, f"bench{tag}.{name}{rep}.c", per_msg)
                )
                if isinstance(backend, ChdbBackend) and version == 1:  # its JSON's shape
                    parses.append(chdb_parses_rate(backend, values, batch))
                    backend.execute(f"TRUNCATE TABLE {backend.database}.steps")
                for decoders, out in ((procs, e2es), (0, inprocs)) if procs else ((0, e2es),):
                    print(f"[{name}] broker -> archiver ({decoders} decoders) -> {name} ...",
                          file=sys.stderr)  # fmt: skip
                    group = f"bench{tag}.{name}{rep}.{decoders}"
                    e2e, first_s, busy = archived_rate(
                        settings, backend, n, batch, group, decoders, per_msg
                    )
                    backend.execute(f"TRUNCATE TABLE {backend.database}.steps")
                    out.append(e2e)
                    if decoders == procs:
                        firsts.append(first_s)
                        busies.append(busy)
            _, ch_version = backend.query("SELECT version()")
            raw, e2e = statistics.median(raws), statistics.median(e2es)
            result[name] = {
                "archived_rows_per_s": round(e2e),
                "raw_insert_rows_per_s": round(raw),
                "decode_only_rows_per_s": round(statistics.median(decodes)),
                "consume_only_rows_per_s": round(statistics.median(consumes)),
                "chdb_parses_rows_per_s": round(statistics.median(parses)) if parses else None,
                "ratio": round(e2e / raw, 3),
                "decode_processes": procs,
                "archived_in_process_rows_per_s": round(statistics.median(inprocs or e2es)),
                "first_batch_s": round(statistics.median(firsts), 2),
                "cores_busy": None if None in busies else round(statistics.median(busies), 2),
                "cpu_us_per_row": None
                if None in busies
                else round(
                    statistics.median([b / x for b, x in zip(busies, e2es, strict=True)]) * 1e6, 2
                ),
                "version": str(ch_version[0][0]),
                "archived_runs": [round(x) for x in e2es],
                "archived_in_process_runs": [round(x) for x in inprocs or e2es],
                "raw_runs": [round(x) for x in raws],
            }
            backend.execute(f"DROP DATABASE IF EXISTS {backend.database}")
            print(f"[{name}] {result[name]}", file=sys.stderr)
    env = environment(
        command_line(),
        ("clickhouse-driver", "chdb", "aiokafka", "kafka-python", "msgspec", "numpy", "pydantic"),
    )
    env["broker"] = "Apache Kafka" if args.kafka else "Tansu (embedded)"
    result["environment"] = env
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "## Archive ingest",
        "",
        f"`{env['command']}` — {env['date']}; {env['machine']}; broker: {env['broker']}; "
        + ", ".join(f"{k} {v}" for k, v in env["versions"].items())
        + ".",
        "",
        f"{n} StepTelemetry messages of version {version}, {per_msg} ranks each "
        f"({n * per_msg} rows), inserts of {batch * per_msg} rows; median of {REPEATS} runs, "
        "raw and archived alternating. Raw = `backend.insert` of prepared numpy columns (the "
        "archiver's insert path); archived = consume (aiokafka) + decode "
        "(`pipeline.io.fastdecode`) + columns + insert + commit, steady state (from the "
        "end of the first batch: the consumer-group join is reported apart). The archiver "
        "runs as `stepguard archiver` does here, with "
        f"{procs} decode process(es) (one per core but one); the in-process column is the "
        "same archiver decoding on its own thread, under the GIL it shares with fetch and "
        "insert. Cores busy: the whole machine's (archiver, broker, ClickHouse) during the "
        f"archived runs, of {os.cpu_count()}; CPU per row = cores busy / archived rows/s, "
        "so cores / CPU per row is the most this machine can archive.",
        "",
        "| backend | version | archived rows/s | raw insert rows/s | archived / raw | "
        "in-process decode rows/s | cores busy | CPU per row (us) | first batch (s) | target |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name in ("server", "chdb"):
        if name in result:
            r = result[name]
            target = ">= 50 % of raw" + (", >= 500k rows/s" if name == "server" else "")
            lines.append(
                f"| {name} | {r['version']} | {r['archived_rows_per_s']:,} | "
                f"{r['raw_insert_rows_per_s']:,} | {r['ratio']:.0%} | "
                f"{r['archived_in_process_rows_per_s']:,} | {r['cores_busy']} | "
                f"{r['cpu_us_per_row']} | {r['first_batch_s']} | {target} |"
            )
    lines += [
        "",
        "Where the time goes: each stage of the archiver alone, in the same run (median "
        "rows/s, and us per row). Consume = aiokafka with the archiver's fetch settings, "
        "records dropped; decode = `step_rows` on one core (msgspec decode with pydantic's "
        "checks, then the table's numpy columns); insert = the raw insert above. The "
        "archiver's main thread consumes and inserts while its decode process(es) decode, "
        "so with cores to spare it archives at most 1 / max(consume + insert, decode / "
        "processes) per row (the bound column); half of raw needs consume + insert and "
        "decode / processes both under 2 / raw.",
        "",
        "| backend | consume rows/s (us/row) | decode rows/s (us/row) | insert rows/s "
        "(us/row) | bound rows/s | bound / raw |",
        "|---|---|---|---|---|---|",
    ]
    for name in ("server", "chdb"):
        if name in result:
            r = result[name]
            c, d, i = (r[k] for k in ("consume_only_rows_per_s", "decode_only_rows_per_s",
                                      "raw_insert_rows_per_s"))  # fmt: skip
            bound = 1 / max(1 / c + 1 / i, 1 / (d * max(procs, 1)))
            r["bound_rows_per_s"] = round(bound)
            lines.append(
                f"| {name} | {c:,} ({1e6 / c:.2f}) | {d:,} ({1e6 / d:.2f}) | {i:,} "
                f"({1e6 / i:.2f}) | {round(bound):,} | {bound / i:.0%} |"
            )
    if result.get("chdb", {}).get("chdb_parses_rows_per_s"):
        r = result["chdb"]
        p = r["chdb_parses_rows_per_s"]
        lines += [
            "",
            f"Probe of the other design, chDB parsing the JSON itself (`JSONExtract` into the "
            f"steps table's types + `ARRAY JOIN`, from an Arrow column of the raw values; no "
            f"Python decode and no validation, so a ceiling, not an archive path): {p:,} "
            f"rows/s, {p / r['raw_insert_rows_per_s']:.0%} of raw insert.",
        ]
    body = "\n".join(lines)
    print(body)
    if not args.no_write:
        write_section("archive_ingest", body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
