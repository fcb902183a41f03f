"""The contract of a strategy: what training/train.py, evaluation and checkpoints ask of DDP, a sharding
strategy or a pipeline engine, and nothing else. A strategy is built from the Run (its family, sizes,
precision, strategy and sharding: runtime/run_context.py) by build_strategy and owns the model's
wrapping, its optimizer, one training step and its checkpoints; the loop keeps the data stream,
logging and evaluation. tests/test_run_context.py checks that every strategy class has every member.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

import torch


class Strategy(Protocol):
    name: str
    consumes_batches: bool
    """True where the strategy runs a step's micro batches itself (train_batch: the pipeline engine);
    False where the loop runs them (micro_context, runnable, backward, then step)."""
    module: torch.nn.Module | None
    """The unwrapped model for evaluation and export on one process (None where stages hold parts)."""
    runnable: Callable | None
    """What the loop calls on a micro batch: the wrapped (and maybe compiled) model."""
    data_rank: int
    """This rank's place among the data-parallel ranks: which slice of every global batch it reads."""
    peak_lr: float
    num_params: int
    flops_per_token: float
    resumed_state: dict
    """The loop's own state in the checkpoint it resumed from ({"divergence": ...}); {} on a new run."""

    def describe(self) -> str:
        """The strategy's part of the run's first line."""

    def set_schedule(self, point) -> None:
        """This step's learning rates (and Muon's momentum and weight decay): training/schedule.py's point."""

    def micro_context(self, micro: int) -> AbstractContextManager:
        """Around micro step `micro` of the accumulation (DDP: no gradient sync but on the last)."""

    def backward(self, loss: torch.Tensor, micro: int) -> None: ...

    def step(self, judge: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """Clip, update unless judge(grad_norm) (the divergence guard's verdict, a device tensor) says
        not to, clear; returns the gradient norm before clipping."""

    def local_weights(self) -> list[torch.Tensor]:
        """The weights this rank holds (a replica, its shards of the weights, its pipeline stage)."""

    def loss_scaling(self) -> dict:
        """fp16: {"loss_scale", "skipped"} for the metrics line; {} otherwise."""

    def save(self, ckpt_dir: Path, step: int, extra: dict) -> None:
        """Collective: the checkpoint of `step` with the run's state (extra) through the commit of
        checkpoints/ (staged, fsynced, manifest, renamed, `latest` last, keep_last)."""

    def resume(self, ckpt_dir: Path, allowed: bool) -> int:
        """Collective: load the newest intact checkpoint (when allowed); the step it holds, or 0."""
