"""A small real DDP job (gloo, CPU) for the torch integration tests and the benchmark.

Run under torchrun (``--nproc-per-node 4``, two emulated nodes of two ranks with
``STEPGUARD_RANKS_PER_NODE=2``): an MLP on synthetic data, one thread per rank, a
checkpoint every ``--ckpt-every`` steps (rank 0 writes, every rank resumes from it).
Faults are real work, not sleeps in the step: ``--slow-rank R --slow-from K`` makes rank
R multiply ``--slow-matmuls`` extra matrices in every step from K (a compute
straggler; 12, about +70 % compute: four ranks time-sliced on two busy cores measure
each rank's compute with a spread near 15 %, and 6 matrices, +35 %, was named 2 to
25 steps after its onset, as often past the tests' ten as not);
``--stall-rank R --stall-from K`` makes its data loader wait ``--stall-s`` per batch.
``--hog-rank R --hog-from K`` pins rank R to one CPU and, from step K, a busy-looping
process to the same CPU (a noisy neighbour: R's thread computes no more, it gets less
of its core, so only the waits show it).
``--relaunch-delay-s S`` makes every rank of a relaunched run (``STEPGUARD_ATTEMPT``
past 0) wait S seconds before it joins the process group: a relaunch that takes that
long (a scheduler's queue, a node's boot, a checkpoint's read), not a sleep in a step.
``--plain`` runs the same loop without the integration (the benchmark's baseline).
Each rank writes its figures to ``--out/rank-R.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

HIDDEN = 384


def batches(rank: int, args: argparse.Namespace, start: int):
    """Synthetic batches; the stalled rank's loader is slow from ``stall_from``."""
    import torch

    gen = torch.Generator().manual_seed(1000 + rank)
    step = start
    while True:
        x = torch.randn(args.batch, HIDDEN, generator=gen)
        y = torch.randn(args.batch, HIDDEN, generator=gen)
        if rank == args.stall_rank and step >= args.stall_from:
            time.sleep(args.stall_s)  # the loader's I/O, outside the step's compute
        yield x, y
        step += 1


