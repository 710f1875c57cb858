"""State as data: an explicit, versioned binary format that never runs code.

The worker's per-job state goes to a Faust changelog topic, and the archiver hands
decoded batches between processes through files. Whoever can write there must not be
able to run code in the process that reads it back, so nothing is pickled: state is
written as a tree of plain values (msgpack via msgspec) with numpy arrays as raw
buffers, and read back by constructing only classes from an explicit allowlist of
stepguard's own data modules (:data:`ALLOWED_MODULES`, already imported by the
reader), filling their fields directly: no ``__reduce__``, no ``__setstate__``, no
``__init__``, no import by name.

Format (version 1)::

    b"SGST" | u8 version | u8 flags (1: zlib) | u64 little-endian body length | body
    body = msgpack of the tree; every value that is not None, bool, int64, float, str
    or bytes is a map with a "#" tag: l/t/s/f (list, tuple, set, frozenset), d/od/dd
    (dict, OrderedDict, defaultdict), a (ndarray: dtype, shape, buffer), n (numpy
    scalar), ao (object ndarray: its values), e (enum), o (object of an allowed class),
    m (pydantic model, as JSON,
    validated on load), ms (msgspec struct, converted with validation), dt
    (datetime), big (int beyond 64 bits), r (a reference to an object already read:
    shared and cyclic references survive).

Reading checks every size before allocating: the declared body length against
``max_bytes``, the inflated length against the declared one, every array's buffer
against its dtype and shape; numpy dtypes are limited to plain numbers and strings;
nesting is limited to :data:`MAX_DEPTH`. Anything else is a :class:`StateFormatError`:
:func:`loads` raises nothing else, whatever the blob holds.

Examples
--------
>>> import numpy as np
>>> from detectors.assembly import StepAssembler
>>> asm = StepAssembler(lag_steps=3)
>>> back = loads(dumps({"asm": asm, "x": np.arange(3), "t": (1, "a")}))
>>> type(back["asm"]).__name__, back["asm"].lag_steps, back["x"].tolist(), back["t"]
('StepAssembler', 3, [0, 1, 2], (1, 'a'))
>>> loads(b"\\x80\\x04junk")
Traceback (most recent call last):
...
pipeline.io.statecodec.StateFormatError: not a stepguard state (bad magic)
"""

from __future__ import annotations

import enum
import struct
import sys
import zlib
from collections import OrderedDict, defaultdict
from datetime import datetime
from typing import Any

import msgspec
import numpy as np
from pydantic import BaseModel

from pipeline.io.errors import StepguardError

__all__ = ["ALLOWED_MODULES", "MAX_DEPTH", "MOVED", "StateFormatError", "dumps", "loads"]

MAGIC = b"SGST"
VERSION = 1
_HEADER = struct.Struct("<4sBBQ")
_ZLIB = 1
#: Nesting deeper than this is refused on read.
MAX_DEPTH = 64
#: Packages and modules whose classes a state may contain (classes *defined* there,
#: in a module the reading process has already imported).
ALLOWED_MODULES = (
    "detectors",
    "schemas",
    "detectors.assembly",
    "detectors.job",
    "pipeline.io.fastcolumns",
    "pipeline.io.fastdecode",
    "pipeline.io.fetchcolumns",
    "pipeline.services.archive.rows",
    "pipeline.services.worker.records",
)
#: Classes that moved (the name a state written before the move holds -> where the
#: class lives now): such a state reads into the class as it is now, as if written
#: today. Names only, never an import: the new module must be imported already.
MOVED: dict[str, str] = {
    # issue 38: the detector families recut by what they watch
    "detectors.steps.long_steps.PeriodicLongSteps": "detectors.hang.long_steps.PeriodicLongSteps",
    "detectors.steps.long_steps.AnnouncedPhases": "detectors.hang.long_steps.AnnouncedPhases",
    "detectors.hardware.nic_flap.NicWindow": "detectors.steps.nic_flap.NicWindow",
    "detectors.grading.episodes.GradePolicy": "detectors.episodes.GradePolicy",
    "detectors.grading.episodes.Transition": "detectors.episodes.Transition",
    "detectors.grading.episodes.EpisodeState": "detectors.episodes.EpisodeState",
}
_DTYPE_KINDS = frozenset("biufUS")
_INT64 = (-(2**63), 2**64 - 1)
_FACTORIES: dict[str, Any] = {"dict": dict, "list": list, "set": set, "int": int}


class StateFormatError(StepguardError):
    """A blob is not a readable stepguard state (or a value cannot be written as one)."""


