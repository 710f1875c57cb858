"""The Lightning and Hugging Face callbacks driven by their real trainers (one process,
CPU) over a recording stand-in for the guard: which steps are measured, what data
wait is counted, how STOP, CHECKPOINT and a relaunch reach the trainer.

The guard itself is tested in tests/integration/test_torch_ddp.py; the callbacks with the
real guard on a real DDP job in tests/integration/test_torch_callbacks.py. Skips without
the frameworks, except under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import importlib.util
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import IN_CI

for _mod in ("torch", "lightning", "transformers"):
    if importlib.util.find_spec(_mod) is None:
        if IN_CI:
            raise ImportError(f"CI=true but {_mod} is missing: .ci/run installs it")
        pytest.skip(f"{_mod} is not installed", allow_module_level=True)

import torch  # noqa: E402

from pipeline.client.pytorch.guard import RelaunchRequested  # noqa: E402
from pipeline.client.pytorch.relaunch import RelaunchRequest  # noqa: E402
from schemas import EndReason  # noqa: E402

#: the frameworks' advice on this machine (srun exists; few workers; a tiny dataset)
#: and torch's own deprecation inside Lightning 2.6 (torch.utils._pytree.LeafSpec)
pytestmark = [
    pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning"),
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*:FutureWarning"),
]

FETCH_S = 0.02  # the emulated loader's latency per batch


class FakeGuard:
    """Records what the callback asks of the guard; ``stop_at``/``relaunch_at``: the
    step whose boundary returns True / saves then raises :class:`RelaunchRequested`."""

    def __init__(self, checkpoint: Any, stop_at: int = -1, relaunch_at: int = -1) -> None:
        self.checkpoint, self.stop_at, self.relaunch_at = checkpoint, stop_at, relaunch_at
        self.steps: list[int] = []
        self.boundaries: list[int] = []
        self.waits: list[float] = []
        self.pending_wait = 0.0
        self.losses: list[float] = []
        self.closed: list[Any] = []
        self.hooked: list[Any] = []
        self.phases: list[str] = []
        self.fetches: list[float] = []  # the perf_counter at which each fetch began
        self.comm = object()

    def register_comm_hook(self, model: Any, *_: Any) -> None:
        self.hooked.append(model)

    def fetching(self, since: float) -> None:
        self.fetches.append(since)

    def data_wait(self, seconds: float, *, since: float | None = None) -> None:
        self.pending_wait += seconds

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        self.steps.append(step)
        self.waits.append(self.pending_wait)
        self.pending_wait = 0.0
        yield

    def note(self, *, loss: Any = None, grad_norm: Any = None) -> None:
        self.losses.append(float(loss))

    def boundary(self, step: int) -> bool:
        self.boundaries.append(step)
        if step == self.relaunch_at:
            self.checkpoint(step)
            req = RelaunchRequest("j", "j-a0-r0", step, (), (), None, ("c",))
            self.closed.append(None)
            raise RelaunchRequested(req)
        return step == self.stop_at

    @contextlib.contextmanager
    def phase(self, name: str, expected_s: float | None = None) -> Iterator[None]:
        self.phases.append(name)
        yield

    def close(self, reason: Any = EndReason.COMPLETED) -> None:
        self.closed.append(reason)


class SlowData(torch.utils.data.Dataset):
    """Batches that take ``FETCH_S`` to load (emulated I/O)."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        time.sleep(FETCH_S)
        gen = torch.Generator().manual_seed(i)
        return {"x": torch.randn(8, 16, generator=gen), "y": torch.randn(8, 16, generator=gen)}


def _install(monkeypatch: pytest.MonkeyPatch, module: Any, **kw: Any) -> list[FakeGuard]:
    made: list[FakeGuard] = []

    def fake_watch(model: Any = None, *, checkpoint: Any, **_: Any) -> FakeGuard:
        made.append(FakeGuard(checkpoint, **kw))
        return made[-1]

    monkeypatch.setattr(module, "watch", fake_watch)
    return made


# -- Lightning -----------------------------------------------------------------------------
def _fit(tmp_path: Path, steps: int, callback: Any) -> Any:
    import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Linear(16, 16)

        def training_step(self, batch: dict[str, torch.Tensor], _i: int) -> torch.Tensor:
            return torch.nn.functional.mse_loss(self.net(batch["x"]), batch["y"])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

    trainer = pl.Trainer(
        accelerator="cpu", devices=1, max_steps=steps, callbacks=[callback], logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        default_root_dir=tmp_path,
    )  # fmt: skip
    loader = torch.utils.data.DataLoader(SlowData(), batch_size=None)
    trainer.fit(Module(), train_dataloaders=loader)
    return trainer