def placement(rank: int, world: int, per_node: int, cpus: set[int]) -> set[int]:
    """The CPUs rank ``rank`` runs on with ``--pin``: a core of its own where the host has
    one per rank, else its emulated node's share of the cores (a node's ranks share
    that node's CPUs, as on a real host; nodes never share one).

    >>> placement(3, 4, 2, {0, 1}), placement(1, 4, 2, {0, 1}), placement(3, 4, 2, set(range(8)))
    ({1}, {0}, {3})
    """
    ordered = sorted(cpus)
    if len(ordered) >= world:
        return {ordered[rank]}
    nodes = max(world // max(per_node, 1), 1)
    node = min(rank // max(per_node, 1), nodes - 1)
    share = ordered[node * len(ordered) // nodes : (node + 1) * len(ordered) // nodes]
    return set(share) or {ordered[node % len(ordered)]}


def main() -> None:
    # torch inside: pytest imports this file to look for doctests, also without torch
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel

    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-from", type=int, default=0)
    p.add_argument("--slow-matmuls", type=int, default=12)
    p.add_argument("--stall-rank", type=int, default=-1)
    p.add_argument("--stall-from", type=int, default=0)
    p.add_argument("--stall-s", type=float, default=0.2)
    p.add_argument("--hog-rank", type=int, default=-1)
    p.add_argument("--hog-from", type=int, default=0)
    p.add_argument("--pin", action="store_true",
                   help="each rank (and its threads) on its placement's CPUs")  # fmt: skip
    p.add_argument("--relaunch-delay-s", type=float, default=0.0)
    p.add_argument("--plain", action="store_true")
    p.add_argument("--no-hook", action="store_true", help="watch() without the comm hook")
    p.add_argument("--no-commands", action="store_true", help="watch(commands=False)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--warmup", type=int, default=0,
                   help="steps timed apart (the first steps' one-off costs): wall_s and the "
                   "CPU figures count the rest; warmup_s is theirs")  # fmt: skip
    args = p.parse_args()

    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    per_node = int(os.environ.get("STEPGUARD_RANKS_PER_NODE", "0") or world)
    cpus = placement(int(os.environ.get("RANK", "0")), world, per_node, os.sched_getaffinity(0))
    if args.pin:  # before the process group: the backend's threads inherit it
        os.sched_setaffinity(0, cpus)
    if os.environ.get("STEPGUARD_ATTEMPT", "0") not in ("", "0"):
        time.sleep(args.relaunch_delay_s)  # the relaunch's own start-up, before the group
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(HIDDEN, HIDDEN), nn.ReLU()]
    model = DistributedDataParallel(nn.Sequential(*layers))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    args.ckpt_dir.mkdir(parents=True, exist_ok=True)
    ckpt = args.ckpt_dir / "ckpt.pt"
    start = 0
    if ckpt.exists():
        state = torch.load(ckpt, weights_only=True)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"]) + 1

    def save(step: int) -> None:
        if rank == 0:
            tmp = ckpt.with_suffix(".tmp")
            torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                        "step": step}, tmp)  # fmt: skip
            tmp.replace(ckpt)
        dist.barrier()

    extra_a = torch.randn(args.batch, HIDDEN)
    extra_b = torch.randn(HIDDEN, HIDDEN)

    hog: subprocess.Popen[bytes] | None = None
    cpu = min(cpus) if args.pin else max(os.sched_getaffinity(0))
    if rank == args.hog_rank and not args.pin:
        os.sched_setaffinity(0, {cpu})

    def train(step: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        nonlocal hog
        if rank == args.hog_rank and step >= args.hog_from and hog is None:
            spin = (  # busy until killed, or until this rank is gone (never outlives it)
                f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nparent = os.getppid()\n"
                "while os.getppid() == parent:\n    for _ in range(100000): pass"
            )
            hog = subprocess.Popen([sys.executable, "-c", spin])  # no shell: argv only
        if rank == args.slow_rank and step >= args.slow_from:
            for _ in range(args.slow_matmuls):  # real extra work on this rank
                extra_a.copy_(torch.tanh(extra_a @ extra_b))
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    args.out.mkdir(parents=True, exist_ok=True)
    guard = None
    if not args.plain:  # set up before the clock starts: the loop alone is measured
        from pipeline.client.pytorch import watch

        guard = watch(None if args.no_hook else model, checkpoint=save,
                      commands=not args.no_commands)  # fmt: skip
    dist.barrier()
    t0 = time.perf_counter()
    cpu0, main0 = time.process_time(), time.thread_time()
    done, warmup_s = 0, 0.0
    if guard is None:
        data = batches(rank, args, start)
        for step in range(start, args.steps):
            x, y = next(data)
            train(step, x, y)
            if step % args.ckpt_every == args.ckpt_every - 1:
                save(step)
            done += 1
            if done == args.warmup:
                warmup_s, t0 = time.perf_counter() - t0, time.perf_counter()
                cpu0, main0 = time.process_time(), time.thread_time()
    else:
        for step, (x, y) in guard.steps(batches(rank, args, start), start=start, total=args.steps):
            guard.note(loss=train(step, x, y))
            if step % args.ckpt_every == args.ckpt_every - 1:
                guard.checkpoint(step)
            done += 1
            if done == args.warmup:  # before its boundary: every timed step has one
                warmup_s, t0 = time.perf_counter() - t0, time.perf_counter()
                cpu0, main0 = time.process_time(), time.thread_time()
    wall = time.perf_counter() - t0
    if hog is not None:
        hog.kill()
        hog.wait()
    cpu_s = {"cpu_process_s": time.process_time() - cpu0, "cpu_main_s": time.thread_time() - main0}
    figures: dict[str, object] = {}
    if guard is not None:
        stats = guard.close()
        figures = {"record_s": stats.record_s, "record_max_s": stats.record_max_s,
                   "overhead_s": stats.overhead_s, "recorded": stats.steps,
                   "node": guard.topology.node, "run": guard.topology.run,
                   "stopped": guard.stopped is not None}  # fmt: skip
    doc = {"rank": rank, "start": start, "steps": done, "wall_s": wall, "warmup_s": warmup_s,
           "timed_steps": done - min(done, args.warmup), **figures, **cpu_s,
           "attempt": os.environ.get("STEPGUARD_ATTEMPT", "")}  # fmt: skip
    (args.out / f"rank-{rank}-a{doc['attempt'] or 0}.json").write_text(json.dumps(doc))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