# -- writing -------------------------------------------------------------------------
def dumps(obj: Any, *, level: int = 1) -> bytes:
    """``obj`` as a versioned blob, zlib-compressed at ``level`` (0: not compressed,
    for scratch files where CPU matters more than bytes)."""
    body = msgspec.msgpack.encode(_Encoder().enc(obj))
    if level == 0:
        return _HEADER.pack(MAGIC, VERSION, 0, len(body)) + body
    return _HEADER.pack(MAGIC, VERSION, _ZLIB, len(body)) + zlib.compress(body, level)


class _Encoder:
    def __init__(self) -> None:
        self.memo: dict[int, int] = {}
        self.keep: list[Any] = []  # keeps memoised objects alive while ids are in use

    def _ref(self, x: Any) -> dict[str, Any] | int:
        n = self.memo.get(id(x))
        if n is not None:
            return {"#": "r", "id": n}
        n = self.memo[id(x)] = len(self.memo)
        self.keep.append(x)
        return n

    def enc(self, x: Any) -> Any:
        if isinstance(x, np.generic):  # before float: np.float64 is a float
            _check_dtype(x.dtype)
            return {"#": "n", "dt": x.dtype.str, "b": x.tobytes()}
        if isinstance(x, enum.Enum):  # before str and int: StrEnum is a str
            if _lookup(_name(type(x))) is not type(x):
                raise StateFormatError(f"{_name(type(x))} is not a state class")
            return {"#": "e", "c": _name(type(x)), "v": self.enc(x.value)}
        if x is None or isinstance(x, bool | str | bytes | float):
            return x
        if isinstance(x, int) and not isinstance(x, np.integer):
            return x if _INT64[0] <= x <= _INT64[1] else {"#": "big", "v": str(x)}
        if isinstance(x, np.ndarray):
            ref = self._ref(x)
            if isinstance(ref, dict):
                return ref
            if x.dtype == object:  # strings and the like: values, each encoded
                flat = x.ravel().tolist()
                if all(type(v) is str for v in flat):
                    return {"#": "ao", "id": ref, "sh": list(x.shape), "s": flat}
                return {"#": "ao", "id": ref, "sh": list(x.shape),
                        "v": [self.enc(v) for v in flat]}  # fmt: skip
            arr = np.ascontiguousarray(x)
            _check_dtype(arr.dtype)
            return {"#": "a", "id": ref, "dt": arr.dtype.str, "sh": list(arr.shape),
                    "b": arr.tobytes()}  # fmt: skip
        if isinstance(x, datetime):
            return {"#": "dt", "v": x.isoformat()}
        if isinstance(x, tuple | frozenset):
            tag = "t" if isinstance(x, tuple) else "f"
            return {"#": tag, "v": [self.enc(v) for v in x]}
        if isinstance(x, BaseModel):
            return {"#": "m", "c": _name(type(x)), "j": x.model_dump_json().encode()}
        if isinstance(x, msgspec.Struct):
            return {"#": "ms", "c": _name(type(x)), "v": msgspec.to_builtins(x)}
        if isinstance(x, list | set | dict):
            ref = self._ref(x)
            if isinstance(ref, dict):
                return ref
            if isinstance(x, list | set):
                return {"#": "l" if isinstance(x, list) else "s", "id": ref,
                        "v": [self.enc(v) for v in x]}  # fmt: skip
            out = {"#": "d", "id": ref, "k": [self.enc(k) for k in x],
                   "v": [self.enc(v) for v in x.values()]}  # fmt: skip
            if isinstance(x, defaultdict):
                out["#"], out["fac"] = "dd", _factory_name(x.default_factory)
            elif isinstance(x, OrderedDict):
                out["#"] = "od"
            return out
        return self._object(x)

    def _object(self, x: Any) -> Any:
        cls = type(x)
        if _lookup(_name(cls)) is not cls:
            raise StateFormatError(f"{_name(cls)} is not a state class (ALLOWED_MODULES)")
        ref = self._ref(x)
        if isinstance(ref, dict):
            return ref
        return {"#": "o", "id": ref, "c": _name(cls),
                "f": {k: self.enc(v) for k, v in _fields(x).items()}}  # fmt: skip


def _fields(x: Any) -> dict[str, Any]:
    out: dict[str, Any] = dict(getattr(x, "__dict__", {}))
    for klass in type(x).__mro__:
        for slot in getattr(klass, "__slots__", ()):
            if slot not in ("__dict__", "__weakref__") and hasattr(x, slot):
                out[slot] = getattr(x, slot)
    return out


