"""``TorchGuard``: a PyTorch training loop watched and steered in about three lines.

::

    from pipeline.client.pytorch import watch

    guard = watch(ddp_model, checkpoint=save)            # save(step) writes a checkpoint
    for step, batch in guard.steps(loader, start=resume_step, total=total_steps):
        loss = loss_fn(ddp_model(batch)); loss.backward(); opt.step(); opt.zero_grad()
    guard.close()                      # the job completed (docs/pytorch.md: epochs)

What it does on every rank:

- learns job, run, node, rank, local rank and the parallel groups from torchrun's
  environment (:mod:`~pipeline.client.pytorch.topology`; ``dp_group`` explained there);
- measures each step: data wait (time in the loader's ``next``), compute (thread CPU
  time on CPU, CUDA events on GPU: :mod:`~pipeline.client.pytorch.clocks`) and exposed
  comm wait (a DDP communication hook around the user's hook or DDP's all-reduce:
  :mod:`~pipeline.client.pytorch.comm`; FSDP and hand-written collectives:
  ``with guard.comm.blocking(): work.wait()``);
- publishes through the existing :class:`~pipeline.client.StepExporter` to the node
  aggregator: local rank 0 runs a :class:`~pipeline.client.aggregator.NodeAggregator` in a
  thread (one producer and one message per node per step), or the node's own
  ``stepguard export-node`` when ``STEPGUARD_NODE_SOCKET`` names its socket;
- sends the job's lifecycle once (rank 0): its start, its checkpoint phases
  (``guard.checkpoint(step)``, ``with guard.phase("eval"):``) and its end;
- obeys commands at the same step boundary on every rank: one
  :class:`~pipeline.client.listener.CommandListener` on rank 0, its commands broadcast
  as JSON bytes over the job's process group: one asynchronous 16-byte broadcast about
  every ``exchange_s`` (1 s) when there are none, collected at a later boundary (no
  extra synchronisation point; rank 0 sets the pace from its step time, so the cost is
  the same for 5 ms and 5 s steps).
  CHECKPOINT calls ``checkpoint(step)`` on every rank; ISOLATE notes the node to swap;
  RESTART and ROLLBACK save a checkpoint, write the relaunch request for
  ``stepguard-torchrun`` and raise :class:`RelaunchRequested` (exit code 75) on every
  rank; STOP ends ``steps()`` (the end is announced as cancelled).

``checkpoint`` is called on every rank (DDP: usually only rank 0 writes; FSDP: every
rank saves its shard); its failure on rank 0 is reported as the command's FAILED result.
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import logging
import os
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from pipeline.client.aggregator import NodeAggregator
from pipeline.client.exporter import StepExporter
from pipeline.client.listener import CommandListener
from pipeline.client.pytorch.clocks import Clock, CudaClock, Reading, ThreadCpuClock
from pipeline.client.pytorch.codec import (
    MAX_EXCHANGE_STEPS,
    decode_commands,
    encode_commands,
    exchange_gap,
)
from pipeline.client.pytorch.comm import CommReading, CommTimer, timed_hook
from pipeline.client.pytorch.relaunch import RELAUNCH_EXIT, RelaunchRequest
from pipeline.client.pytorch.topology import Topology, from_env
from pipeline.io.settings import ClientSettings, load_client_settings
from schemas import Command, CommandKind, CommandStatus, EndReason

__all__ = ["GuardStats", "RelaunchRequested", "TorchGuard", "watch"]

log = logging.getLogger(__name__)


#: :meth:`TorchGuard.close` called without a reason (what it announces depends on how
#: :meth:`TorchGuard.steps` ended)
class _Default(enum.Enum):
    END = "default"


_DEFAULT_END = _Default.END

T = TypeVar("T")
#: ``checkpoint(step)``: save a checkpoint of the state after ``step``
Checkpoint = Callable[[int], object]


class RelaunchRequested(SystemExit):
    """Raised on every rank at the step boundary where a RESTART or ROLLBACK is obeyed;
    the process exits with :data:`~pipeline.client.pytorch.relaunch.RELAUNCH_EXIT`."""

    def __init__(self, request: RelaunchRequest) -> None:
        super().__init__(RELAUNCH_EXIT)
        self.request = request


@dataclass(frozen=True, slots=True)
class GuardStats:
    steps: int  #: steps recorded
    #: seconds the guard itself spent at step boundaries (record, commands broadcast)
    overhead_s: float
    #: seconds spent in ``StepExporter.record_step``
    record_s: float
    record_max_s: float
    commands: int  #: commands obeyed


@dataclass(slots=True)
class _Pending:
    step: int
    step_time_s: float
    compute: Reading
    comm: CommReading
    data_wait_s: float
    ts_end: float
    phase: str
    loss: Any
    grad_norm: Any
    work: dict[str, Any] = field(default_factory=dict)  #: tokens, flops, max_seq_len


def _socket_path(topology: Topology) -> Path:
    """A short per-node, per-run path (AF_UNIX paths are limited to ~107 bytes)."""
    key = f"{topology.job_id}|{topology.node}|{topology.run}".encode()
    return Path(tempfile.gettempdir()) / f"stepguard-{hashlib.sha256(key).hexdigest()[:16]}.sock"


class TorchGuard:
    """The integration (see the module docstring); build it with :func:`watch`.

    Parameters
    ----------
    settings
        Broker and keys (``STEPGUARD_*``).
    topology
        Who this rank is.
    model
        A ``DistributedDataParallel`` model: its comm hook is registered here
        (``comm_hook``/``comm_state``: the user's own hook and state, timed too).
    checkpoint
        ``checkpoint(step)``, called on every rank for CHECKPOINT and before a relaunch.
    commands
        Listen for commands (rank 0); False: watched only (no keys needed).
    exchange_s
        About how often rank 0 shares the commands it read with every rank (seconds);
        a command is obeyed at the boundary of the exchange that carries it.
    clock
        The compute clock (default: CUDA events when CUDA is in use, else thread CPU).
    group
        The process group commands are broadcast over (default: the world).
    env
        The environment (``STEPGUARD_NODE_SOCKET``, ``STEPGUARD_RELAUNCH_FILE``).
    """

    def __init__(
        self,
        settings: ClientSettings,
        topology: Topology,
        *,
        model: torch.nn.Module | None = None,
        comm_hook: Callable[..., Any] | None = None,
        comm_state: object = None,
        checkpoint: Checkpoint | None = None,
        commands: bool = True,
        exchange_s: float = 1.0,
        clock: Clock | None = None,
        group: Any = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        if not 0.0 < exchange_s <= 60.0:
            raise ValueError(f"exchange_s must be in (0, 60] seconds, got {exchange_s!r}")
        env = os.environ if env is None else env
        self.settings, self.topology = settings, topology
        self._checkpoint = checkpoint
        self._group = group
        if clock is None:
            cuda = torch.cuda.is_available() and _uses_cuda(model)
        else:  # the comm timer reads the clock's kind (the model may not be on it yet)
            cuda = isinstance(clock, CudaClock)
        self.clock: Clock = clock or (CudaClock() if cuda else ThreadCpuClock())
        #: exposed comm wait of the current step (``guard.comm.blocking()``)
        self.comm = CommTimer(cuda=cuda)
        self._distributed = dist.is_available() and dist.is_initialized()
        self._relaunch_file = env.get("STEPGUARD_RELAUNCH_FILE") or None
        self._aggregator: NodeAggregator | None = None
        self._agg_thread: threading.Thread | None = None
        # what failed to start here (the node's aggregator on a node's first rank, the
        # command listener on rank 0): every rank must learn of it, not only this one
        problems: list[str] = []
        sock = env.get("STEPGUARD_NODE_SOCKET") or None
        if sock is None:
            sock = str(_socket_path(topology))
            if topology.is_node_leader:
                try:
                    self._start_aggregator(Path(sock))
                except Exception as exc:
                    problems.append(f"the node aggregator: {type(exc).__name__}: {exc}")
        self.listener: CommandListener | None = None
        if commands and topology.is_job_leader:
            try:
                self.listener = CommandListener(settings, topology.job_id).start()
            except Exception as exc:
                problems.append(f"the command listener: {type(exc).__name__}: {exc}")
        self._commands = commands
        self._exchange_s = exchange_s
        #: the step whose boundary collects the exchange in flight (None: the next one)
        self._due: int | None = None
        #: steps from collecting one exchange to collecting the next (rank 0's pace)
        self._gap = 1
        self._started: tuple[int, float] | None = None  # (step, time) of the last start
        problem = self._agree("; ".join(problems))  # also: no rank sends before its
        if problem:  # aggregator is bound
            self._stop_aggregator()
            if self.listener is not None:
                self.listener.close()
            raise RuntimeError(f"stepguard: the job's stepguard did not start: {problem}")
        self.exporter = StepExporter.to_aggregator(
            sock, job_id=topology.job_id, node=topology.node, run=topology.run,
            announce_start=topology.is_job_leader, register_atexit=False, poll_s=0.05,
            max_clock_skew_s=settings.max_clock_skew_s,
        )  # fmt: skip
        if model is not None and hasattr(model, "register_comm_hook"):
            self.register_comm_hook(model, comm_hook, comm_state)
        self._pending: deque[_Pending] = deque()
        self._data_wait = 0.0
        self._fetch_start: float | None = None
        self._last_step: int | None = None  # the step last begun (a wait follows it)
        self._note: dict[str, Any] = {}
        self._phase = "train"
        self._swaps: dict[str, str] = {}
        self._steps = self._commands_done = 0
        self._overhead = self._record_s = self._record_max = 0.0
        self.stopped: Command | None = None
        #: (steps done, total) when :meth:`steps` ran out of data before ``total``
        self.short_of_total: tuple[int, int] | None = None
        self._inflight: tuple[Any, Any, list[Command]] | None = None  # (work, header, local)
        self._closed = False

    # -- setup ---------------------------------------------------------------------------
    def _start_aggregator(self, path: Path) -> None:
        agg = NodeAggregator(self.settings, path, ranks_per_node=self.topology.local_world_size)
        self._aggregator = agg
        self._agg_thread = threading.Thread(target=agg.serve, name="stepguard-node", daemon=True)
        self._agg_thread.start()

    def _stop_aggregator(self) -> None:
        if self._aggregator is not None and self._agg_thread is not None:
            self._aggregator.stop()
            self._agg_thread.join(timeout=15)
            self._aggregator.close()
            self._aggregator = None

    def _agree(self, problem: str) -> str:
        """Every rank's setup problem (``""``: none) on every rank, in rank order with
        the ranks that had it (each text at most 2 KiB), so that every rank's error says
        why whichever rank failed; a barrier too."""
        if not self._distributed:
            return f"rank 0: {problem}" if problem else ""
        device = self._device()
        text = problem.encode()[:2048]
        size = torch.tensor([len(text)], dtype=torch.int64, device=device)
        dist.all_reduce(size, op=dist.ReduceOp.MAX, group=self._group)
        n = int(size.item())
        if n == 0:
            return ""
        mine = torch.zeros(n, dtype=torch.uint8, device=device)
        if text:
            mine[: len(text)] = torch.tensor(list(text), dtype=torch.uint8, device=device)
        every = [torch.zeros_like(mine) for _ in range(dist.get_world_size(self._group))]
        dist.all_gather(every, mine, group=self._group)
        ranks: dict[str, list[int]] = {}  # each distinct problem and who had it
        for rank, buf in enumerate(every):
            said = bytes(buf.cpu().tolist()).rstrip(b"\0").decode(errors="replace")
            if said:
                ranks.setdefault(said, []).append(rank)
        return "; ".join(
            f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {said}"
            for said, rs in ranks.items()
        )

    def _device(self) -> torch.device:
        if dist.get_backend(self._group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _src(self) -> int:
        """The global rank of the group's first rank (commands come from rank 0)."""
        return 0 if self._group is None else int(dist.get_global_rank(self._group, 0))

    def register_comm_hook(
        self, model: Any, hook: Callable[..., Any] | None = None, state: object = None
    ) -> None:
        """Time ``model``'s gradient communication: ``model`` is a
        ``DistributedDataParallel`` without a comm hook yet; ``hook``/``state``: the
        user's own hook and state, timed too (None: DDP's all-reduce over ``state``, the
        process group, None the default one)."""
        model.register_comm_hook(state, timed_hook(self.comm, hook))

    # -- the training loop -------------------------------------------------------------
    def fetching(self, since: float) -> None:
        """The loop starts waiting for its next batch at ``since`` (a
        ``time.perf_counter()``); :meth:`data_wait` ends the wait. On the job's leader a
        wait that lasts as long as a step is said while it lasts (a ``wait`` event,
        :meth:`StepExporter.waiting`), so that a stalled input pipeline is not taken
        for a hung job. :meth:`loader` and the Lightning and Hugging Face callbacks call
        it."""
        if self.topology.is_job_leader:
            wall = time.time() - max(0.0, time.perf_counter() - since)
            self.exporter.waiting(wall, self._last_step)

    def data_wait(self, seconds: float, *, since: float | None = None) -> None:
        """Count ``seconds`` the loop waited for data as the next step's data wait;
        ``since``: the ``time.perf_counter()`` at which the first such wait began (the
        step's wall time starts there). :meth:`loader` calls it for every item."""
        if self._fetch_start is None:
            self._fetch_start = since
        self._data_wait += max(0.0, seconds)
        if self.topology.is_job_leader:
            self.exporter.waiting(None)

    def loader(self, iterable: Iterable[T]) -> Iterator[T]:
        """``iterable`` with the time spent waiting for each item counted as data wait
        of the step that uses it."""
        it = iter(iterable)
        while True:
            t0 = time.perf_counter()
            if self._fetch_start is None:
                self._fetch_start = t0
            self.fetching(t0)
            try:
                item = next(it)
            except StopIteration:
                self.data_wait(0.0)
                return
            self.data_wait(time.perf_counter() - t0, since=t0)
            yield item

    def steps(
        self, iterable: Iterable[T], *, start: int = 0, total: int | None = None
    ) -> Iterator[tuple[int, T]]:
        """``(step, batch)`` from ``start`` until ``total`` steps, the data's end (one
        epoch of a loader) or a STOP; each step is measured, published, and followed by
        the command boundary.

        Steps are numbered globally: for several epochs call it once per epoch with the
        step to go on from (docs/pytorch.md, "Epochs and resumption"). When the data
        ends before ``total``, :meth:`close` without a reason announces no end (the job
        may go on): ``close("completed")`` says training is over.
        """
        step = start
        if total is not None and step >= total:
            return
        self.short_of_total = None
        for batch in self.loader(iterable):
            with self.step(step):
                yield step, batch
            if self.boundary(step):
                return
            step += 1
            if total is not None and step >= total:
                return
        if total is not None and step < total:
            self.short_of_total = (step, total)

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """Measure one step (the lower-level form of :meth:`steps`; then call
        :meth:`boundary`). The step's wall time runs from its data fetch, if it came
        through :meth:`loader`, else from here."""
        t0 = time.perf_counter()
        fetch = self._fetch_start if self._fetch_start is not None else t0
        self._last_step = step
        self.comm.reset()
        self.clock.start()
        yield
        compute = self.clock.stop()
        end = time.perf_counter()
        self._pending.append(_Pending(
            step, end - fetch, compute, self.comm.take(), self._data_wait, time.time(),
            self._phase, self._note.pop("loss", None), self._note.pop("grad_norm", None),
            work={k: self._note.pop(k) for k in _WORK if k in self._note},
        ))  # fmt: skip
        self._data_wait, self._fetch_start = 0.0, None

    def note(
        self,
        *,
        loss: Any = None,
        grad_norm: Any = None,
        tokens: Any = None,
        flops: Any = None,
        max_seq_len: Any = None,
    ) -> None:
        """Attach the step's loss or gradient norm (floats or 0-d tensors: a tensor is
        read when the step is published, after its compute finished), and the work this
        rank did in the step when the loop knows it: ``tokens`` processed (e.g.
        ``attention_mask.sum()``), ``flops``, ``max_seq_len`` of its batch. With work,
        a rank slow only because it got longer sequences is not called a straggler
        (:func:`batch_work` reads them from a batch of token ids). Noted several times
        in one step (its micro-batches), tokens and flops add up and ``max_seq_len``
        keeps the largest."""
        for name, value in (("tokens", tokens), ("flops", flops), ("max_seq_len", max_seq_len)):
            if value is None:
                continue
            new = value.detach() if isinstance(value, torch.Tensor) else value
            old = self._note.get(name)
            if old is None:
                self._note[name] = new
            elif name != "max_seq_len":
                self._note[name] = old + new
            elif isinstance(old, torch.Tensor) or isinstance(new, torch.Tensor):
                self._note[name] = torch.maximum(torch.as_tensor(old), torch.as_tensor(new))
            else:
                self._note[name] = max(old, new)
        if loss is not None:
            self._note["loss"] = loss.detach() if isinstance(loss, torch.Tensor) else loss
        if grad_norm is not None:
            gn = grad_norm
            self._note["grad_norm"] = gn.detach() if isinstance(gn, torch.Tensor) else gn

    def boundary(self, step: int) -> bool:
        """Publish what is measured, then obey, on every rank, the commands rank 0 read
        at the previous boundary. True when the job must stop (STOP); raises
        :class:`RelaunchRequested`.

        The exchange is asynchronous: rank 0 starts broadcasting what it polled, and
        every rank collects it at a later boundary, after the steps' own collectives
        have brought the ranks together, then starts the next. So the guard adds no
        synchronisation point of its own. Exchanges are ``exchange_s`` apart at the
        job's pace (rank 0 puts the number of steps to the next one in each; every rank
        counts the same steps), and a command is obeyed at the boundary that collects
        the exchange carrying it, at the same step on every rank.
        """
        t0 = time.perf_counter()
        self._publish(wait=False)
        due = self._commands and (self._due is None or step >= self._due)
        cmds = self._finish_exchange() if due else []
        self._overhead += time.perf_counter() - t0
        if cmds:
            self._obey(cmds, step)
        if due and self.stopped is None:
            t1 = time.perf_counter()
            self._start_exchange(step)
            self._due = step + self._gap
            self._overhead += time.perf_counter() - t1
        return self.stopped is not None

    # -- publishing ----------------------------------------------------------------------
    def _publish(self, wait: bool) -> None:
        t = self.topology
        while self._pending and (wait or self._pending[0].compute.ready()):
            p = self._pending.popleft()
            comm = p.comm.seconds()
            compute = p.compute.seconds() - (comm if self.clock.includes_comm else 0.0)
            r0 = time.perf_counter()
            self.exporter.record_step(
                p.step, t.rank, step_time_s=p.step_time_s, compute_s=max(0.0, compute),
                comm_wait_s=comm, data_wait_s=p.data_wait_s, local_rank=t.local_rank,
                ts_end=p.ts_end, loss=_float(p.loss), grad_norm=_float(p.grad_norm),
                phase=p.phase, dp_group=t.dp_group, pp_stage=t.pp_stage, tp_group=t.tp_group,
                **{k: _WORK[k](v) for k, v in p.work.items()},
            )  # fmt: skip
            spent = time.perf_counter() - r0
            self._record_s += spent
            self._record_max = max(self._record_max, spent)
            self._steps += 1

    # -- phases --------------------------------------------------------------------------
    @contextlib.contextmanager
    def phase(self, name: str, expected_s: float | None = None) -> Iterator[None]:
        """A long phase (``checkpoint``, ``eval``): announced once (rank 0); steps taken
        inside it are recorded with that phase."""
        previous, self._phase = self._phase, name
        try:
            if self.topology.is_job_leader:
                with self.exporter.phase(name, expected_s):
                    yield
            else:
                yield
        finally:
            self._phase = previous

    def checkpoint(self, step: int) -> str:
        """Save through ``checkpoint(step)`` as a checkpoint phase (every rank); what it
        returns, if a string, is the command's result."""
        if self._checkpoint is None:
            return "no checkpoint function given to watch()"
        with self.phase("checkpoint"):
            said = self._checkpoint(step)
        return said if isinstance(said, str) else f"checkpoint saved at step {step}"

    # -- commands ------------------------------------------------------------------------
    def _start_exchange(self, step: int) -> None:
        local = self.listener.poll_step_boundary(step) if self.listener is not None else []
        if not self._distributed:
            self._inflight = (None, None, local)
            return
        data, gap = b"", 0
        if self.topology.is_job_leader:
            data, now = encode_commands(local), time.perf_counter()
            if self._started is not None:  # the pace since the last start
                gap = exchange_gap(step - self._started[0], now - self._started[1],
                                   self._exchange_s)  # fmt: skip
            self._started = (step, now)
        header = torch.tensor([len(data), gap], dtype=torch.int64, device=self._device())
        work = dist.broadcast(header, src=self._src(), group=self._group, async_op=True)
        self._inflight = (work, header, local)

    def _finish_exchange(self) -> list[Command]:
        if self._inflight is None:
            return []
        work, header, local = self._inflight
        self._inflight = None
        if work is None:
            return local
        work.wait()
        n, gap = (int(v) for v in header.tolist())
        self._gap = max(1, min(MAX_EXCHANGE_STEPS, gap))  # 0: rank 0 had no pace yet
        if n == 0:
            return []
        device = self._device()
        if self.topology.is_job_leader:
            buf = torch.frombuffer(bytearray(encode_commands(local)), dtype=torch.uint8).to(device)
        else:
            buf = torch.empty(n, dtype=torch.uint8, device=device)
        dist.broadcast(buf, src=self._src(), group=self._group)
        return local if self.topology.is_job_leader else decode_commands(bytes(buf.cpu().tolist()))

    def _report(self, cmd: Command, status: CommandStatus, detail: str) -> None:
        if self.listener is not None:
            self.listener.report(cmd, status, detail)

    def _obey(self, cmds: list[Command], step: int) -> None:
        relaunch: list[Command] = []
        saved = False
        for cmd in cmds:
            self._commands_done += 1
            if cmd.kind is CommandKind.CHECKPOINT:
                try:
                    detail = self.checkpoint(step)
                    saved = self._checkpoint is not None
                except Exception as exc:  # reported, the job goes on
                    log.exception("checkpoint for %s failed", cmd.command_id)
                    self._report(cmd, CommandStatus.FAILED, f"{type(exc).__name__}: {exc}")
                    continue
                self._report(cmd, CommandStatus.SUCCEEDED, detail)
            elif cmd.kind is CommandKind.ISOLATE:
                for i, node in enumerate(cmd.targets):
                    self._swaps[node] = cmd.replacements[i] if i < len(cmd.replacements) else ""
                self._report(cmd, CommandStatus.SUCCEEDED, "leaves at the next relaunch: "
                             + ", ".join(f"{n}->{s or 'any spare'}" for n, s in
                                         self._swaps.items()))  # fmt: skip
            elif cmd.kind in (CommandKind.RESTART, CommandKind.ROLLBACK):
                relaunch.append(cmd)
            elif cmd.kind is CommandKind.STOP:
                self.stopped = cmd
                self._report(cmd, CommandStatus.SUCCEEDED, f"stopped after step {step}")
        if relaunch:
            self._relaunch(relaunch, step, saved)

    def _relaunch(self, cmds: list[Command], step: int, saved: bool) -> None:
        for cmd in cmds:
            for i, node in enumerate(cmd.targets):
                self._swaps.setdefault(
                    node, cmd.replacements[i] if i < len(cmd.replacements) else ""
                )
        rollback = [c.checkpoint_step for c in cmds if c.kind is CommandKind.ROLLBACK]
        rollback_to = min((s for s in rollback if s is not None), default=None)
        detail = ""
        if not rollback and not saved:
            try:
                detail = self.checkpoint(step)
            except Exception as exc:
                log.exception("checkpoint before the relaunch failed")
                detail = f"checkpoint failed ({type(exc).__name__}: {exc}), resuming from the last"
        req = RelaunchRequest(
            job_id=self.topology.job_id, run=self.topology.run, step=step,
            exclude=tuple(self._swaps), replacements=tuple(self._swaps.values()),
            rollback_to=rollback_to, command_ids=tuple(c.command_id for c in cmds),
        )  # fmt: skip
        where = ", ".join(f"{n}->{s or 'a spare'}" for n, s in self._swaps.items()) or "no swap"
        if self.topology.is_job_leader:
            if self._relaunch_file:
                Path(self._relaunch_file).write_text(req.to_json())
            else:
                log.warning("no STEPGUARD_RELAUNCH_FILE (not under stepguard-torchrun): "
                            "exiting for a relaunch nobody will do")  # fmt: skip
            text = f"relaunching after step {step} ({where}); {detail or 'checkpoint saved'}"
            for cmd in cmds:
                self._report(cmd, CommandStatus.SUCCEEDED, text)
        self.close(reason=None)  # the job goes on in its next run: no end
        raise RelaunchRequested(req)

    # -- end -----------------------------------------------------------------------------
    def stats(self) -> GuardStats:
        return GuardStats(self._steps, self._overhead, self._record_s, self._record_max,
                          self._commands_done)  # fmt: skip

    def close(self, reason: EndReason | str | _Default | None = _DEFAULT_END) -> GuardStats:
        """Publish what is left, announce the end once (rank 0; a STOP makes it
        cancelled; None: no end), stop the node's aggregator after every rank sent.

        Without a reason the job completed, unless :meth:`steps` ran out of data before
        its ``total`` (one epoch of several?): then no end is announced, with a warning,
        since the job may go on; ``close("completed")`` says it is over."""
        if self._closed:
            return self.stats()
        self._closed = True
        if reason is _DEFAULT_END:
            reason = EndReason.COMPLETED
            if self.short_of_total is not None and self.stopped is None:
                done, total = self.short_of_total
                reason = None
                if self.topology.is_job_leader:
                    log.warning(
                        "stepguard: guard.steps() ran out of data after %d of %d steps; close() "
                        "announces no end (pass close('completed') when training is over; "
                        "epochs: docs/pytorch.md)", done, total,
                    )  # fmt: skip
        if self.stopped is not None and reason is not None:
            reason = EndReason.CANCELLED
        try:
            self._publish(wait=True)
            for cmd in self._finish_exchange():  # read at the last boundary: too late
                self._report(cmd, CommandStatus.FAILED, "the job ended before its next step")
        finally:
            self.exporter.close(reason=reason if self.topology.is_job_leader else None)
            if self._distributed:
                with contextlib.suppress(Exception):  # a broken group must not hide the end
                    dist.barrier(group=self._group)
            self._stop_aggregator()
            if self.listener is not None:
                self.listener.close()
        return self.stats()

    def __enter__(self) -> TorchGuard:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, _tb: object) -> None:
        if isinstance(exc, RelaunchRequested):
            return
        self.close(_DEFAULT_END if exc_type is None else EndReason.FAILED)


