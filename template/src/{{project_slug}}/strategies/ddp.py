"""DDP strategy: torch DistributedDataParallel, manual gradient accumulation with no_sync,
AdamW or Muon (optimizer.py), global-norm clipping (common.py: the norm every strategy clips by), one
checkpoint file per step written by rank 0 (checkpoint.py).

    <package> train run.strategy=ddp        # the default

Under fp16 (precision.py) torch's GradScaler scales the loss before backward and unscales the
gradients before clipping; a step whose gradients overflowed is skipped (no update, the scale
halves) and counted. The scaler's state and the count are in the checkpoint, so a resume is exact.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from ..checkpoints import checkpoint, checkpoint_files
from ..runtime.distributed import print0, share_from_main
from ..runtime.run_context import Run
from ..runtime.unrecoverable import raise_on_every_rank, unusable_path
from ..settings.precision import INITIAL_SCALE_POWER, SCALE_WINDOW
from .common import clip_gradients, compiled, skip_step
from .optimizer import build_optimizer, groups_line, peak_lrs, set_schedule


def read_checkpoint(path: Path) -> dict:
    """A checkpoint file this strategy wrote, for one process (eval, sample): "model" is already the
    unwrapped model's whole state dict, beside "step", "config" and the rest of the run state."""
    return checkpoint.load(path)


class DDPStrategy:  # implements base.Strategy
    name = "ddp"
    consumes_batches = False  # train.py runs the micro steps (see PipelineStrategy for the other case)

    def __init__(self, run: Run, model: torch.nn.Module, resume: bool = False):  # resume: loaded by resume()
        cfg = run.cfg
        self.cfg, self.run, self.accum = cfg, run, run.grad_accum
        self.data_rank = run.rank  # every rank is a data-parallel rank
        self.module = model  # unwrapped: evaluation, state_dict
        self.num_params, self.flops_per_token = model.num_params(), model.flops_per_token()
        self.resumed_state = {}
        self.run_id = None  # set by resume: the resumed checkpoint's run, or a new one
        self.optimizer = build_optimizer(model, run)
        peaks = peak_lrs(self.optimizer)  # the metrics' lr: Muon's peak under optim.optimizer=muon, else AdamW's
        self.peak_lr = peaks.get("muon", peaks.get("adamw"))
        # Disabled (every call a pass-through) unless the run computes in fp16.
        self.scaler = torch.amp.GradScaler(
            run.device.type,
            init_scale=2.0**INITIAL_SCALE_POWER,
            growth_interval=SCALE_WINDOW,
            enabled=run.precision == "fp16",
        )
        self.skipped = torch.zeros((), dtype=torch.long, device=run.device)  # steps the scaler skipped
        # compile first, then DDP: DDP's bucketing hooks see the compiled module's parameters.
        self.compiled, self.compile_note = compiled(cfg.run, run.device)
        runnable = torch.compile(model) if self.compiled else model
        if run.world_size > 1:
            device = run.device
            # The gradients are views into DDP's all-reduce buckets: no copy between them each step,
            # and no second copy of the gradients in memory.
            runnable = DDP(
                runnable, device_ids=[device.index] if device.type == "cuda" else None, gradient_as_bucket_view=True
            )
        self.runnable = runnable

    def describe(self) -> str:
        return f"strategy ddp, {self.compile_note}" + (
            f", {groups_line(self.optimizer)}" if self.cfg.optim.optimizer == "muon" else ""
        )

    def set_schedule(self, point) -> None:
        set_schedule(self.optimizer, point)

    def micro_context(self, micro: int):
        """Gradients are all-reduced only on the last micro step of the accumulation."""
        sync = self.run.world_size == 1 or micro == self.accum - 1
        return nullcontext() if sync else self.runnable.no_sync()

    def backward(self, loss: torch.Tensor, micro: int) -> None:
        self.scaler.scale(loss / self.accum).backward()

    def step(self, judge) -> torch.Tensor:
        """Unscale, clip, update unless judge(norm) (the divergence guard's verdict, a device tensor)
        says not to or the scaler finds the gradients overflowed, clear; returns the gradient norm
        before clipping (inf or NaN on a skipped step)."""
        self.scaler.unscale_(self.optimizer)
        grad_norm = clip_gradients(self.module.parameters(), self.cfg.optim.grad_clip)
        skip_step(
            self.optimizer, judge(grad_norm), lambda: self.scaler.step(self.optimizer), scaled=self.scaler.is_enabled()
        )
        self.scaler.update()
        if self.scaler.is_enabled():  # the scaler skips exactly the steps with a non-finite gradient
            self.skipped += ~torch.isfinite(grad_norm)
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def local_weights(self) -> list[torch.Tensor]:
        """The weights this rank holds (a whole replica)."""
        return list(self.module.parameters())

    def loss_scaling(self) -> dict:
        """{"loss_scale", "skipped"} under fp16 (skipped: steps of the run so far); {} otherwise."""
        if not self.scaler.is_enabled():
            return {}
        return {"loss_scale": self.scaler.get_scale(), "skipped": int(self.skipped.item())}

    def save(self, ckpt_dir: Path, step: int, extra: dict) -> None:
        failed = None
        if self.run.is_main:
            state = {
                "step": step,
                "model": self.module.state_dict(),
                "optimizer": self.optimizer.state_dict(),
                "grad_scaler": self.scaler.state_dict(),  # {} unless fp16
                "skipped_steps": int(self.skipped.item()),
                **extra,
            }
            try:
                path = checkpoint.save(ckpt_dir, step, state, self.cfg.checkpoint.keep_last, self.run_id)
                print0(f"saved {path}")
            except checkpoint_files.SaveFailed as exc:
                failed = str(exc)
            except OSError as exc:  # a path no restart fixes: said on every rank, none left waiting below
                problem = unusable_path(exc, [Path(self.cfg.run.output_dir)])
                if problem is None:
                    raise
                failed = str(problem)
        # Nobody runs ahead of a checkpoint it may need to resume from, and all stop if it failed.
        failed = share_from_main(failed)
        if failed:
            raise_on_every_rank(failed, self.run.is_main, key="run.output_dir")

    def resume(self, ckpt_dir: Path, allowed: bool) -> int:
        latest = checkpoint.newest_intact(ckpt_dir) if allowed else None
        self.run_id = (checkpoint_files.run_id_of(latest) if latest else None) or checkpoint_files.new_run_id()
        if latest is None:
            if allowed and checkpoint_files.list_folders(ckpt_dir):
                raise checkpoint.written_by_another_strategy(ckpt_dir, "folders", "another strategy", "ddp")
            return 0
        state = checkpoint.load(latest)
        notes = checkpoint.check_compatible(state, self.cfg, self.run.world_size, latest)
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scaler.is_enabled() and state.get("grad_scaler"):  # a run switched to fp16 starts a new scale
            self.scaler.load_state_dict(state["grad_scaler"])
        self.skipped.fill_(state.get("skipped_steps", 0))
        checkpoint.restore_rank_rng(state["rng"], self.run.rank, self.cfg.run.seed)
        self.resumed_state = {"divergence": state.get("divergence")}  # the loop's own state
        print0(f"resumed from {latest} at step {state['step']}" + "".join(f"; {n}" for n in notes))
        return state["step"]
