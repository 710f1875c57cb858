"""Hugging Face ``Trainer``: the :class:`~pipeline.client.pytorch.guard.TorchGuard` as a
``TrainerCallback``.

``pip install 'stepguard[hf]'``, then one line::

    from pipeline.client.pytorch.hf import StepguardCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds,
                      callbacks=[StepguardCallback()])

Everything measured, published and obeyed is the guard's; this module only maps the
Trainer's events onto it:

- the guard is built in ``on_train_begin`` (the process group exists; the Trainer has
  wrapped the model). A callback is handed the unwrapped model only, so the
  ``DistributedDataParallel`` around it is found among the objects holding it (once)
  and gets the timed comm hook (:func:`find_ddp`); without one (one process, FSDP,
  DeepSpeed) comm wait is what ``guard.comm`` is told;
- a step is an optimizer step (all its gradient-accumulation micro-batches), numbered
  ``state.global_step`` at ``on_step_begin`` and measured to ``on_step_end``, then the
  guard's command boundary;
- **data wait** is the time from the Trainer's last event after the previous step (its
  ``on_step_end``, ``on_log``, ``on_save``, ``on_evaluate``; for the first step of an
  epoch ``on_epoch_begin``) to this step's ``on_step_begin``: the Trainer fetching the
  step's micro-batches (``get_batch_samples``: the loader, the copy to the device, and,
  for models taking ``num_items_in_batch``, counting them, which may gather across
  ranks) and a few lines of the loop. Logging, evaluation and saving are not in it.
  The step's wall time starts there;
- CHECKPOINT sets ``control.should_save``: the Trainer saves its usual resumable
  checkpoint (``output_dir/checkpoint-N``, every rank) right after this step, and the
  command's result says so. Before a relaunch the same save is asked for and
  :class:`~pipeline.client.pytorch.guard.RelaunchRequested` is raised from ``on_save``,
  once it is written (resume with ``trainer.train(resume_from_checkpoint=True)``); a
  ROLLBACK raises at once. STOP sets ``control.should_training_stop`` (the end is
  announced as cancelled);
- work per step (tokens): the Trainer hands its callbacks no batch, and its
  ``num_input_tokens_seen`` is summed over all ranks, so the callback cannot tell a
  rank's own tokens and reports none. A ``Trainer`` subclass can:
  ``callback.guard.note(**batch_work(inputs))`` in its ``training_step``
  (:func:`~pipeline.client.pytorch.guard.batch_work`);
- the job's end is announced once (rank 0) in ``on_train_end``. The Trainer has no
  failure event: a crash leaves the job without an end message.
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Mapping
from typing import Any

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ImportError as exc:
    raise ImportError(
        "pipeline.client.pytorch.hf needs transformers: pip install 'stepguard[hf]'"
    ) from exc
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from pipeline.client.pytorch.clocks import CudaClock
from pipeline.client.pytorch.guard import RelaunchRequested, TorchGuard, watch
from pipeline.io.settings import ClientSettings
from schemas import EndReason

__all__ = ["StepguardCallback", "find_ddp"]


def find_ddp(model: Any) -> DistributedDataParallel | None:
    """The ``DistributedDataParallel`` wrapping ``model``, if one exists: looked up once
    among the objects the garbage collector tracks (a callback is never handed the
    wrapper; about a second for a few million objects)."""
    if model is None or isinstance(model, DistributedDataParallel):
        return model
    if not (dist.is_available() and dist.is_initialized()):
        return None  # no process group, no DDP: spare the search
    for obj in gc.get_objects():  # type(), not isinstance: no object's __class__ is read
        if issubclass(type(obj), DistributedDataParallel) and obj.module is model:
            return obj  # type: ignore[no-any-return]
    return None


class StepguardCallback(TrainerCallback):
    """Watch and steer a Hugging Face ``Trainer`` (see the module docstring).

    Parameters
    ----------
    job_id, commands, settings, env
        As for :func:`~pipeline.client.pytorch.guard.watch`.
    """

    def __init__(
        self,
        *,
        job_id: str | None = None,
        commands: bool = True,
        settings: ClientSettings | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self._job_id, self._commands, self._settings, self._env = job_id, commands, settings, env
        self.guard: TorchGuard | None = None
        #: the DDP model's gradient communication is timed (a comm hook)
        self.hooked = False
        self._control: TrainerControl | None = None
        self._step: contextlib.AbstractContextManager[None] | None = None
        self._step_no = 0
        self._mark: float | None = None
        self._save_asked = False
        self._relaunch: RelaunchRequested | None = None

    # -- setup ---------------------------------------------------------------------------
    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self.guard is not None:
            return
        ddp = find_ddp(kw.get("model"))
        cuda = getattr(args.device, "type", "cpu") == "cuda"
        self.guard = watch(
            ddp, checkpoint=self._save, job_id=self._job_id, commands=self._commands,
            clock=CudaClock() if cuda else None, settings=self._settings, env=self._env,
        )  # fmt: skip
        self.hooked = ddp is not None
        self._begin_wait()

    def _save(self, step: int) -> str:
        """CHECKPOINT and the save before a relaunch: the Trainer's own, after this step."""
        assert self._control is not None
        self._control.should_save = True
        self._save_asked = True
        return f"the trainer saves its checkpoint after step {step}"

    def _begin_wait(self) -> None:
        """From here until the next step begins, the Trainer fetches its batch."""
        self._mark = time.perf_counter()
        if self.guard is not None:
            self.guard.fetching(self._mark)

    # -- what is not data wait ---------------------------------------------------------
    def _restart_wait(self, *_: Any, **__: Any) -> None:
        self._begin_wait()

    on_epoch_begin = on_log = on_evaluate = _restart_wait

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        self._save_asked = False
        if self._relaunch is not None:  # its checkpoint is written: now leave
            relaunch, self._relaunch = self._relaunch, None
            raise relaunch
        self._begin_wait()

    # -- the steps -----------------------------------------------------------------------
    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self._relaunch is not None:  # the save never came: leave without it
            relaunch, self._relaunch = self._relaunch, None
            raise relaunch
        if self.guard is None:
            return
        now = time.perf_counter()
        if self._mark is not None:
            self.guard.data_wait(now - self._mark, since=self._mark)
            self._mark = None
        self._step_no = state.global_step
        self._step = self.guard.step(self._step_no)
        self._step.__enter__()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self.guard is None or self._step is None:
            return
        step, self._step = self._step, None
        step.__exit__(None, None, None)
        self._control = control
        try:
            stop = self.guard.boundary(self._step_no)
        except RelaunchRequested as relaunch:
            if not self._save_asked:  # a ROLLBACK: nothing to save
                raise
            self._relaunch = relaunch  # raised from on_save, once the Trainer saved
            control.should_training_stop = True
            return
        if stop:
            control.should_training_stop = True
        self._begin_wait()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kw: Any
    ) -> None:
        if self._relaunch is not None:  # the loop ended before saving
            relaunch, self._relaunch = self._relaunch, None
            raise relaunch
        if self.guard is not None:
            self.guard.close(EndReason.COMPLETED)
