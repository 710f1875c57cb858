"""Who this process is in the job: job, run, node, rank and parallel groups.

Pure: read from a mapping (torchrun's environment) and plain numbers, no torch, so it
is tested without it. :func:`from_env` is the one place that knows the variables:

==============================  ========================================================
variable                        meaning
==============================  ========================================================
``RANK`` ``WORLD_SIZE``         set by torchrun: the global rank and the world size
``LOCAL_RANK``                  set by torchrun: the rank on this node
``LOCAL_WORLD_SIZE``            set by torchrun: ranks on this node
``GROUP_RANK``                  set by torchrun: this node's index in the job
``TORCHELASTIC_RUN_ID``         set by torchrun (``--rdzv-id``): job id if none given
``TORCHELASTIC_RESTART_COUNT``  set by torchrun: restarts of the elastic agent
``STEPGUARD_JOB_ID``            the job id (``stepguard up --job`` writes it to up.env)
``STEPGUARD_NODES``             the job's node names in node-index order, comma
                                separated (``stepguard-torchrun`` sets it after a swap)
``STEPGUARD_RANKS_PER_NODE``    with ``STEPGUARD_NODES``: emulate nodes on one host
                                (rank r is on node ``r // ranks_per_node``)
``STEPGUARD_NODE``              this node's name (default: the host name)
``STEPGUARD_ATTEMPT``           relaunches so far (``stepguard-torchrun`` sets it)
==============================  ========================================================

Parallel groups. ``dp_group`` is the index of the **data-parallel replica** this rank
belongs to: the set of ranks that together hold one full copy of the model. The
detectors compare ranks that do the same work and remove a replica's common mode
measured on its other nodes, so a wrong replica id hides a straggler:

- plain DDP: every rank holds the whole model, every rank is its own replica:
  ``dp_group = rank`` (the default here; the exporter's bare default 0 would put the
  whole job in one replica);
- FSDP full shard: the same (each rank does the same work on its own data);
- HSDP / tensor or pipeline parallel: the replica is the rank's index in its
  data-parallel process group (``dist.get_rank(dp_pg)``), ``pp_stage`` its index in
  the pipeline group, ``tp_group`` the lowest global rank of its tensor group. Pass
  the groups to :func:`pipeline.client.pytorch.watch` (or plain ints here).

>>> t = from_env({"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
...               "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
...               "STEPGUARD_JOB_ID": "j", "STEPGUARD_NODES": "node-a,node-b"})
>>> t.node, t.rank, t.local_rank, t.dp_group, t.node_index
('node-b', 3, 1, 3, 1)
>>> from_env({"RANK": "3", "WORLD_SIZE": "4", "STEPGUARD_JOB_ID": "j",
...           "STEPGUARD_NODES": "a,b", "STEPGUARD_RANKS_PER_NODE": "2"}).node
'b'
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["Topology", "from_env", "node_names"]


@dataclass(frozen=True, slots=True)
class Topology:
    """One rank's place in the job (see the module docstring for ``dp_group``)."""

    job_id: str
    run: str
    node: str
    rank: int
    local_rank: int
    world_size: int
    local_world_size: int
    node_index: int
    dp_group: int
    pp_stage: int = 0
    tp_group: int = 0
    #: the job's node names in node-index order, when known (``STEPGUARD_NODES``)
    nodes: tuple[str, ...] = ()
    attempt: int = 0

    def __post_init__(self) -> None:
        if not self.job_id:
            raise ValueError("job_id must not be empty (set STEPGUARD_JOB_ID)")
        if not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} outside world size {self.world_size}")
        if not 0 <= self.local_rank < self.local_world_size:
            raise ValueError(
                f"local_rank {self.local_rank} outside local world {self.local_world_size}"
            )

    @property
    def is_job_leader(self) -> bool:
        """Rank 0: sends the job's lifecycle events and listens for its commands."""
        return self.rank == 0

    @property
    def is_node_leader(self) -> bool:
        """Local rank 0: runs the node's aggregator (one producer per node)."""
        return self.local_rank == 0


def node_names(text: str) -> tuple[str, ...]:
    """``"a, b"`` -> ``('a', 'b')``; a name twice is an error.

    >>> node_names("a, b,")
    ('a', 'b')
    """
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if len(set(names)) != len(names):
        raise ValueError(f"a node is named twice in {text!r}")
    return names


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "")
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r} is not an integer") from None


def from_env(
    env: Mapping[str, str],
    *,
    job_id: str | None = None,
    dp_group: int | None = None,
    pp_stage: int = 0,
    tp_group: int = 0,
    hostname: str | None = None,
) -> Topology:
    """The topology torchrun (and ``stepguard-torchrun``) describe in ``env``.

    ``dp_group`` defaults to the rank (plain DDP or FSDP: every rank its own replica).
    """
    rank = _int(env, "RANK", 0)
    world = _int(env, "WORLD_SIZE", 1)
    nodes = node_names(env.get("STEPGUARD_NODES", ""))
    per_node = _int(env, "STEPGUARD_RANKS_PER_NODE", 0)
    if per_node < 0:
        raise ValueError("STEPGUARD_RANKS_PER_NODE must be positive")
    if per_node:  # emulated nodes on one host
        local_rank, local_world, index = rank % per_node, per_node, rank // per_node
    else:
        local_rank = _int(env, "LOCAL_RANK", 0)
        local_world = _int(env, "LOCAL_WORLD_SIZE", 1)
        index = _int(env, "GROUP_RANK", 0)
    if nodes and index >= len(nodes):
        raise ValueError(f"node index {index} but STEPGUARD_NODES names {len(nodes)} nodes")
    node = env.get("STEPGUARD_NODE") or (
        nodes[index] if nodes else hostname or socket.gethostname()
    )
    job = job_id or env.get("STEPGUARD_JOB_ID") or env.get("TORCHELASTIC_RUN_ID", "")
    if job in ("", "none"):  # torchrun's default rdzv id is "none"
        raise ValueError("no job id: set STEPGUARD_JOB_ID or pass job_id")
    attempt = _int(env, "STEPGUARD_ATTEMPT", 0)
    restarts = _int(env, "TORCHELASTIC_RESTART_COUNT", 0)
    run = env.get("STEPGUARD_RUN") or f"{job}-a{attempt}-r{restarts}"
    return Topology(
        job_id=job, run=run, node=node, rank=rank, local_rank=local_rank, world_size=world,
        local_world_size=local_world, node_index=index,
        dp_group=rank if dp_group is None else dp_group, pp_stage=pp_stage,
        tp_group=tp_group, nodes=nodes, attempt=attempt,
    )  # fmt: skip
