"""The job side of stepguard's commands, for the simulated job."""

from __future__ import annotations

from typing import Protocol

from pipeline.tools.simulator.job import SimulatedJob
from schemas import Command, CommandKind, CommandStatus


class Reporter(Protocol):
    """Where results go (a CommandListener); no broker import here."""

    def report(self, cmd: Command, status: CommandStatus, detail: str = "") -> None: ...


__all__ = ["JobController"]


class JobController:
    """Applies commands to a simulated job at step boundaries: what a training
    job's command listener does. Used by the closed-loop demo (commands from the
    broker through CommandListener) and by ``stepguard compare`` (in process).

    RESTARTs wait for a requested checkpoint to be saved, so a node is replaced at
    the next checkpoint boundary and no progress is lost.
    """

    def __init__(self, job: SimulatedJob, listener: Reporter | None = None) -> None:
        self.job = job
        self.listener = listener
        self.applied: list[tuple[int, str, str]] = []
        self._restarts: list[Command] = []
        self.relaunches = 0
        self._ckpt_after: int | None = None  # checkpoints saved when one was requested

    def _resume_step(self, cmd: Command) -> int:
        saved = [
            c for c in self.job.checkpoints
            if cmd.checkpoint_step is None or c <= cmd.checkpoint_step
        ]  # fmt: skip
        return min(saved[-1] + 1 if saved else 0, self.job.step)

    def _swap(self, cmd: Command) -> list[str]:
        done = []
        for i, node in enumerate(cmd.targets):
            if node in self.job.node_names:
                spare = cmd.replacements[i] if i < len(cmd.replacements) else None
                done.append(f"{node}->{self.job.isolate(node, spare)}")
        return done

    def checkpoint(self, cmd: Command, step: int) -> str:
        self.job.checkpoint()
        self._ckpt_after = len(self.job.checkpoints)
        self.applied.append((step, "checkpoint", ""))
        return f"checkpoint requested at step {step}"

    def queue(self, commands: list[Command]) -> None:
        """RESTARTs wait for a requested checkpoint to be saved (replace a node at the
        next checkpoint boundary), then run and are reported."""
        relaunch = (CommandKind.RESTART, CommandKind.ROLLBACK)
        self._restarts += [c for c in commands if c.kind in relaunch]

    def restart_due(self) -> bool:
        """Queued RESTARTs whose requested checkpoint is saved (or cannot be: stalled)."""
        saving = self._ckpt_after is not None and len(self.job.checkpoints) <= self._ckpt_after
        return bool(self._restarts) and (not saving or self.job.stalled)

    def at_boundary(self) -> bool:
        """Run the queued RESTARTs if their checkpoint is saved; True if it relaunched."""
        if not self.restart_due():
            return False
        self._ckpt_after = None
        first, *rest = sorted(  # a rollback goes furthest back: it serves a restart too
            self._restarts, key=lambda c: c.kind is not CommandKind.ROLLBACK
        )
        for cmd in rest:  # several episodes asked for a relaunch: one relaunch serves all
            self._swap(cmd)
        if first.kind is CommandKind.ROLLBACK:
            detail = self.rollback(first, self.job.step)
        else:
            detail = self.restart(first, self.job.step)
        if self.listener is not None:
            for cmd in self._restarts:
                self.listener.report(cmd, CommandStatus.SUCCEEDED, detail)
        self._restarts.clear()
        return True

    def isolate(self, cmd: Command, step: int) -> str:
        done = self._swap(cmd)
        self.applied.append((step, "isolate", ",".join(done)))
        return "isolated " + (", ".join(done) or "nothing (already out)")

    def _relaunch_hosts(self) -> str:
        """A relaunch cannot use hosts that died: the launcher swaps them for spares,
        as a scheduler does (the command may not name them: a job-wide hang)."""
        swapped = []
        for node in self.job.dead_nodes:
            if self.job.spare_pool:
                swapped.append(f"{node}->{self.job.isolate(node)}")
        return f", dead hosts replaced {', '.join(swapped)}" if swapped else ""

    def restart(self, cmd: Command, step: int) -> str:
        self.relaunches += 1
        done = self._swap(cmd)
        hosts = self._relaunch_hosts()
        resume = self._resume_step(cmd)
        self.job.restart(resume)
        self.applied.append((step, "restart", f"from {resume} {' '.join(done)}{hosts}"))
        return f"restarted from step {resume}{hosts}"

    def rollback(self, cmd: Command, step: int) -> str:
        self.relaunches += 1
        self._relaunch_hosts()
        resume = self._resume_step(cmd)
        self.job.rollback(resume)
        self.applied.append((step, "rollback", f"to {resume}"))
        return f"rolled back to step {resume}"
