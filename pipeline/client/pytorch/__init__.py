"""PyTorch integration: a training loop watched and steered in about three lines.

``pip install 'stepguard[torch]'``, then::

    from pipeline.client.pytorch import watch

    guard = watch(ddp_model, checkpoint=save)
    for step, batch in guard.steps(loader, start=resume_step, total=total_steps):
        ...  # forward, backward, optimizer step
    guard.close()

Run it under ``stepguard-torchrun -- torchrun ... train.py`` to be relaunched from the
checkpoint with the isolated node swapped for a spare. The pieces:

- :mod:`~pipeline.client.pytorch.guard` — :func:`watch`, :class:`TorchGuard`;
- :mod:`~pipeline.client.pytorch.topology` — job, node, rank, ``dp_group`` (explained);
- :mod:`~pipeline.client.pytorch.clocks` — thread CPU time, CUDA events;
- :mod:`~pipeline.client.pytorch.comm` — the timed DDP comm hook, FSDP/manual waits;
- :mod:`~pipeline.client.pytorch.codec` — commands between ranks (JSON, no pickle);
- :mod:`~pipeline.client.pytorch.relaunch` — ``stepguard-torchrun``.

Only ``guard`` and ``comm`` need torch; the rest imports without it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RelaunchRequested", "TorchGuard", "watch"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        try:
            from pipeline.client.pytorch import guard
        except ImportError as exc:
            if exc.name and exc.name.split(".")[0] == "torch":
                raise ImportError(
                    "pipeline.client.pytorch needs PyTorch: pip install 'stepguard[torch]'"
                ) from exc
            raise
        return getattr(guard, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
