"""A simulated synchronous training job, one step at a time, vectorised across ranks.

Timing model (synchronous data/pipeline parallel training)::

    compute_i   = base * rank_i * stage_i * seq_{dp(i), step} * (1 + noise) * faults
    step_time   = max_i(compute_i + data_wait_i) + collective (+ NIC retries, hangs)
    comm_wait_i = step_time - compute_i - data_wait_i

so every rank reports the same wall step time, a slow rank shows high compute and the
least comm wait, and its healthy peers wait for it in the collective.

The job is a small state machine that a closed loop can drive: :meth:`isolate` swaps a
node for a spare, :meth:`checkpoint` requests a save at the next step boundary,
:meth:`restart` / :meth:`rollback` resume from a step. :meth:`goodput` tracks useful
steps against wall time.

Examples
--------
>>> from pipeline.tools.simulator.scenario import Scenario
>>> job = SimulatedJob(Scenario(name="t", nodes=2, steps=3, warmup_steps=0))
>>> ev = job.advance()
>>> ev.frame.n_ranks, ev.frame.step, bool((ev.frame.step_time == ev.frame.step_time[0]).all())
(16, 0, True)
>>> [e.frame.step for e in job.events()]
[1, 2]
>>> job.goodput().useful_steps
3
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from enum import StrEnum

import numpy as np
import numpy.typing as npt

from detectors.frame import PHASE_CODES, StepFrame
from pipeline.io.errors import StepguardError
from pipeline.tools.simulator.hardware import (
    F64,
    XID_DBE,
    _Hardware,
    _NodeHealth,
)
from pipeline.tools.simulator.health_path import HealthClock, HealthPath
from pipeline.tools.simulator.scenario import FaultSpec, Scenario, Shape, node_name
from schemas.telemetry import NodeHealth, Phase
from schemas.truth import FaultKind

__all__ = ["Goodput", "SimEvent", "SimulatedJob", "SimulationError", "simulate"]


class SimulationError(StepguardError):
    """The simulated job was driven into an impossible state (e.g. restart with a
    dead node still in the job)."""


class _Stall(StrEnum):
    HANG = "hang"  #: a step is stuck; it completes when the hang ends
    DEAD = "dead"  #: a node crashed; nothing completes until restart()
    RESTART = "restart"  #: relaunching after restart()


@dataclass(frozen=True, slots=True)
class SimEvent:
    """What the job emitted at event time ``ts``.

    ``frame`` is the step that just completed, or None on a time tick while no step
    completes (hang, crash, restart). ``health`` holds the node reports due now.
    ``step`` is the last completed step (-1 before the first).
    """

    ts: float
    frame: StepFrame | None
    health: list[NodeHealth]
    step: int

    @property
    def stalled(self) -> bool:
        return self.frame is None


@dataclass(frozen=True, slots=True)
class Goodput:
    """Useful progress against wall time."""

    useful_steps: int  #: steps of progress kept (rolled-back steps excluded)
    executed_steps: int  #: every completed step, redone ones included
    wall_s: float
    stalled_s: float  #: time with no step completing (hangs, crashes, restarts)
    ideal_step_s: float

    @property
    def fraction(self) -> float:
        """Useful steps at the ideal step time over the wall time (1.0: perfect)."""
        if self.wall_s <= 0:
            return 0.0
        return self.useful_steps * self.ideal_step_s / self.wall_s


class SimulatedJob(_NodeHealth):
    """One synchronous training job driven by a :class:`Scenario`.

    Call :meth:`advance` for the next :class:`SimEvent` (None at the end) or iterate
    :meth:`events`. Faults are bound to the physical node named at job start: once
    :meth:`isolate` replaces that node, its faults stop.
    """

    def __init__(self, scenario: Scenario) -> None:
        s = scenario
        self.scenario = s
        self._rng = np.random.default_rng(s.seed)
        rng = self._rng
        n_ranks, g = s.n_ranks, s.gpus_per_node
        self.rank = np.arange(n_ranks, dtype=np.int64)
        self.slot = (self.rank // g).astype(np.int32)
        self.local_rank = (self.rank % g).astype(np.int32)
        self.tp_group = (self.rank // s.tp).astype(np.int32)
        self.pp_stage = ((self.rank // s.tp) % s.pp).astype(np.int32)
        self.dp_group = (self.rank // (s.tp * s.pp)).astype(np.int32)
        self.node_names: list[str] = [node_name(i) for i in range(s.nodes)]
        self._slot_of: dict[str, int] = {n: i for i, n in enumerate(self.node_names)}
        self.spare_pool: list[str] = [f"spare-{i:03d}" for i in range(s.spares)]
        self.isolated: list[str] = []
        self._stage_f = np.asarray(s.stage_factors, dtype=np.float64)[self.pp_stage]
        self._static = 1.0 + rng.normal(0.0, s.rank_spread, n_ranks)
        self._hw = _Hardware(
            temp0=rng.normal(62.0, 2.5, n_ranks),
            # a few GPUs see sporadic single-bit errors: a trap for rate detectors
            ecc_bg=np.where(rng.random(n_ranks) < 0.02, rng.uniform(0.01, 0.1, n_ranks), 0.0),
            ecc_corrected=np.zeros(n_ranks, np.int64),
            ecc_uncorrected=np.zeros(n_ranks, np.int64),
            nic_errors=np.zeros(s.nodes, np.int64),
            nic_retransmits=rng.integers(0, 2000, s.nodes).astype(np.int64),
            flaps=np.zeros(s.nodes, np.int64),
            nvl_crc=np.zeros(n_ranks, np.int64),
            nvl_replay=np.zeros(n_ranks, np.int64),
        )
        self._host_alive = np.ones(s.nodes, dtype=bool)
        self._ranks_alive = np.ones(s.nodes, dtype=bool)
        self._util = np.full(n_ranks, 97.0)
        self._has_loss = self.pp_stage == s.pp - 1
        self._has_grad = np.ones(n_ranks, dtype=bool)
        self._nominal = s.nominal_step_s
        self._tick_s = s.tick_fraction * self._nominal
        self._health_every = s.health_interval_steps * self._nominal
        self._clock: HealthClock | None = None  #: health on the nodes' own clocks
        self._path: HealthPath | None = None
        self._counted_to = s.start_ts  #: error counters advanced up to this time
        if s.health_interval_s is not None:
            self._health_every = s.health_interval_s
            self._clock = HealthClock(s.nodes, s.health_interval_s, start=s.start_ts, seed=s.seed)
            self._path = HealthPath(s)
        # Time and progress.
        self.step = 0  #: next step to run
        self.last_step = -1
        self.ts = s.start_ts
        self._next_health = s.start_ts + self._health_every
        self._stall: _Stall | None = None
        self._stall_start = 0.0
        self._stall_until = 0.0
        self._hang_node: str | None = None
        self._hang_carry_s = 0.0  #: length of the hang the next completed step absorbs
        self._hang_start = 0.0
        self._triggered: set[str] = set()
        self._forced_health: set[int] = set()
        self._ckpt_requested = False
        self._done = False
        self.checkpoints: list[int] = []
        self._useful = 0
        self._diverged_cleared: set[str] = set()
        self._executed = 0
        self._stalled_s = 0.0
        self._mask_cache: dict[str, npt.NDArray[np.intp]] = {}

    # -- public control API -----------------------------------------------------------
    @property
    def nominal_step_s(self) -> float:
        return self._nominal

    @property
    def done(self) -> bool:
        return self._done

    @property
    def stalled(self) -> bool:
        """No step can complete now (hang, dead node, relaunch in progress)."""
        return self._stall is not None

    @property
    def stall_kind(self) -> str | None:
        """``hang``, ``dead`` (a node crashed) or ``restart`` while stalled, else None."""
        return None if self._stall is None else self._stall.value

    @property
    def stalled_since(self) -> float | None:
        return None if self._stall is None else self._stall_start

    @property
    def dead_nodes(self) -> list[str]:
        """Nodes whose ranks died (a scheduler sees their processes gone)."""
        return [self.node_names[i] for i in np.flatnonzero(~self._ranks_alive)]

    @property
    def last_checkpoint(self) -> int | None:
        return self.checkpoints[-1] if self.checkpoints else None

    def isolate(self, node: str, replacement: str | None = None) -> str:
        """Take ``node`` out of the job and put ``replacement`` (default: the next
        spare) in its slot; returns the replacement's name.

        In synchronous training a swap needs a relaunch: follow with :meth:`restart`
        (a crashed job does not resume without it).
        """
        if node not in self._slot_of:
            raise SimulationError(f"node {node!r} is not in job {self.scenario.job}")
        if replacement is None:
            if not self.spare_pool:
                raise SimulationError("no spare node left")
            replacement = self.spare_pool.pop(0)
        elif replacement in self._slot_of:
            raise SimulationError(f"replacement {replacement!r} is already in the job")
        elif replacement in self.spare_pool:
            self.spare_pool.remove(replacement)
        slot = self._slot_of.pop(node)
        self.node_names[slot] = replacement
        self._slot_of[replacement] = slot
        self.isolated.append(node)
        ranks = np.flatnonzero(self.slot == slot)
        rng, hw = self._rng, self._hw
        self._static[ranks] = 1.0 + rng.normal(0.0, self.scenario.rank_spread, ranks.size)
        hw.temp0[ranks] = rng.normal(62.0, 2.5, ranks.size)
        hw.ecc_bg[ranks] = 0.0
        hw.ecc_corrected[ranks] = 0
        hw.ecc_uncorrected[ranks] = 0
        hw.nvl_crc[ranks] = 0
        hw.nvl_replay[ranks] = 0
        hw.nic_errors[slot] = 0
        hw.nic_retransmits[slot] = 0
        hw.flaps[slot] = 0
        for r in ranks.tolist():
            hw.xids.pop(r, None)
        self._host_alive[slot] = True
        self._ranks_alive[slot] = True
        self._mask_cache.clear()
        return replacement

    def checkpoint(self) -> None:
        """Save a checkpoint at the next step boundary (that step is a CHECKPOINT)."""
        self._ckpt_requested = True

    def restart(self, from_step: int, cost_s: float | None = None) -> None:
        """Relaunch the job; the first step run afterwards is ``from_step``.

        A checkpoint saved after step ``k`` restarts at ``k + 1``. The relaunch takes
        ``cost_s`` (default the scenario's ``relaunch_s``, else 10 nominal steps)
        during which no step completes.
        Progress beyond ``from_step`` is lost (goodput counts it once).
        """
        if not 0 <= from_step <= self.step:
            raise SimulationError(f"from_step={from_step} outside [0, {self.step}]")
        if not self._ranks_alive.all():
            dead = [self.node_names[i] for i in np.flatnonzero(~self._ranks_alive)]
            raise SimulationError(f"cannot restart with dead node(s) {dead}; isolate them")
        if cost_s is None:
            cost_s = self.scenario.relaunch_s
        cost = 10.0 * self._nominal if cost_s is None else cost_s
        for f in self.scenario.faults:  # resuming from before a divergence: the bad
            if (  # batches are skipped on the way back (what teams do), it does not recur
                f.kind == FaultKind.DIVERGENCE
                and f.onset_step < self.step
                and from_step <= f.onset_step
            ):
                self._diverged_cleared.add(f.fault_id or "")
        self.step = from_step
        self._useful = min(self._useful, from_step)
        self._stall = _Stall.RESTART
        self._stall_start = self.ts
        self._stall_until = self.ts + cost
        self._hang_node = None
        self._hang_carry_s = 0.0
        self._done = False

    def rollback(self, to_step: int, cost_s: float | None = None) -> None:
        """Restart from an earlier checkpoint (e.g. after a loss divergence)."""
        self.restart(to_step, cost_s)

    def goodput(self) -> Goodput:
        useful = self._useful
        for f in self.scenario.faults:  # steps trained on a diverged model are not progress
            cleared = (f.fault_id or "") in self._diverged_cleared
            if f.kind == FaultKind.DIVERGENCE and not cleared and self.step > f.onset_step:
                useful = min(useful, f.onset_step)
        return Goodput(
            useful_steps=useful,
            executed_steps=self._executed,
            wall_s=self.ts - self.scenario.start_ts,
            stalled_s=self._stalled_s,
            ideal_step_s=self._nominal,
        )

    # -- iteration --------------------------------------------------------------------
    def events(self) -> Iterator[SimEvent]:
        while (ev := self.advance()) is not None:
            yield ev

    def advance(self) -> SimEvent | None:
        """The next event, or None when the scenario is over."""
        if self._done:
            return None
        if self._stall is not None:
            return self._tick()
        if self.step >= self.scenario.steps:
            self._done = True
            return None
        if self._start_stall_if_due():
            return self._tick()
        return self._run_step()

    # -- internals --------------------------------------------------------------------
    def _mask(self, f: FaultSpec) -> npt.NDArray[np.intp]:
        """Ranks a node/GPU fault applies to (empty once the node was replaced)."""
        key = f.fault_id or ""
        cached = self._mask_cache.get(key)
        if cached is not None:
            return cached
        if f.kind == FaultKind.STAGE_SLOWDOWN:
            idx = np.flatnonzero(self.pp_stage == (f.stage or 0))
        elif f.kind == FaultKind.GROUP_SLOWDOWN and f.node is not None:
            slots = [self._slot_of.get(node_name(f.node + i)) for i in range(f.group_size or 1)]
            idx = np.flatnonzero(np.isin(self.slot, [s for s in slots if s is not None]))
        elif f.node is None:
            idx = np.arange(self.scenario.n_ranks)
        else:
            slot = self._slot_of.get(node_name(f.node))
            if slot is None:
                idx = np.empty(0, dtype=np.intp)
            else:
                sel = self.slot == slot
                if f.gpu is not None:
                    sel &= self.local_rank == f.gpu
                idx = np.flatnonzero(sel)
        self._mask_cache[key] = idx
        return idx

    def _start_stall_if_due(self) -> bool:
        step = self.step
        for f in self.scenario.faults:
            fid = f.fault_id or ""
            if fid in self._triggered:
                continue
            crashes = f.kind == FaultKind.CRASH or (
                f.kind == FaultKind.ECC_STORM and not f.subsides
            )
            if crashes and step == f.crash_step:
                slot = self._slot_of.get(node_name(f.node or 0))
                if slot is None:  # already replaced
                    continue
                self._triggered.add(fid)
                self._ranks_alive[slot] = False
                if f.kind == FaultKind.CRASH:
                    self._host_alive[slot] = False
                else:
                    rank = int(self._mask(f)[0])
                    self._hw.ecc_uncorrected[rank] += 1
                    self._hw.xids.setdefault(rank, []).append(XID_DBE)
                    self._forced_health.add(slot)
                self._begin_stall(_Stall.DEAD, f.hang_steps * self._nominal)
                return True
            if f.kind == FaultKind.HANG and step == f.onset_step:
                self._triggered.add(fid)
                self._hang_node = node_name(f.node) if f.node is not None else None
                self._begin_stall(_Stall.HANG, (f.duration_steps or 10) * self._nominal)
                return True
        return False

    def _begin_stall(self, kind: _Stall, duration: float) -> None:
        self._stall = kind
        self._stall_start = self.ts
        self._stall_until = self.ts + duration

    def _tick(self) -> SimEvent | None:
        ts = self.ts + self._tick_s
        if ts >= self._stall_until - 1e-6 * self._tick_s:  # no sliver tick from rounding
            ts = self._stall_until
        self._stalled_s += ts - self.ts
        self.ts = ts
        self._util[:] = 100.0 if self._stall != _Stall.RESTART else 0.0
        health = self._due_health()
        if ts >= self._stall_until:
            kind = self._stall
            self._stall = None
            if kind == _Stall.DEAD:
                self._done = True  # nobody restarted the job: it stays dead
            elif kind == _Stall.HANG:
                self._hang_start = self._stall_start
                self._hang_carry_s = self._stall_until - self._stall_start
        return SimEvent(ts=ts, frame=None, health=health, step=self.last_step)

    def _phase(self, step: int) -> Phase:
        s = self.scenario
        if step < s.warmup_steps:
            return Phase.WARMUP
        if self._ckpt_requested or (s.checkpoint_every and (step + 1) % s.checkpoint_every == 0):
            return Phase.CHECKPOINT
        if s.eval_every and (step + 1) % s.eval_every == 0:
            return Phase.EVAL
        return Phase.TRAIN

    def _run_step(self) -> SimEvent:
        s, rng = self.scenario, self._rng
        n = s.n_ranks
        step = self.step
        phase = self._phase(step)

        compute = s.base_compute_s * self._static * self._stage_f
        compute = compute * (1.0 + s.compute_noise * rng.standard_normal(n))
        data = s.data_wait_s * np.exp(0.3 * rng.standard_normal(n))
        collective = s.collective_s * (1.0 + 0.02 * float(rng.standard_normal()))
        extra = 0.0
        if phase == Phase.WARMUP:
            compute *= 1.0 + s.warmup_extra * (1.0 - step / max(1, s.warmup_steps))
        elif phase == Phase.EVAL:
            compute *= s.eval_factor
        tokens = np.ones(n)  # each rank's work this step, relative to a balanced step
        flops_x = np.ones(n)  # its FLOPs per token, relative
        if s.jitter_prob > 0:
            hit = np.flatnonzero(rng.random(n) < s.jitter_prob)
            if hit.size:
                compute[hit] *= 1.0 + rng.uniform(0.1, 0.3, hit.size)

        unseen, skew = np.zeros(n), np.zeros(n)  # busy unseen by compute; waits less
        for f in s.faults:
            if not f.active(step):
                continue
            kind = f.kind
            if kind in (
                FaultKind.STRAGGLER,
                FaultKind.DEGRADATION,
                FaultKind.THERMAL,
                FaultKind.SINGLE_STEP_BLIP,
                FaultKind.CLOCK_THROTTLE,
                FaultKind.INTERMITTENT,
                FaultKind.STAGE_SLOWDOWN,
                FaultKind.GROUP_SLOWDOWN,
            ):
                idx = self._mask(f)
                slow = f.slowdown_at(step)
                if kind == FaultKind.INTERMITTENT and f.every_steps is None:
                    slow = f.magnitude if rng.random() < f.probability else 0.0
                hidden = f.variant == "hidden"  # contention: its compute clock is blind
                unseen[idx] += compute[idx] * (slow if hidden else 0.0)
                compute[idx] *= 1.0 + (0.0 if hidden else slow)
            elif kind == FaultKind.NOISY_NODE and f.variant == "waits":  # by placement
                skew[self._mask(f)] += f.magnitude
            elif kind == FaultKind.NOISY_NODE:
                idx = self._mask(f)
                extra_sd = s.compute_noise * max(0.0, f.magnitude - 1.0)
                compute[idx] *= np.clip(1.0 + extra_sd * rng.standard_normal(idx.size), 0.5, 2.0)
            elif kind == FaultKind.DATA_STALL:
                cycle = f.every_steps or 16
                if f.variant == "bursts" and (step - f.onset_step) % cycle >= (cycle + 1) // 2:
                    continue  # the queue refilled: this step's batch was ready
                idx = self._mask(f)
                data[idx] += f.magnitude * (1.0 + 0.1 * rng.standard_normal(idx.size)).clip(0.5)
            elif kind == FaultKind.NIC_FLAP:
                idx = self._mask(f)
                if idx.size and rng.random() < f.probability:
                    extra += f.magnitude * (0.5 + rng.random())
                    self._hw.flaps[self.slot[idx[0]]] += 1
            elif kind == FaultKind.CLUSTER_SLOWDOWN:
                m = f.magnitude * f.ramp_at(step)
                if (f.variant or "storage") == "storage":
                    data += m * (1.0 + 0.2 * np.abs(rng.standard_normal(n)))
                elif f.variant == "power_cap":
                    compute *= 1.0 / (1.0 - min(m, 0.9))
                else:
                    compute *= 1.0 + m
            elif kind == FaultKind.WORK_IMBALANCE:
                w, per_token = self._work_of(f, step, rng)
                tokens *= w
                flops_x *= per_token
                compute *= w * per_token
            elif kind == FaultKind.STAGE_IMBALANCE and f.variant == "sequence_length":
                seq = np.exp(f.magnitude * rng.standard_normal(s.dp))
                compute *= seq[self.dp_group]
        if phase == Phase.CHECKPOINT:
            saved = len(self.checkpoints)
            grown = (1.0 + s.checkpoint_growth * saved) * s.checkpoint_factor**saved
            compute += s.checkpoint_s * grown * (1.0 + 0.05 * rng.standard_normal(n))

        stall_s = self._hang_carry_s
        if stall_s:  # the hung step finally completes
            if self._hang_node is not None and self._hang_node in self._slot_of:
                compute[self.slot == self._slot_of[self._hang_node]] += stall_s
            else:
                collective += stall_s
        busy = compute + data + unseen
        step_time = float(busy.max()) + collective + extra
        comm = step_time - busy - np.minimum(skew, 1.0) * collective
        loss, grad = self._loss(step, rng)

        start = self._hang_start if stall_s else self.ts
        end = start + step_time
        self.ts = end
        self._hang_carry_s = 0.0
        self._hang_node = None
        self._util = np.clip(100.0 * (compute + 0.8 * comm) / step_time, 0.0, 100.0)
        if phase == Phase.CHECKPOINT:
            self.checkpoints.append(step)
            self._ckpt_requested = False
        frame = StepFrame(
            job_id=s.job,
            step=step,
            ts=end,
            ts_start=start,
            nodes=tuple(self.node_names),
            rank=self.rank,
            node_idx=self.slot,
            local_rank=self.local_rank,
            dp_group=self.dp_group,
            pp_stage=self.pp_stage,
            tp_group=self.tp_group,
            phase=np.full(n, PHASE_CODES[phase], dtype=np.int8),
            step_time=np.full(n, step_time),
            compute=compute,
            comm_wait=comm,
            data_wait=data,
            loss=loss,
            grad_norm=grad,
            has_loss=self._has_loss,
            has_grad_norm=self._has_grad,
            **self._work_columns(tokens, flops_x),
        )
        self.last_step = step
        self.step = step + 1
        self._executed += 1
        self._useful = max(self._useful, self.step)
        return SimEvent(ts=end, frame=frame, health=self._due_health(), step=step)

    def _work_of(self, f: FaultSpec, step: int, rng: np.random.Generator) -> tuple[F64, F64]:
        """A work_imbalance fault's (tokens, FLOPs per token) factors of every rank."""
        s, n = self.scenario, self.scenario.n_ranks
        ones = np.ones(n)
        if f.variant == "stage":
            return ones, np.where(self.pp_stage == f.stage, 1.0 + f.magnitude, 1.0)
        if f.variant == "moe":  # the hot ranks stay hot for a window, then move
            window = (step - f.onset_step) // (f.every_steps or 25)
            pick = np.random.default_rng((s.seed, window)).random(n) < f.probability
            return np.where(pick, 1.0 + f.magnitude, 1.0), ones
        sigma = f.magnitude  # sequence lengths: every replica draws its own each step
        per_replica = np.exp(sigma * rng.standard_normal(s.dp) - sigma * sigma / 2)
        return per_replica[self.dp_group], ones

    def _work_columns(self, tokens: F64, flops_x: F64) -> dict[str, F64]:
        """The frame's work columns, when the job reports work (else none)."""
        s = self.scenario
        if s.work_tokens is None:
            return {}
        said = np.round(tokens * s.work_tokens)
        return {"tokens": said, "flops": said * s.flops_per_token * flops_x}

    def _loss(self, step: int, rng: np.random.Generator) -> tuple[F64, F64]:
        s = self.scenario
        base = s.loss_floor + (s.loss_start - s.loss_floor) * math.exp(-step / s.loss_tau_steps)
        per_dp = base * (1.0 + 0.01 * rng.standard_normal(s.dp))
        g = (1.0 + 2.0 * math.exp(-step / 50.0)) * math.exp(0.1 * float(rng.standard_normal()))
        for f in s.faults:
            if f.kind != FaultKind.DIVERGENCE or step < f.onset_step:
                continue
            if (f.fault_id or "") in self._diverged_cleared:
                continue
            k = step - f.onset_step
            if f.shape != Shape.STEP:  # slow onset: a drift, not a jump
                x = f.ramp_at(step)
                if f.duration_steps is not None and k >= f.duration_steps:
                    per_dp[:] = np.nan
                    g = math.nan
                else:
                    per_dp *= 1.0 + (max(f.magnitude, 1.0) - 1.0) * x
                    g *= 1.0 + 2.0 * x
                continue
            nan_after = f.duration_steps or 10
            if k >= nan_after:
                per_dp[:] = np.nan
                g = math.nan
            else:
                per_dp *= max(f.magnitude, 1.0) * (1.0 + k / nan_after)
                g *= 10.0 ** (1.0 + 3.0 * k / nan_after)
        loss = np.full(s.n_ranks, np.nan)
        loss[self._has_loss] = per_dp[self.dp_group[self._has_loss]]
        return loss, np.full(s.n_ranks, g)


def simulate(scenario: Scenario) -> Iterator[SimEvent]:
    """Run ``scenario`` open loop: every event in event-time order."""
    return SimulatedJob(scenario).events()
