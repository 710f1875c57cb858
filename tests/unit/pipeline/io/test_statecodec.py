"""The state codec: plain data in and out, and nothing in a blob can run code."""

from __future__ import annotations

import enum
import pickle
import struct
import zlib
from collections import OrderedDict, defaultdict
from typing import ClassVar

import msgspec
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from detectors.assembly import StepAssembler
from pipeline.io import statecodec
from pipeline.io.fastdecode import decode_step
from pipeline.io.statecodec import StateFormatError, dumps, loads
from schemas import AlertKind, encode
from tests.clock import day_start
from tests.factories import step_telemetry


def test_values_of_every_kind_round_trip_with_shared_and_cyclic_references():
    shared = [1, 2]
    asm = StepAssembler(lag_steps=4)
    asm.add(step_telemetry())
    cyclic: list = []
    cyclic.append(cyclic)
    dd: defaultdict = defaultdict(list, {"a": [1]})
    value = {
        "shared": (shared, shared),
        "cyclic": cyclic,
        "arrays": [
            np.arange(6, dtype=np.int32).reshape(2, 3),
            np.array(["ab", "c"]),
            np.array(["node-1", None, 3], dtype=object),
            np.array(["x", "y"], dtype=object),
        ],
        "scalars": (np.float64(1.5), np.int64(-3), 2**70, float("inf")),
        "maps": (OrderedDict([("z", 1), ("a", 2)]), dd, {(1, "x"): frozenset({3})}),
        "enum": AlertKind.HANG,
        "when": day_start(),
        "model": step_telemetry(),
        "struct": decode_step(encode(step_telemetry())),
        "assembler": asm,
        "bytes": b"\x00\xff",
    }
    back = loads(dumps(value))
    assert back["shared"][0] is back["shared"][1]
    assert back["cyclic"][0] is back["cyclic"]
    assert back["arrays"][0].tolist() == [[0, 1, 2], [3, 4, 5]]
    assert back["arrays"][0].dtype == np.int32 and back["arrays"][1].tolist() == ["ab", "c"]
    assert [a.dtype for a in back["arrays"][2:]] == [np.dtype(object)] * 2
    assert back["arrays"][2].tolist() == ["node-1", None, 3]
    assert back["arrays"][3].tolist() == ["x", "y"]
    assert [type(x) for x in back["scalars"]] == [np.float64, np.int64, int, float]
    assert back["scalars"][2] == 2**70
    assert list(back["maps"][0]) == ["z", "a"] and back["maps"][1]["new"] == []
    assert back["maps"][2] == {(1, "x"): frozenset({3})}
    assert back["enum"] is AlertKind.HANG and back["when"] == value["when"]
    assert back["model"] == value["model"] and back["struct"] == value["struct"]
    assert back["assembler"].lag_steps == 4
    assert [f.step for f in back["assembler"].flush()] == [5]
    assert (
        dumps(value, level=0) != dumps(value)
        and loads(dumps(value, level=0))["bytes"] == b"\x00\xff"
    )


class _Payload:
    ran: ClassVar[list[str]] = []

    def __reduce__(self):
        return (_Payload.ran.append, ("code ran",))


def _blob(tree: object, *, length: int | None = None, flags: int = 1) -> bytes:
    body = msgspec.msgpack.encode(tree)
    header = struct.pack("<4sBBQ", b"SGST", 1, flags, len(body) if length is None else length)
    return header + (zlib.compress(body) if flags else body)