def _factory_name(factory: Any) -> str | None:
    if factory is None:
        return None
    for name, f in _FACTORIES.items():
        if factory is f:
            return name
    name = _name(factory) if isinstance(factory, type) else ""
    if not name or _lookup(name) is not factory:
        raise StateFormatError(f"defaultdict factory {factory!r} is not a state class")
    return name


# -- reading -------------------------------------------------------------------------
def loads(blob: bytes, *, max_bytes: int = 256 * 1024 * 1024) -> Any:
    """The value of a blob written by :func:`dumps`; :class:`StateFormatError` when it
    is not one (or would inflate beyond ``max_bytes``)."""
    if len(blob) < _HEADER.size or not blob.startswith(MAGIC):
        raise StateFormatError("not a stepguard state (bad magic)")
    _, version, flags, length = _HEADER.unpack_from(blob)
    if version != VERSION:
        raise StateFormatError(f"state format version {version}, this reader knows {VERSION}")
    if flags not in (0, _ZLIB):
        raise StateFormatError(f"unknown state flags {flags}")
    if length > max_bytes:
        raise StateFormatError(f"state body of {length} bytes is over the limit of {max_bytes}")
    body = memoryview(blob)[_HEADER.size :]
    if flags & _ZLIB:
        inflate = zlib.decompressobj()
        try:
            # max_length 0 would mean "no limit": inflate one byte more than declared
            body = memoryview(inflate.decompress(body, length + 1))
        except zlib.error as exc:
            raise StateFormatError(f"state body does not inflate: {exc}") from exc
        if inflate.unconsumed_tail or not inflate.eof:
            raise StateFormatError("state body length does not match its header")
    if len(body) != length:
        raise StateFormatError("state body length does not match its header")
    # Total: whatever the bytes hold (msgpack nested past the interpreter's recursion
    # limit, a value a constructor refuses, a key that cannot be hashed), the answer
    # is a StateFormatError, never another exception that would stop the job's reader.
    try:
        tree = msgspec.msgpack.decode(body)
    except (msgspec.MsgspecError, RecursionError, MemoryError, ValueError) as exc:
        raise StateFormatError(f"state body is not msgpack: {exc!r}"[:500]) from exc
    try:
        return _Decoder().dec(tree, 0)
    except StateFormatError:
        raise
    except Exception as exc:  # any malformed value: RecursionError, msgspec, pydantic
        raise StateFormatError(f"malformed state: {exc!r}"[:500]) from exc