def test_lightning_measures_each_batch_with_its_fetch_as_data_wait(monkeypatch, tmp_path):
    from pipeline.client.pytorch import lightning

    made = _install(monkeypatch, lightning)
    _fit(tmp_path, 6, lightning.StepguardCallback())
    (guard,) = made
    assert guard.steps == guard.boundaries == [0, 1, 2, 3, 4, 5]
    # every batch after the first (prefetched at setup) waited for one fetch
    assert all(w >= FETCH_S * 0.9 for w in guard.waits[1:]), guard.waits
    # each of those fetches was said as it began, so a long one is said while it lasts
    assert len(guard.fetches) >= 5 and guard.fetches == sorted(guard.fetches)
    assert len(guard.losses) == 6 and guard.closed == [EndReason.COMPLETED]


def test_lightning_stop_ends_fit_after_that_batch(monkeypatch, tmp_path):
    from pipeline.client.pytorch import lightning

    made = _install(monkeypatch, lightning, stop_at=2)
    trainer = _fit(tmp_path, 10, lightning.StepguardCallback())
    assert made[0].steps == [0, 1, 2] and trainer.global_step == 3
    assert made[0].closed == [EndReason.COMPLETED]  # the guard makes it cancelled


def test_lightning_relaunch_saves_a_checkpoint_and_leaves_fit(monkeypatch, tmp_path):
    from pipeline.client.pytorch import lightning

    made = _install(monkeypatch, lightning, relaunch_at=3)
    with pytest.raises(RelaunchRequested):
        _fit(tmp_path, 10, lightning.StepguardCallback(dirpath=tmp_path / "ck"))
    assert made[0].steps == [0, 1, 2, 3]
    assert made[0].closed == [None]  # closed by the relaunch, not once more as FAILED
    last = lightning.last_checkpoint(tmp_path / "ck")
    assert last is not None and last.name == "stepguard-step=3.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == 4


# -- Hugging Face ----------------------------------------------------------------------------
class HFModel(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(16, 16)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"loss": torch.nn.functional.mse_loss(self.net(x.flatten(0, -2)), y.flatten(0, -2))}


def _train(tmp_path: Path, steps: int, callback: Any) -> Any:
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=steps, per_device_train_batch_size=1,
        logging_strategy="no", save_strategy="no", report_to="none", use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0, remove_unused_columns=False,
    )  # fmt: skip
    trainer = Trainer(model=HFModel(), args=args, train_dataset=SlowData(), callbacks=[callback])
    trainer.train()
    return trainer


def test_hf_measures_each_optimizer_step_with_its_batch_fetch_as_data_wait(monkeypatch, tmp_path):
    from pipeline.client.pytorch import hf

    made = _install(monkeypatch, hf)
    _train(tmp_path, 5, hf.StepguardCallback())
    (guard,) = made
    assert guard.steps == guard.boundaries == [0, 1, 2, 3, 4]
    assert all(w >= FETCH_S * 0.9 for w in guard.waits[1:]), guard.waits
    assert len(guard.fetches) >= 4 and guard.fetches == sorted(guard.fetches)
    assert guard.closed == [EndReason.COMPLETED]


def test_hf_stop_sets_should_training_stop(monkeypatch, tmp_path):
    from pipeline.client.pytorch import hf

    made = _install(monkeypatch, hf, stop_at=1)
    trainer = _train(tmp_path, 10, hf.StepguardCallback())
    assert made[0].steps == [0, 1] and trainer.state.global_step == 2


def test_hf_relaunch_leaves_after_the_trainers_own_checkpoint_is_written(monkeypatch, tmp_path):
    from pipeline.client.pytorch import hf

    made = _install(monkeypatch, hf, relaunch_at=2)
    with pytest.raises(RelaunchRequested):
        _train(tmp_path, 10, hf.StepguardCallback())
    assert made[0].steps == [0, 1, 2]
    saved = tmp_path / "out" / "checkpoint-3"  # global_step after step 2
    assert (saved / "trainer_state.json").exists(), sorted((tmp_path / "out").iterdir())


def test_find_ddp_finds_the_wrapper_of_a_model(unused_port):
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from pipeline.client.pytorch.hf import find_ddp

    model = torch.nn.Linear(4, 4)
    assert find_ddp(model) is None
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{unused_port}", rank=0, world_size=1
    )
    try:
        ddp = DistributedDataParallel(model)
        assert find_ddp(model) is ddp and find_ddp(ddp) is ddp
    finally:
        dist.destroy_process_group()


@pytest.fixture
def unused_port() -> int:
    import socket

    for port in range(31500, 31600):  # this helper's range
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    pytest.skip("no free port in 31500-31599")
