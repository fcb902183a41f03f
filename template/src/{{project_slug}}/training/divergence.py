"""The divergence guard: a step whose loss or gradient norm is not finite (or, with
optim.loss_spike_factor, whose loss exceeds that factor times its running mean) is not applied, and
optim.max_skipped_steps such steps in a row stop the run with one line naming the step, the values
and the newest checkpoint to resume from with a lower learning rate. Since no such step is applied,
every checkpoint holds finite weights: `latest` never moves to a diverged state and keep_last's
rotation never deletes the last good one (train.py also refuses to save weights that are not finite).

Nothing is read back from the device between logging steps: the verdict of a step is a device tensor
that the optimizer reads on the device (`found_inf`, the convention of torch's fused optimizers and
GradScaler; strategies/optimizer.py), and the run of skipped steps is counted on the device and read
at the steps that read the device anyway (logging, evaluation, checkpoints). The guard judges the
mean loss of all ranks (one scalar all-reduce a step, which the logging steps reuse) and the global
gradient norm, so every rank reaches the same verdict.

fp16: a gradient that overflows is the loss scaler's business (the step is skipped and the scale
halves, DDP's GradScaler or an engine's own), so there only the loss is judged. An engine that skips
a step with non-finite gradients itself decides there; a loss spike cannot be skipped where the
engine has no hook before the update, which `check` says.
"""

from __future__ import annotations

import torch

from ..runtime.distributed import all_reduce_mean
from ..runtime.unrecoverable import raise_on_every_rank
from ..settings.config import OptimConfig

SPIKE_MEAN_DECAY = 0.95
"""The running mean the spike test compares against: an exponential mean of the applied steps' losses."""


class DivergenceGuard:
    def __init__(self, o: OptimConfig, device: torch.device, is_main: bool, judges_norm: bool):
        """judges_norm: False where a non-finite gradient norm is normal (fp16 loss scaling) or not one
        (a strategy that reports none)."""
        self.is_main = is_main
        self.limit, self.spike_factor, self.judges_norm = o.max_skipped_steps, o.loss_spike_factor, judges_norm
        nought = torch.zeros((), dtype=torch.float64, device=device)
        # On the device: steps not applied in a row and in all, the running mean loss and how many
        # steps it holds, and the first step, loss and norm of the current run of skipped steps.
        self.streak, self.skipped, self.mean, self.counted = (nought.clone() for _ in range(4))
        self.first_bad, self.bad_loss, self.bad_norm = (nought.clone() for _ in range(3))
        self.loss = nought.clone()  # this step's mean loss over all ranks

    def observe_loss(self, loss: torch.Tensor) -> None:
        """This step's mean loss on this rank (collective: the mean over every rank)."""
        self.loss = all_reduce_mean(loss.detach().to(torch.float64).clone())

    def judge(self, step: int, grad_norm: torch.Tensor | None) -> torch.Tensor:
        """The verdict on this step, a device bool tensor: True = do not apply it. grad_norm: the
        global norm before clipping (None: judge the loss alone)."""
        loss = self.loss
        finite = torch.isfinite(loss)
        if grad_norm is not None and self.judges_norm:
            finite = finite & torch.isfinite(grad_norm.to(loss.device))
        bad = ~finite
        if self.spike_factor:
            bad = bad | ((self.counted > 0) & (loss > self.spike_factor * self.mean))
        # Every update below is branch-free: the host never waits for the verdict.
        starts = bad & (self.streak == 0)
        self.first_bad = torch.where(starts, step + 1, self.first_bad)
        self.bad_loss = torch.where(bad, loss, self.bad_loss)
        norm = grad_norm.to(loss) if grad_norm is not None else torch.full_like(loss, float("nan"))
        self.bad_norm = torch.where(bad, norm, self.bad_norm)
        self.streak = torch.where(bad, self.streak + 1, 0)
        self.skipped = self.skipped + bad
        first = self.counted == 0
        updated = torch.where(first, loss, SPIKE_MEAN_DECAY * self.mean + (1 - SPIKE_MEAN_DECAY) * loss)
        self.mean = torch.where(bad, self.mean, updated)
        self.counted = self.counted + ~bad
        return bad

    def check(self, checkpoint_hint) -> int:
        """At a step that reads the device anyway (collective-free; every rank reaches the same verdict):
        stop the run (a failure every rank raises, one line) once optim.max_skipped_steps steps in a row
        were not applied; returns the steps not applied so far. checkpoint_hint(): the newest
        checkpoint, named in the message."""
        streak, skipped, first, loss, norm = torch.stack(
            [self.streak, self.skipped, self.first_bad, self.bad_loss, self.bad_norm]
        ).tolist()
        if self.limit and streak >= self.limit:
            message = self.message(int(first), int(streak), loss, norm, checkpoint_hint())
            raise_on_every_rank(message, self.is_main, key="optim.lr")
        return int(skipped)

    def message(self, first: int, streak: int, loss: float, norm: float, newest) -> str:
        what = f"loss {loss:.4g}" + ("" if norm != norm and not self.judges_norm else f", gradient norm {norm:.4g}")
        resume = (
            f"resume from the newest checkpoint, {newest}, with a lower learning rate"
            if newest
            else "no checkpoint was written: start again with a lower learning rate"
        )
        return (
            f"the run diverged at step {first}: {what}; {streak} steps in a row were not applied "
            f"(optim.max_skipped_steps={self.limit}), so every checkpoint holds finite weights; {resume} "
            "(optim.lr, or optim.matrix_lr and the other *_lr under muon) or a longer schedule.warmup_steps"
        )

    def state_dict(self) -> dict:
        """What a resume restores so that its verdicts equal the uninterrupted run's (read at a checkpoint)."""
        names = ("streak", "skipped", "mean", "counted", "first_bad", "bad_loss", "bad_norm")
        return dict(zip(names, torch.stack([getattr(self, n) for n in names]).tolist()))

    def load_state_dict(self, state: dict | None) -> None:
        for name, value in (state or {}).items():
            if hasattr(self, name):
                setattr(self, name, torch.full_like(self.streak, value))


def weights_are_finite(parameters, device: torch.device) -> torch.Tensor:
    """Collective: whether every rank's parameters (or its shards of them) are all finite, as a bool
    tensor on device (the backend's: a rank may hold no weights, or hold them on the host)."""
    local = [p.detach() for p in parameters if p.numel()]
    bad = torch.zeros((), dtype=torch.float64, device=device)
    if local:
        bad = torch.stack([(~torch.isfinite(t)).any().to(device) for t in local]).any().to(torch.float64)
    return all_reduce_mean(bad) == 0