def _float(x: Any) -> float | None:
    if x is None:
        return None
    return float(x.item() if isinstance(x, torch.Tensor) else x)


def batch_work(batch: Any) -> dict[str, Any]:
    """The work a batch of token ids holds, for :meth:`TorchGuard.note` (``{}`` when it
    cannot tell): a mapping with a 2-D ``attention_mask`` gives the tokens it marks and
    the longest sequence; else a 2-D ``input_ids`` gives its size and width (padding
    counted). Values stay tensors: they are read when the step is published.

    >>> ids = torch.ones(2, 5, dtype=torch.long)
    >>> mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    >>> {k: int(v) for k, v in batch_work({"input_ids": ids, "attention_mask": mask}).items()}
    {'tokens': 8, 'max_seq_len': 5}
    >>> {k: int(v) for k, v in batch_work({"input_ids": ids}).items()}
    {'tokens': 10, 'max_seq_len': 5}
    >>> batch_work([ids]), batch_work({"x": 1})
    ({}, {})
    """
    if not isinstance(batch, Mapping):
        return {}
    mask = batch.get("attention_mask")
    if isinstance(mask, torch.Tensor) and mask.dim() == 2:
        with torch.no_grad():
            per_row = mask.detach().sum(dim=-1)
            return {"tokens": per_row.sum(), "max_seq_len": per_row.max()}
    ids = batch.get("input_ids")
    if isinstance(ids, torch.Tensor) and ids.dim() == 2:
        return {"tokens": ids.numel(), "max_seq_len": int(ids.shape[-1])}
    return {}