@pytest.mark.parametrize(
    ("blob", "error"),
    [
        (pickle.dumps(_Payload()), "bad magic"),
        (_blob({"#": "o", "id": 0, "c": "subprocess.Popen", "f": {}}), "not a state class"),
        (_blob({"#": "o", "id": 0, "c": "os.system", "f": {}}), "not a state class"),
        (_blob({"#": "e", "c": "detectors.assembly.StepAssembler", "v": 1}), "not an enum"),
        (_blob({"#": "a", "id": 0, "dt": "|O", "sh": [1], "b": b"\x00" * 8}), "not allowed"),
        (_blob({"#": "a", "id": 0, "dt": "<f8", "sh": [10**6], "b": b"\x00" * 8}), "buffer"),
        (_blob({"#": "r", "id": 7}), "unknown object"),
        (_blob({"#": "x"}), "unknown state tag"),
        (_blob([1, 2]), "untagged list"),
        (_blob({"#": "t", "v": [1]}, length=10**12), "over the limit"),
        (_blob({"#": "t", "v": [1]}, length=3), "does not match"),
        (_blob({"#": "t", "v": [1]}, flags=4), "unknown state flags"),
        (
            _blob(
                {"#": "o", "id": 0, "c": "detectors.assembly.StepAssembler", "f": {"lag steps": 1}}
            ),
            "bad field name",
        ),
    ],
)
def test_hostile_blobs_are_refused_and_run_nothing(blob: bytes, error: str) -> None:
    with pytest.raises(StateFormatError, match=error):
        loads(blob, max_bytes=1 << 20)
    assert _Payload.ran == []


def test_nesting_and_inflation_are_bounded() -> None:
    deep: object = 1
    for _ in range(statecodec.MAX_DEPTH + 5):
        deep = {"#": "t", "v": [deep]}
    with pytest.raises(StateFormatError, match="deeper"):
        loads(_blob(deep))
    bomb = dumps(b"\x00" * (4 << 20))  # compresses to a few kB, inflates to 4 MiB
    assert len(bomb) < 50_000
    with pytest.raises(StateFormatError, match="over the limit"):
        loads(bomb, max_bytes=1 << 20)


class _Local(enum.Enum):
    A = 1


def test_values_that_are_not_state_cannot_be_written() -> None:
    for bad in (lambda: 1, object(), _Local.A, np.array([object()]), defaultdict(lambda: 1)):
        with pytest.raises(StateFormatError):
            dumps(bad)


_plain = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
    | st.binary(),
    lambda children: st.lists(children, max_size=4)
    | st.tuples(children, children)
    | st.dictionaries(st.text(max_size=5), children, max_size=4),
    max_leaves=30,
)  # fmt: skip


@given(_plain)
def test_plain_data_round_trips(value: object) -> None:
    assert loads(dumps(value)) == value


def _raw_blob(body: bytes, *, length: int | None = None) -> bytes:
    header = struct.pack("<4sBBQ", b"SGST", 1, 1, len(body) if length is None else length)
    return header + zlib.compress(body)


@pytest.mark.parametrize(
    "blob",
    [
        # msgpack arrays nested 200,000 deep: msgspec itself raised RecursionError
        _raw_blob(b"\x91" * 200_000 + b"\xc0"),
        _raw_blob(b"\x81\xa1#" * 100_000 + b"\xc0"),  # maps, the same
        # a declared length of 0 inflated without a limit (zlib's max_length 0)
        _raw_blob(b"\x00" * 4096, length=0),
        # values the constructors refuse
        _blob({"#": "ms", "c": "pipeline.io.fastdecode.StepView", "v": {"job_id": 1}}),
        _blob({"#": "m", "c": "schemas.alerts.Evidence", "j": b"{"}),
        _blob({"#": "d", "id": 0, "k": [{"#": "l", "id": 1, "v": []}], "v": [1]}),
        _blob({"#": "s", "id": 0, "v": [{"#": "d", "id": 1, "k": [], "v": []}]}),
        _blob({"#": "dt", "v": 5}),
        _blob({"#": "big", "v": "9" * 10_000}),
        _blob({"#": "n", "dt": "<f8", "b": 3}),
        _blob({"#": "ao", "id": 0, "sh": [2], "v": 7}),
        _blob({"#": "e", "c": "schemas.alerts.Grade", "v": "nope"}),
        _blob({"#": "o", "id": 0, "c": "detectors.assembly.StepAssembler", "f": 3}),
        _blob({"#": "l", "id": "x", "v": []}),
    ],
)
def test_loads_is_total_every_malformed_blob_is_a_state_format_error(blob: bytes) -> None:
    """Issue 22 item 8: a deeply nested msgpack value made ``loads`` raise
    RecursionError (not StateFormatError), and the worker never monitored that job
    again while the entry stayed. Whatever the blob holds, the answer is one error."""
    with pytest.raises(StateFormatError):
        loads(blob, max_bytes=1 << 20)


