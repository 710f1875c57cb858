"""PyTorch Lightning: the :class:`~pipeline.client.pytorch.guard.TorchGuard` as a callback.

``pip install 'stepguard[lightning]'``, then one line::

    from pipeline.client.pytorch.lightning import StepguardCallback

    trainer = L.Trainer(strategy="ddp", callbacks=[StepguardCallback()])

Everything measured, published and obeyed is the guard's; this module only maps
Lightning's hooks onto it:

- the guard is built in ``setup("fit")`` (the process group exists by then); the DDP
  model the strategy wraps gets the timed comm hook in ``on_fit_start``. A hook given
  to ``DDPStrategy(ddp_comm_hook=...)`` is wrapped (timed too) before the strategy
  registers it; Lightning registers such hooks on CUDA only, so on CPU DDP's
  all-reduce is timed, as Lightning runs it;
- a step is a training batch, numbered by the fit loop's batch index across epochs
  (``trainer.fit_loop.total_batch_idx``), measured from ``on_train_batch_start`` to
  ``on_train_batch_end`` and followed by the guard's command boundary; the batch's
  ``loss`` output is noted, and its work when the batch is a mapping of token ids
  (``attention_mask`` or ``input_ids``: :func:`~pipeline.client.pytorch.guard.batch_work`);
- **data wait** is the time the fit loop spent in its data fetcher's ``next`` before
  the batch (Lightning's own ``train_dataloader_next`` profiler action, timed through
  the loop's fetch hooks): the loader's wait, not the host-to-device copy nor the
  loop's bookkeeping. Lightning prefetches one batch, so the fetch that delays a batch
  is the one of the batch after it; the step's wall time starts with that fetch. On a
  Lightning without those hooks data wait reads 0 (a warning says so);
- validation inside ``fit`` is announced as an ``eval`` phase;
- CHECKPOINT and the save before a relaunch call ``trainer.save_checkpoint`` (every
  rank, as Lightning requires) into ``dirpath`` (``stepguard-step=N.ckpt``; resume with
  ``trainer.fit(model, ckpt_path=last_checkpoint(dirpath))``); STOP sets
  ``trainer.should_stop`` (the end is announced as cancelled); RESTART and ROLLBACK
  raise :class:`~pipeline.client.pytorch.guard.RelaunchRequested` (exit code 75) out of
  ``trainer.fit`` for ``stepguard-torchrun``;
- the job's end is announced once (rank 0) in ``on_train_end``, a failure in
  ``on_exception``.
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError as exc:
    raise ImportError(
        "pipeline.client.pytorch.lightning needs Lightning: pip install 'stepguard[lightning]'"
    ) from exc
import torch
from torch.nn.parallel import DistributedDataParallel

from pipeline.client.pytorch.clocks import CudaClock
from pipeline.client.pytorch.comm import timed_hook
from pipeline.client.pytorch.guard import RelaunchRequested, TorchGuard, batch_work, watch
from pipeline.io.settings import ClientSettings
from schemas import EndReason

__all__ = ["StepguardCallback", "last_checkpoint"]

log = logging.getLogger(__name__)
_NAME = re.compile(r"^stepguard-step=(\d+)\.ckpt$")


def last_checkpoint(dirpath: str | Path) -> Path | None:
    """The checkpoint of the highest step in ``dirpath`` (None: none yet)."""
    found = [
        (int(m.group(1)), p)
        for p in Path(dirpath).glob("stepguard-step=*.ckpt")
        if (m := _NAME.match(p.name))
    ]
    return max(found)[1] if found else None


class StepguardCallback(pl.Callback):
    """Watch and steer a Lightning ``fit`` (see the module docstring).

    Parameters
    ----------
    dirpath
        Where checkpoints asked for by commands go (default:
        ``<trainer.default_root_dir>/stepguard``).
    job_id, commands, settings, env
        As for :func:`~pipeline.client.pytorch.guard.watch`.
    """

    def __init__(
        self,
        *,
        dirpath: str | Path | None = None,
        job_id: str | None = None,
        commands: bool = True,
        settings: ClientSettings | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.dirpath = None if dirpath is None else Path(dirpath)
        self._job_id, self._commands, self._settings, self._env = job_id, commands, settings, env
        self.guard: TorchGuard | None = None
        #: the DDP model's gradient communication is timed (a comm hook)
        self.hooked = False
        self._trainer: pl.Trainer | None = None
        self._step: contextlib.AbstractContextManager[None] | None = None
        self._step_no = 0
        self._phase = contextlib.ExitStack()
        self._fetch_t0: float | None = None

    # -- setup ---------------------------------------------------------------------------
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit" or self.guard is not None:
            return
        self._trainer = trainer
        if self.dirpath is None:
            self.dirpath = Path(trainer.default_root_dir) / "stepguard"
        strategy = trainer.strategy
        cuda = strategy.root_device.type == "cuda"
        self.guard = watch(
            checkpoint=self._save, job_id=self._job_id, commands=self._commands,
            clock=CudaClock() if cuda else None, settings=self._settings, env=self._env,
        )  # fmt: skip
        user_hook = getattr(strategy, "_ddp_comm_hook", None)
        if cuda and user_hook is not None:  # the strategy registers it in strategy.setup
            strategy._ddp_comm_hook = timed_hook(self.guard.comm, user_hook)  # type: ignore[attr-defined]
            self.hooked = True
        self._time_fetches(trainer)

    def _time_fetches(self, trainer: pl.Trainer) -> None:
        loop = trainer.fit_loop.epoch_loop
        before = getattr(loop, "_on_before_fetch", None)
        after = getattr(loop, "_on_after_fetch", None)
        if not (callable(before) and callable(after)):
            log.warning("this Lightning has no fetch hooks: data wait is not measured")
            return

        def on_before_fetch() -> None:
            self._fetch_t0 = time.perf_counter()
            if self.guard is not None:
                self.guard.fetching(self._fetch_t0)
            before()

        def on_after_fetch() -> None:
            after()
            if self._fetch_t0 is not None and self.guard is not None:
                t0, self._fetch_t0 = self._fetch_t0, None
                self.guard.data_wait(time.perf_counter() - t0, since=t0)

        # instance attributes: the epoch loop hands these to its fetcher at each epoch
        loop._on_before_fetch = on_before_fetch  # type: ignore[method-assign]
        loop._on_after_fetch = on_after_fetch  # type: ignore[method-assign]

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        model = trainer.strategy.model
        if (
            self.guard is not None
            and not self.hooked
            and isinstance(model, DistributedDataParallel)
        ):
            self.guard.register_comm_hook(model)
            self.hooked = True

    def _save(self, step: int) -> None:
        assert self._trainer is not None and self.dirpath is not None
        self._trainer.save_checkpoint(self.dirpath / f"stepguard-step={step}.ckpt")

    # -- the steps -----------------------------------------------------------------------
    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self.guard is None:
            return
        self._step_no = trainer.fit_loop.total_batch_idx
        self._step = self.guard.step(self._step_no)
        self._step.__enter__()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        if self.guard is None or self._step is None:
            return
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor | float):
            self.guard.note(loss=loss)
        work = batch_work(batch)  # tokens, when the batch is one of token ids
        if work:
            self.guard.note(**work)
        step, self._step = self._step, None
        step.__exit__(None, None, None)
        if self.guard.boundary(self._step_no):
            trainer.should_stop = True

    # -- phases and the end --------------------------------------------------------------
    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.guard is not None and not trainer.sanity_checking:
            self._phase.enter_context(self.guard.phase("eval"))

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._phase.close()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._close(EndReason.COMPLETED)

    def on_exception(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException
    ) -> None:
        if not isinstance(exception, RelaunchRequested):  # that one closed the guard
            self._close(EndReason.FAILED)

    def _close(self, reason: EndReason) -> None:
        self._phase.close()
        if self.guard is not None:
            self.guard.close(reason)
