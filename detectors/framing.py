"""Frames and rank checks of messages that are spans of one column block.

A fetch's columnar messages (StepTelemetry version 3) of one job step are decoded
together into a :class:`ColumnBlock`: one array per frame column for all their samples,
each sample's node as an index into the block's ``names``. A message of the block is
a span of it (``block``, ``lo``, ``hi``). Framing such messages (:func:`gathered`)
takes each column once per block, not once per message; the rank checks of the
detection core (:func:`rank_array`, :func:`sample_nodes`, :func:`rank_key`) read the
arrays instead of a Python object per sample. Any other message reads its samples.

>>> import numpy as np
>>> from datetime import UTC, datetime
>>> t = datetime(2026, 1, 1, tzinfo=UTC)
>>> cols = {"rank": np.array([1, 0, 2]), "step_time": np.ones(3)}
>>> b = ColumnBlock(cols, np.array([0, 0, 1], dtype=np.int32), ["n0", "n1"])
>>> class Span:
...     job_id, step, ts_start, ts_end, block = "j", 3, t, t, b
...     def __init__(self, node, lo, hi): self.node, self.lo, self.hi = node, lo, hi
>>> a, c = Span("n0", 0, 2), Span("n1", 2, 3)
>>> rank_array(a).tolist(), sample_nodes(c)[0], rank_key(a) == rank_key(Span("n0", 0, 2))
([1, 0], ['n1'], True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas.sample import OPTIONAL_FIELDS

__all__ = ["ColumnBlock", "gathered", "rank_array", "rank_key", "sample_nodes", "span_of"]

#: the optional numbers of a sample (the work it did, and whatever the schema adds next)
_WORK = OPTIONAL_FIELDS


class ColumnBlock:
    """The samples of some messages of one job step as arrays: ``cols`` by the frame's
    column names (:class:`~detectors.frame.StepFrame`; the work columns NaN where a
    sample did not say), ``node_id`` each sample's node as an index into ``names``.
    Plain data (a snapshot of a job's buffered steps holds it)."""

    __slots__ = ("cols", "names", "node_id")

    def __init__(
        self, cols: dict[str, npt.NDArray[Any]], node_id: npt.NDArray[np.int32], names: list[str]
    ) -> None:
        self.cols = cols
        self.node_id = node_id
        self.names = names


def span_of(msg: Any) -> tuple[ColumnBlock, int, int] | None:
    """``msg``'s block and its samples' range there, or None (it has samples)."""
    block = getattr(msg, "block", None)
    return None if block is None else (block, msg.lo, msg.hi)


def rank_array(msg: Any) -> npt.NDArray[np.int64]:
    """The ranks of ``msg``'s samples, in order."""
    span = span_of(msg)
    if span is not None:
        return span[0].cols["rank"][span[1] : span[2]]
    return np.fromiter((s.rank for s in msg.samples), dtype=np.int64)


def rank_key(msg: Any) -> Any:
    """What tells whether a node reports the ranks it reported last time: the bytes of
    a span's ranks (``rank_bytes`` where its message kept them), else the tuple of its
    samples' ranks (a node that switches between the two is checked once more, never
    waved through)."""
    key = getattr(msg, "rank_bytes", None)  # a span's ranks as its message sent them
    if key is not None:
        return key
    span = span_of(msg)
    if span is not None:
        return span[0].cols["rank"][span[1] : span[2]].tobytes()
    return tuple(s.rank for s in msg.samples)


def sample_nodes(msg: Any) -> tuple[list[str], npt.NDArray[np.intp]]:
    """The nodes ``msg``'s samples name (a sample's own, else the sender), in the order
    they first appear, and each sample's index into that list."""
    span = span_of(msg)
    if span is not None:
        block, lo, hi = span
        ids = block.node_id[lo:hi]
        if hi - lo and ids.min() == ids.max():
            return [block.names[int(ids[0])]], np.zeros(hi - lo, dtype=np.intp)
        moved = ids[1:] != ids[:-1]
        runs = ids[np.concatenate(([True], moved))].tolist() if hi - lo else [0, 0]
        if len(set(runs)) == len(runs):  # each node's samples together (a rack's): no sort
            run_of = np.concatenate(([0], np.cumsum(moved))).astype(np.intp)
            return [block.names[k] for k in runs], run_of
        uniq, first, inv = np.unique(ids, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")
        place = np.empty(order.size, dtype=np.intp)
        place[order] = np.arange(order.size)
        return [block.names[k] for k in uniq[order].tolist()], place[inv]
    seen: dict[str, int] = {}
    where = [seen.setdefault(s.node or msg.node, len(seen)) for s in msg.samples]
    return list(seen), np.asarray(where, dtype=np.intp)


def gathered(messages: Sequence[Any]) -> dict[str, Any] | None:
    """The frame of ``messages`` (one job step, every one a span) as
    :class:`~detectors.frame.StepFrame`'s keyword arguments but the times, or None when
    one is not a span. The samples in message order, each column taken once per block;
    nodes named in the order the samples first name them; a rank sent twice: the
    first message's sample counts (as :meth:`~detectors.frame.StepFrame.from_messages`)."""
    blocks: dict[int, tuple[ColumnBlock, list[int], list[int], list[int]]] = {}
    for pos, m in enumerate(messages):
        block = getattr(m, "block", None)
        if block is None:
            return None
        entry = blocks.get(id(block))
        if entry is None:
            entry = blocks[id(block)] = (block, [], [], [])
        entry[1].append(m.lo)
        entry[2].append(m.hi - m.lo)
        entry[3].append(pos)
    parts: list[dict[str, Any]] = []
    names: list[str] = []
    index: dict[str, int] = {}
    for block, los, lens, where in blocks.values():
        lo, n = np.asarray(los, dtype=np.int64), np.asarray(lens, dtype=np.int64)
        ends = np.cumsum(n)
        if len(los) == 1 or bool((lo[1:] == lo[:-1] + n[:-1]).all()):
            idx: Any = slice(los[0], los[0] + int(ends[-1]))
        else:
            idx = np.arange(int(ends[-1])) + np.repeat(lo - (ends - n), n)
        if isinstance(idx, slice):  # the frame owns its arrays (writable, not the block's)
            part = {k: v[idx].copy() for k, v in block.cols.items()}
        else:
            part = {k: v[idx] for k, v in block.cols.items()}
        if len(blocks) > 1:  # a node is one node whichever blocks name it
            lut = np.array([index.setdefault(k, len(index)) for k in block.names], dtype=np.int32)
            part["node_idx"] = lut[block.node_id[idx]]
            part["_pos"] = np.repeat(np.asarray(where, dtype=np.int64), n)
        else:
            part["node_idx"], names = block.node_id[idx], block.names
        parts.append(part)
    if len(parts) == 1:
        cols = parts[0]
    else:  # the blocks' samples back in message order
        names = list(index)
        cols = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        order = np.argsort(cols.pop("_pos"), kind="stable")
        cols = {k: v[order] for k, v in cols.items()}
    gid = cols["node_idx"]
    uniq, first = np.unique(gid, return_index=True)
    seen = uniq[np.argsort(first, kind="stable")]
    lut = np.zeros(int(uniq[-1]) + 1 if uniq.size else 0, dtype=np.int32)
    lut[seen] = np.arange(seen.size, dtype=np.int32)
    cols["node_idx"] = lut[gid]
    rank = cols["rank"]
    if rank.shape[0] > 1 and not bool((rank[1:] > rank[:-1]).all()):
        keep = np.argsort(rank, kind="stable")
        ranked = rank[keep]
        keep = keep[np.concatenate([[True], ranked[1:] != ranked[:-1]])]  # first counts
        cols = {k: v[keep] for k, v in cols.items()}
    for w in _WORK:
        if bool(np.isnan(cols[w]).all()):
            cols[w] = None
    cols["nodes"] = tuple(names[k] for k in seen.tolist())
    return cols