def _renamed(blob: bytes, names: dict[str, str]) -> bytes:
    """``blob`` with every class name in ``names`` written as its value (a state as an
    older stepguard, whose classes lived elsewhere, wrote it)."""

    def walk(node: object) -> object:
        if isinstance(node, dict):
            out = {k: walk(v) for k, v in node.items()}
            if isinstance(out.get("c"), str):
                out["c"] = names.get(out["c"], out["c"])
            return out
        return [walk(v) for v in node] if isinstance(node, list) else node

    header = statecodec._HEADER
    _, version, flags, _ = header.unpack_from(blob)
    assert flags == 0
    body = msgspec.msgpack.encode(walk(msgspec.msgpack.decode(blob[header.size :])))
    return header.pack(statecodec.MAGIC, version, 0, len(body)) + body


def test_a_state_written_before_a_class_moved_reads_into_the_class_where_it_lives_now():
    """Issue 38 recut the detector families (long steps are a hang rule, NIC flaps a
    step rule, episodes the vocabulary below the families): a worker's snapshot written
    by the release before names the old modules, and a worker upgraded under a running
    job must still resume it, not start the job's baselines over."""
    from detectors.config import DetectorConfig, grade_policies
    from detectors.episodes import EpisodeState, Transition
    from detectors.hang.detector import HangDetector
    from detectors.hang.long_steps import AnnouncedPhases, PeriodicLongSteps
    from detectors.steps.nic_flap import NicWindow

    hang = HangDetector(factor=2.5, min_steps=3)
    for step in range(12):
        hang.learn_step(step, ts=100.0 + step, ts_start=99.5 + step)
    value = {"hang": hang, "nic": NicWindow(window=8), "episode": EpisodeState(grade=1),
             "policies": grade_policies(DetectorConfig()), "edge": Transition.REOPEN}  # fmt: skip
    now = dumps(value, level=0)
    moves = [  # (module now, module in the release before issue 38, its classes)
        ("detectors.hang.long_steps", "detectors.steps.long_steps",
         ("PeriodicLongSteps", "AnnouncedPhases")),
        ("detectors.steps.nic_flap", "detectors.hardware.nic_flap", ("NicWindow",)),
        ("detectors.episodes", "detectors.grading.episodes",
         ("GradePolicy", "Transition", "EpisodeState")),
    ]  # fmt: skip
    before = {f"{new}.{c}": f"{was}.{c}" for new, was, names in moves for c in names}
    old = _renamed(now, before)
    assert old != now and b"detectors.steps.long_steps.PeriodicLongSteps" in old
    assert not any(new.encode() in old for new in before)
    back = loads(old)
    assert type(back["hang"]._periods) is PeriodicLongSteps
    assert type(back["hang"]._phases) is AnnouncedPhases
    assert type(back["nic"]) is NicWindow and type(back["episode"]) is EpisodeState
    assert back["edge"] is Transition.REOPEN and back["episode"].grade == 1
    assert dumps(back, level=0) == now  # as if written today
    # an old name that was not moved is still refused
    with pytest.raises(StateFormatError, match="not a state class"):
        loads(_renamed(now, {"detectors.hang.long_steps.AnnouncedPhases": "detectors.steps.x.A"}))