class _Decoder:
    def __init__(self) -> None:
        self.memo: dict[int, Any] = {}

    def _keep(self, node: dict[str, Any], value: Any) -> Any:
        n = node["id"]
        if not isinstance(n, int) or n in self.memo:
            raise StateFormatError(f"bad object id {n!r}")
        self.memo[n] = value
        return value

    def dec(self, node: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise StateFormatError(f"state nested deeper than {MAX_DEPTH}")
        if not isinstance(node, dict):
            if isinstance(node, list):
                raise StateFormatError("untagged list in state")
            return node
        tag, d = node.get("#"), depth + 1
        if tag == "r":
            if node["id"] not in self.memo:
                raise StateFormatError(f"reference to unknown object {node['id']!r}")
            return self.memo[node["id"]]
        if tag in ("l", "s"):
            items = self._keep(node, [] if tag == "l" else set())
            for v in node["v"]:
                items.append(self.dec(v, d)) if tag == "l" else items.add(self.dec(v, d))
            return items
        if tag in ("t", "f"):
            vals = [self.dec(v, d) for v in node["v"]]
            return tuple(vals) if tag == "t" else frozenset(vals)
        if tag in ("d", "od", "dd"):
            return self._mapping(node, tag, d)
        if tag == "a":
            return self._keep(node, _array(node["dt"], node["sh"], node["b"]))
        if tag == "ao":
            return self._keep(node, self._objects(node, d))
        if tag == "n":
            dtype = _dtype(node["dt"])
            if len(node["b"]) != dtype.itemsize:
                raise StateFormatError("numpy scalar of the wrong size")
            return np.frombuffer(node["b"], dtype=dtype)[0]
        if tag == "e":
            cls = _class(node["c"])
            if not issubclass(cls, enum.Enum):
                raise StateFormatError(f"{node['c']} is not an enum")
            return cls(self.dec(node["v"], d))
        if tag == "m":
            cls = _class(node["c"])
            if not issubclass(cls, BaseModel):
                raise StateFormatError(f"{node['c']} is not a message model")
            return cls.model_validate_json(node["j"])
        if tag == "ms":
            cls = _class(node["c"])
            if not issubclass(cls, msgspec.Struct):
                raise StateFormatError(f"{node['c']} is not a struct")
            return msgspec.convert(node["v"], cls)
        if tag == "dt":
            return datetime.fromisoformat(node["v"])
        if tag == "big":
            return int(node["v"])
        if tag == "o":
            return self._object(node, d)
        raise StateFormatError(f"unknown state tag {tag!r}")

    def _objects(self, node: dict[str, Any], d: int) -> np.ndarray:
        """An object array: its values are decoded like any other value."""
        shape = node["sh"]
        if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise StateFormatError(f"bad array shape {shape!r}")
        flat = node["s"] if "s" in node else [self.dec(v, d) for v in node["v"]]
        if not isinstance(flat, list) or len(flat) != int(np.prod(shape, dtype=np.int64)):
            raise StateFormatError("object array values do not match its shape")
        out = np.empty(len(flat), dtype=object)
        out[:] = flat
        return out.reshape(shape)

    def _mapping(self, node: dict[str, Any], tag: str, d: int) -> Any:
        out: Any
        if tag == "dd":
            fac = node["fac"]
            factory = None if fac is None else _FACTORIES.get(fac) or _class(fac)
            out = defaultdict(factory)
        else:
            out = OrderedDict() if tag == "od" else {}
        self._keep(node, out)
        keys, values = node["k"], node["v"]
        if len(keys) != len(values):
            raise StateFormatError("mapping with unequal keys and values")
        for k, v in zip(keys, values, strict=True):
            out[self.dec(k, d)] = self.dec(v, d)
        return out

    def _object(self, node: dict[str, Any], d: int) -> Any:
        cls = _class(node["c"])
        if issubclass(cls, BaseModel | msgspec.Struct | enum.Enum | BaseException):
            raise StateFormatError(f"{node['c']} cannot be read as a plain object")
        obj = object.__new__(cls)
        self._keep(node, obj)
        slots = {s for k in cls.__mro__ for s in getattr(k, "__slots__", ())}
        plain = hasattr(obj, "__dict__")
        for name, value in node["f"].items():
            if not isinstance(name, str) or not name.isidentifier():
                raise StateFormatError(f"bad field name {name!r} of {node['c']}")
            if name in slots:
                object.__setattr__(obj, name, self.dec(value, d))  # slot descriptor only
            elif plain:
                vars(obj)[name] = self.dec(value, d)  # no __setattr__, no descriptors
            else:
                raise StateFormatError(f"{node['c']} has no field {name!r}")
        return obj


def _array(dt: str, shape: Any, buf: bytes) -> np.ndarray:
    dtype = _dtype(dt)
    if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
        raise StateFormatError(f"bad array shape {shape!r}")
    if len(shape) > 32:
        raise StateFormatError("array of more than 32 dimensions")
    if not isinstance(buf, bytes) or int(np.prod(shape, dtype=np.int64)) * dtype.itemsize != len(
        buf
    ):
        raise StateFormatError(f"array buffer does not match {dt} {shape}")
    return np.frombuffer(buf, dtype=dtype).reshape(shape).copy()


def _dtype(dt: Any) -> np.dtype:
    if not isinstance(dt, str) or len(dt) > 16:
        raise StateFormatError(f"bad dtype {dt!r}")
    try:
        dtype = np.dtype(dt)
    except TypeError as exc:
        raise StateFormatError(f"bad dtype {dt!r}") from exc
    _check_dtype(dtype)
    return dtype


def _check_dtype(dtype: np.dtype) -> None:
    if dtype.kind not in _DTYPE_KINDS or dtype.fields is not None or dtype.subdtype is not None:
        raise StateFormatError(f"dtype {dtype.str} is not allowed in a state")


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _class(name: Any) -> type:
    cls = _lookup(MOVED.get(name, name)) if isinstance(name, str) and len(name) <= 300 else None
    if cls is None:
        raise StateFormatError(f"{name!r} is not a state class (ALLOWED_MODULES)")
    return cls


def _allowed_module(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in ALLOWED_MODULES)


def _lookup(name: str) -> type | None:
    """The class ``name`` (module.qualname) if its module is allowed *and already
    imported*: nothing is imported because a blob names it."""
    module, _, qualname = name.rpartition(".")
    while module and module not in sys.modules:  # nested class: Outer.Inner
        module, _, outer = module.rpartition(".")
        qualname = f"{outer}.{qualname}"
    if not module or not _allowed_module(module):
        return None
    value: Any = sys.modules[module]
    for part in qualname.split("."):
        if not part.isidentifier():
            return None
        value = vars(value).get(part)
        if value is None:
            return None
    if isinstance(value, type) and value.__module__ == module and _name(value) == name:
        return value
    return None
