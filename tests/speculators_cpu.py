"""Run speculators 0.9.0's own trainer on CPU, for tests and the backend benchmark. Installed files are never edited.

speculators' ``Trainer`` (``speculators/train/trainer.py``) assumes an accelerator in
three places; :func:`cpu_trainer` patches exactly those, at runtime, and restores them:

* the local rank is used as a device (``model.to(self.local_rank)``, ``v.to(self.local_rank)``):
  ``get_local_rank`` as the trainer module sees it returns the CPU device;
* ``Trainer.device_type`` falls back to ``"cuda"`` without an accelerator (used by
  ``torch.autocast``): set to ``"cpu"`` after ``__init__``;
* ``_StepTimer`` calls ``torch.accelerator.synchronize()`` on logged steps: a no-op
  while no accelerator exists.

Two more things are trainer flags, not patches: ``--draft-attn-impl sdpa`` (flex
attention has no CPU backward) and ``--loss-implementation eager`` (the fused loss
needs Triton). :data:`CPU_FLAGS` holds them. :func:`step_losses` collects the
per-step training loss the trainer logs.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Iterator

import torch

CPU_FLAGS = ["--draft-attn-impl", "sdpa", "--loss-implementation", "eager"]


@contextlib.contextmanager
def cpu_trainer() -> Iterator[None]:
    """The three CPU shims, applied for the duration of the block."""
    from speculators.train import trainer as trainer_mod

    original_rank, original_init, original_sync = trainer_mod.get_local_rank, trainer_mod.Trainer.__init__, torch.accelerator.synchronize

    def init_on_cpu(self, *args, **kwargs) -> None:
        original_init(self, *args, **kwargs)
        self.device_type = "cpu"

    trainer_mod.get_local_rank = lambda: torch.device("cpu")
    trainer_mod.Trainer.__init__ = init_on_cpu
    if not torch.accelerator.is_available():
        torch.accelerator.synchronize = lambda *args, **kwargs: None
    try:
        yield
    finally:
        trainer_mod.get_local_rank, trainer_mod.Trainer.__init__ = original_rank, original_init
        torch.accelerator.synchronize = original_sync


class _Recording:
    """Stands in for the trainer module's ``metric_logger``: records the train loss, then logs as before."""

    def __init__(self, logger: logging.Logger, losses: list[float]) -> None:
        self._logger, self._losses = logger, losses

    def info(self, msg, *args, **kwargs) -> None:
        if isinstance(msg, dict) and isinstance(msg.get("train"), dict) and "loss" in msg["train"]:
            value = msg["train"]["loss"]
            self._losses.append(float(value.item() if hasattr(value, "item") else value))
        self._logger.info(msg, *args, **kwargs)

    def __getattr__(self, name: str):
        return getattr(self._logger, name)


@contextlib.contextmanager
def step_losses() -> Iterator[list[float]]:
    """Per-step ``train`` loss values the trainer logs (``--log-freq 1``: every step).

    speculators' ``setup_metric_logger`` reconfigures the ``speculators.metrics``
    handlers with ``dictConfig`` at start, so the values are taken where the trainer
    module logs them.
    """
    from speculators.train import trainer as trainer_mod

    losses: list[float] = []
    original = trainer_mod.metric_logger
    trainer_mod.metric_logger = _Recording(original, losses)
    try:
        yield losses
    finally:
        trainer_mod.metric_logger = original
