"""torch_job.py's DDP job (gloo, CPU) run by a framework with stepguard's callback.

``--framework lightning``: a ``LightningModule`` fitted by ``lightning.Trainer(strategy=
"ddp", callbacks=[StepguardCallback()])``; ``--framework hf``: the same MLP trained by
``transformers.Trainer(callbacks=[StepguardCallback()])``. Run under torchrun with
``STEPGUARD_RANKS_PER_NODE`` as torch_job.py is; ``--slow-rank R --slow-from K`` makes
rank R multiply extra matrices in every step from K (a compute straggler). Each rank
writes ``--out/rank-R-a<attempt>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path
from typing import Any

HIDDEN = 256
#: distinct synthetic batches a rank cycles through
POOL = 8


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--framework", choices=("lightning", "hf"), required=True)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--ckpt-dir", type=Path, required=True)
    p.add_argument("--slow-rank", type=int, default=-1)
    p.add_argument("--slow-from", type=int, default=0)
    p.add_argument("--slow-matmuls", type=int, default=12)
    p.add_argument("--out", type=Path, required=True)
    return p


def main() -> None:  # torch inside: pytest imports this file to look for doctests
    import torch
    from torch import nn

    args = _parser().parse_args()
    torch.set_num_threads(1)
    rank = int(os.environ["RANK"])
    torch.manual_seed(0)
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(HIDDEN, HIDDEN), nn.ReLU()]
    net = nn.Sequential(*layers)
    extra_a = torch.randn(args.batch, HIDDEN)
    extra_b = torch.randn(HIDDEN, HIDDEN)

    def work(step: int, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if rank == args.slow_rank and step >= args.slow_from:
            for _ in range(args.slow_matmuls):  # real extra work on this rank
                extra_a.copy_(torch.tanh(extra_a @ extra_b))
        return nn.functional.mse_loss(net(x), y)

    class Batches(torch.utils.data.Dataset):
        """One whole synthetic batch per index, drawn from a pool made up front (seeded
        by rank): fetching one is a lookup, as from a loader that keeps up. Drawing
        the random numbers in ``__getitem__`` put milliseconds of CPU work in the fetch
        of a 20 ms step on an oversubscribed machine: a data wait that spiked to a
        third of the step on whichever rank the scheduler preempted, which is a data
        stall, not the clean run or the compute straggler these jobs are."""

        def __init__(self) -> None:
            gen = torch.Generator().manual_seed(1000 + 7919 * rank)
            self.pool = [{"x": torch.randn(args.batch, HIDDEN, generator=gen),
                          "y": torch.randn(args.batch, HIDDEN, generator=gen)}
                         for _ in range(POOL)]  # fmt: skip

        def __len__(self) -> int:
            return args.steps * int(os.environ["WORLD_SIZE"])

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return self.pool[i % POOL]

    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    run = _lightning if args.framework == "lightning" else _hf
    figures = run(args, net, work, Batches())
    doc = {"rank": rank, "wall_s": time.perf_counter() - t0, **figures,
           "attempt": os.environ.get("STEPGUARD_ATTEMPT", "")}  # fmt: skip
    (args.out / f"rank-{rank}-a{doc['attempt'] or 0}.json").write_text(json.dumps(doc))


def _lightning(args: argparse.Namespace, net: Any, work: Any, data: Any) -> dict[str, Any]:
    import lightning.pytorch as pl
    import torch

    from pipeline.client.pytorch.lightning import StepguardCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = net

        def training_step(self, batch: dict[str, torch.Tensor], batch_idx: int) -> torch.Tensor:
            return work(self.trainer.fit_loop.total_batch_idx, batch["x"], batch["y"])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    callback = StepguardCallback(dirpath=args.ckpt_dir)
    trainer = pl.Trainer(
        accelerator="cpu", strategy="ddp", devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        max_steps=args.steps, callbacks=[callback], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=True,
        default_root_dir=args.ckpt_dir, num_sanity_val_steps=0,
    )  # fmt: skip
    loader = torch.utils.data.DataLoader(data, batch_size=None, shuffle=False)
    trainer.fit(Module(), train_dataloaders=loader)
    return _figures(callback.guard) | {"hooked": callback.hooked}


def _hf(args: argparse.Namespace, net: Any, work: Any, data: Any) -> dict[str, Any]:
    import torch
    from transformers import Trainer, TrainingArguments

    from pipeline.client.pytorch.hf import StepguardCallback

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = net
            self.calls = 0

        def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
            step, self.calls = self.calls, self.calls + 1  # one forward per step
            return {"loss": work(step, x.flatten(0, -2), y.flatten(0, -2))}

    callback = StepguardCallback()
    targs = TrainingArguments(
        output_dir=str(args.ckpt_dir), max_steps=args.steps, per_device_train_batch_size=1,
        learning_rate=1e-3, lr_scheduler_type="constant", logging_strategy="no",
        save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
        dataloader_num_workers=0, ddp_backend="gloo", seed=0, remove_unused_columns=False,
        ddp_find_unused_parameters=False,
    )  # fmt: skip
    Trainer(model=Model(), args=targs, train_dataset=data, callbacks=[callback]).train()
    return _figures(callback.guard) | {"hooked": callback.hooked}


def _figures(guard: Any) -> dict[str, Any]:
    stats = guard.stats()
    return {"recorded": stats.steps, "record_s": stats.record_s, "node": guard.topology.node,
            "run": guard.topology.run, "stopped": guard.stopped is not None,
            "start": 0, "steps": stats.steps}  # fmt: skip


if __name__ == "__main__":
    main()