def _count(x: Any) -> int:
    return int(x.item() if isinstance(x, torch.Tensor) else x)


#: The work fields :meth:`Guard.note` takes, each with how its value is read.
_WORK: dict[str, Callable[[Any], Any]] = {"tokens": _count, "flops": _float, "max_seq_len": _count}


def _uses_cuda(model: torch.nn.Module | None) -> bool:
    if model is None:
        return False
    return any(p.is_cuda for p in model.parameters())


def watch(
    model: torch.nn.Module | None = None,
    *,
    checkpoint: Checkpoint | None = None,
    job_id: str | None = None,
    comm_hook: Callable[..., Any] | None = None,
    comm_state: object = None,
    dp_group: int | Any = None,
    pp_group: int | Any = None,
    tp_group: int | Any = None,
    commands: bool = True,
    exchange_s: float = 1.0,
    clock: Clock | None = None,
    settings: ClientSettings | None = None,
    env: Mapping[str, str] | None = None,
) -> TorchGuard:
    """The integration for this rank, from torchrun's environment and ``STEPGUARD_*``.

    ``dp_group``/``pp_group``/``tp_group``: ints, or process groups (the replica is
    this rank's index in its data-parallel group, the stage its index in the pipeline
    group, the tensor group's id its lowest global rank). Default: plain DDP, every
    rank its own replica (``dp_group = rank``), one stage, one tensor group.
    """
    env = os.environ if env is None else env
    settings = settings or load_client_settings(env)
    topology = from_env(
        env, job_id=job_id, dp_group=_group_index(dp_group),
        pp_stage=_group_index(pp_group) or 0, tp_group=_group_id(tp_group),
    )  # fmt: skip
    return TorchGuard(
        settings, topology, model=model, comm_hook=comm_hook, comm_state=comm_state,
        checkpoint=checkpoint, commands=commands, exchange_s=exchange_s, clock=clock, env=env,
    )  # fmt: skip


def _group_index(group: int | Any) -> int | None:
    if group is None or isinstance(group, int):
        return group
    return int(dist.get_rank(group))


def _group_id(group: int | Any) -> int:
    if group is None:
        return 0
    if isinstance(group, int):
        return group
    return int(min(dist.get_process_group_ranks(group)))
