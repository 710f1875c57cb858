"""How to put columns on the wire (issue 40): bytes and decode cost of one rack message
of 64 ranks (8 nodes x 8 GPUs) in three encodings, next to today's version-2 JSON.

- JSON envelope, each column the base64 of its little-endian array (what StepTelemetry
  version 3 is): msgspec decodes the base64 into bytes, numpy wraps them;
- msgpack with each column a ``bin`` (``msgspec.msgpack``);
- Arrow IPC (a stream of one record batch; pyarrow, an optional extra);
- today's version 2 (an object per sample), by ``decode_steps``.

Each decode ends with one numpy array per column. Prints a JSON object (microseconds
per message, bytes per message, and per rank-step); not part of the test run.

    .venv/bin/python benchmarks/columnar_encoding.py
"""

from __future__ import annotations

import base64
import io
import json
import sys
import timeit
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.io.fastdecode import decode_steps
from schemas.columnar import COLUMNS

N = 64
NAMES = ("rank", "local_rank", "dp_group", "pp_stage", "tp_group", "phase", "step_time_s",
         "compute_s", "comm_wait_s", "data_wait_s", "loss", "grad_norm", "node_idx")  # fmt: skip


def columns() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    out = {}
    for name in NAMES:
        dtype = np.dtype(COLUMNS[name][0])
        if dtype.kind == "f":
            out[name] = rng.random(N).astype(dtype)
        elif name == "node_idx":
            out[name] = (np.arange(N) // 8).astype(dtype)
        elif name == "phase":
            out[name] = np.ones(N, dtype=dtype)
        else:
            out[name] = np.arange(N).astype(dtype)
    return out


HEAD = {"schema_version": 3, "job_id": "bench-job", "node": "rack-00000", "step": 123,
        "ts_start": "2026-01-01T00:00:00.123456Z", "ts_end": "2026-01-01T00:00:01.123456Z",
        "run": ""}  # fmt: skip
NODES = [f"node-{i:05d}" for i in range(8)]


class Cols(msgspec.Struct):
    n: int
    nodes: list[str]
    rank: bytes
    local_rank: bytes
    dp_group: bytes
    pp_stage: bytes
    tp_group: bytes
    phase: bytes
    step_time_s: bytes
    compute_s: bytes
    comm_wait_s: bytes
    data_wait_s: bytes
    loss: bytes
    grad_norm: bytes
    node_idx: bytes


class Msg(msgspec.Struct):
    schema_version: int
    job_id: str
    node: str
    step: int
    ts_start: str
    ts_end: str
    run: str
    columns: Cols


def main() -> None:
    cols = columns()
    dtypes = {k: v.dtype for k, v in cols.items()}
    body = {k: v.tobytes() for k, v in cols.items()}
    as_json = json.dumps(HEAD | {"columns": {"n": N, "nodes": NODES} | {
        k: base64.b64encode(v).decode() for k, v in body.items()}}).encode()  # fmt: skip
    as_msgpack = msgspec.msgpack.encode(HEAD | {"columns": {"n": N, "nodes": NODES} | body})
    json_dec, pack_dec = msgspec.json.Decoder(Msg), msgspec.msgpack.Decoder(Msg)

    def arrays(m: Msg) -> list[np.ndarray]:
        return [np.frombuffer(getattr(m.columns, k), dtypes[k]) for k in NAMES]

    out: dict[str, Any] = {}
    cases: dict[str, tuple[Any, int]] = {
        "json_base64": (lambda: arrays(json_dec.decode(as_json)), len(as_json)),
        "msgpack_bin": (lambda: arrays(pack_dec.decode(as_msgpack)), len(as_msgpack)),
    }
    try:
        import pyarrow as pa

        sink = io.BytesIO()
        table = pa.table(cols)
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table)
        ipc, head = sink.getvalue(), json.dumps(HEAD | {"nodes": NODES}).encode()

        def arrow() -> list[np.ndarray]:
            json.loads(head)
            t = pa.ipc.open_stream(ipc).read_all()
            return [t.column(k).to_numpy() for k in NAMES]

        cases["arrow_ipc"] = (arrow, len(ipc) + len(head))
    except ImportError:
        out["arrow_ipc"] = "pyarrow is not installed"
    samples = [
        {"rank": int(i), "local_rank": int(i % 8), "dp_group": 0, "pp_stage": 0, "tp_group": 0,
         "phase": "train", "step_time_s": float(cols["step_time_s"][i]),
         "compute_s": float(cols["compute_s"][i]), "comm_wait_s": float(cols["comm_wait_s"][i]),
         "data_wait_s": float(cols["data_wait_s"][i]), "loss": float(cols["loss"][i]),
         "grad_norm": float(cols["grad_norm"][i]), "node": NODES[i // 8]}
        for i in range(N)
    ]  # fmt: skip
    v2 = json.dumps(HEAD | {"schema_version": 2, "samples": samples}).encode()
    cases["v2_json_today"] = (lambda: decode_steps([v2]), len(v2))
    for name, (fn, size) in cases.items():
        fn()
        us = min(timeit.repeat(fn, number=500, repeat=5)) / 500 * 1e6
        out[name] = {"us_per_message": round(us, 2), "bytes": size,
                     "us_per_rank_step": round(us / N, 3)}  # fmt: skip
    out["numpy"], out["msgspec"] = np.__version__, msgspec.__version__
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
