"""Group faults: several nodes that began to slow together are one fault, not N.

A rack's cooling loop or power shelf, a leaf switch or a shared NIC slows every node
behind it at once. Node by node, each of them looks like a straggler, and N node
incidents recommending isolation would drain a rack whose nodes are fine (and trip the
actuator's circuit breaker). Nodes whose node-level slowdown findings (straggler,
degradation, intermittent, data stall: the node as a whole, not one of its ranks, found
on ``persist`` steps in a row) *began within a few steps of each other* are one group:
their findings are replaced by one job-level ``"group"`` finding that lists the nodes,
the cause, since when, and recommends investigating the shared part.

Independent faults rarely start within ``window`` steps of each other on
``min_nodes`` nodes; a cluster-wide shift moves every rank alike and is not found by
the peer-relative detectors at all. Once formed, a group stays one while any member
is still found (members are collapsed whether or not all are found in a step); it is
forgotten ``window`` steps after its last member was found. A node that starts to slow
later than ``window`` steps after the group began is a fault of its own.

State is one (first step, last step, steps found) streak per node with a finding, dropped ``window``
steps after its last finding, and the current group: bounded by the job's nodes.

Examples
--------
>>> from detectors.base import Finding
>>> def slow(node, s=0.2):
...     return Finding("straggler", node, None, s, "compute_s", 1.2, 9.0, detail="slow")
>>> g = GroupFaults(window=5, min_nodes=3)
>>> out = []
>>> for step in range(10):
...     found = [slow(n) for n in ("node-8", "node-9", "node-10")] if step >= 3 else []
...     if step >= 4:
...         found.append(slow("node-11", 0.3))  # joins within the window
...     out = g.collapse(found, step)
...     g.learn(found, step)
>>> [(f.signal, f.node, f.score) for f in out]
[('group', None, 0.2)]
>>> out[0].value, out[0].detail.split(": ")[0]
(4.0, '4 nodes slowed together since step 3 (straggler, median 20.0%)')
>>> out[0].detail.split(": ")[1].split(";")[0]
'node-10, node-11, node-8, node-9'
>>> two = GroupFaults(window=5, min_nodes=3)
>>> [f.node for f in two.collapse([slow("a"), slow("b")], 0)]   # two are not a group
['a', 'b']
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from detectors.base import Finding

__all__ = ["GROUP_SIGNALS", "GroupFaults"]

#: Node-level findings that can be symptoms of one shared part.
GROUP_SIGNALS = frozenset({"straggler", "degradation", "intermittent", "data_stall"})
#: Nodes named in a group finding's detail at most (the rest are counted).
MAX_NAMED = 32


class GroupFaults:
    """Which nodes began to slow together, and the one finding that replaces theirs.

    Parameters
    ----------
    window
        Steps within which the nodes' first findings must lie to form one group; also
        how long a node's streak (and the group) outlives its last finding.
    min_nodes
        Nodes needed for a group.
    persist
        Steps a node must be found on (this one included) before it counts: a
        one-step blip of three nodes is no group.
    """

    def __init__(self, window: int = 5, min_nodes: int = 3, persist: int = 2) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window!r}")
        if min_nodes < 2:
            raise ValueError(f"min_nodes must be >= 2, got {min_nodes!r}")
        if persist < 1:
            raise ValueError(f"persist must be >= 1, got {persist!r}")
        self.window = window
        self.min_nodes = min_nodes
        self.persist = persist
        #: node -> (first step, last step, steps) of its current streak of findings
        self._streak: dict[str, tuple[int, int, int]] = {}
        self._members: frozenset[str] = frozenset()
        self._since = -1  #: first step of the group's earliest member
        self._last = -1  #: last step a member was found

    @property
    def members(self) -> frozenset[str]:
        """The nodes of the current group (empty when none)."""
        return self._members

    def _extended(self, node: str, step: int) -> tuple[int, int, int]:
        """``node``'s streak with a finding at ``step`` added (a gap starts a new one)."""
        first, last, seen = self._streak.get(node, (step, step, 0))
        if seen and last < step - 1:
            first, seen = step, 0
        return first, step, seen + 1

    def _group(self, nodes: set[str], step: int) -> tuple[frozenset[str], int]:
        """The group this step: the current one plus nodes that join it, or a new one
        from the nodes whose streaks began within ``window`` of each other."""
        starts: dict[str, int] = {}
        for n in nodes:
            first, _, seen = self._extended(n, step)
            if seen >= self.persist or n in self._members:
                starts[n] = first
        if self._members and step - self._last <= self.window:
            joined = {n for n, s in starts.items() if abs(s - self._since) <= self.window}
            return self._members | frozenset(joined), self._since
        if len(starts) < self.min_nodes:
            return frozenset(), -1
        order = sorted(starts.items(), key=lambda kv: (kv[1], kv[0]))
        begun = np.array([s for _, s in order], dtype=np.int64)
        # the largest set of nodes whose first steps lie within one window
        ends = np.searchsorted(begun, begun + self.window, side="right")
        hi = [int(h) for h in np.atleast_1d(ends)]
        sizes = [h - i for i, h in enumerate(hi)]
        best = int(np.argmax(sizes))
        if sizes[best] < self.min_nodes:
            return frozenset(), -1
        return frozenset(n for n, _ in order[best : hi[best]]), int(begun[best])

    def collapse(
        self, findings: Sequence[Finding], step: int, extra: Sequence[Finding] = ()
    ) -> list[Finding]:
        """``findings`` with the group's members' node-level findings replaced by one
        job-level ``"group"`` finding (unchanged when there is no group). ``extra``
        findings are evidence of a group only (:mod:`detectors.steps.replica`): they
        count towards one and are never returned. Reads state only."""
        nodes = _nodes(findings) | _nodes(extra)
        members, since = self._group(nodes, step)
        if not members:
            return list(findings)
        mine = [f for f in (*findings, *extra) if _counts(f) and f.node in members]
        out = [f for f in findings if not (f.signal in GROUP_SIGNALS and f.node in members)]
        if not mine:
            return out
        found = sorted({f.node for f in mine if f.node is not None})
        score = float(np.median([f.score for f in mine]))
        causes = ", ".join(sorted({f.signal for f in mine}))
        names = sorted(members)
        listed = ", ".join(names[:MAX_NAMED])
        if len(names) > MAX_NAMED:
            listed += f" and {len(names) - MAX_NAMED} more"
        detail = (
            f"{len(names)} nodes slowed together since step {since} ({causes}, median "
            f"{100 * score:.1f}%): {listed}; a shared rack, switch, power shelf or NIC: "
            f"check it before isolating any of them"
        )
        if len(found) < len(names):
            detail = f"{detail} ({len(found)} found this step)"
        out.append(
            Finding(
                "group",
                None,
                None,
                score,
                "nodes_slow_together",
                float(len(names)),
                score,
                detail=detail,
            )
        )
        return out

    def learn(self, findings: Sequence[Finding], step: int, extra: Sequence[Finding] = ()) -> None:
        """Extend the streaks of the nodes found in ``findings`` and ``extra`` (what
        :meth:`collapse` was given) and update the group."""
        nodes = _nodes(findings) | _nodes(extra)
        members, since = self._group(nodes, step)
        for n in nodes:
            self._streak[n] = self._extended(n, step)
        stale = [n for n, (_, last, _) in self._streak.items() if step - last > self.window]
        for n in stale:
            del self._streak[n]
        if members and nodes & members:
            self._members, self._since, self._last = members, since, step
        elif self._members and step - self._last > self.window:
            self._members, self._since, self._last = frozenset(), -1, -1

    def forget(self, nodes: Sequence[str]) -> None:
        """``nodes`` left the job: their streaks and membership go."""
        for n in nodes:
            self._streak.pop(n, None)
        self._members = self._members - frozenset(nodes)


def _counts(f: Finding) -> bool:
    """A node-level finding of a signal a shared part can cause."""
    return f.signal in GROUP_SIGNALS and f.node is not None and f.rank is None


def _nodes(findings: Sequence[Finding]) -> set[str]:
    return {f.node for f in findings if _counts(f) and f.node is not None}
