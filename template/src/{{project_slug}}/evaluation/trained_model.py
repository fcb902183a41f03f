"""A trained model in one process, from the checkpoint of any strategy (for `eval` and `sample`).

    checkpoints/step_00001000.pt     a replica: one file (strategies/ddp.py)
    checkpoints/step_00001000/       a sharded strategy's folder: FSDP2's shards read whole
                                     (strategies/fsdp/sharded_checkpoint.py), DeepSpeed's consolidated, a
                                     pipeline's files per layer and tensor rank joined

Each format is read by the strategy that writes it; this module only picks the reader and builds
the model the checkpoint was trained as, so eval and sample run in one process whatever the
training layout. A checkpoint is verified first (checkpoint_files.problem): the newest intact one is
used, a damaged one is passed over with one line naming it, and a damaged --checkpoint is refused.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import torch

from ..checkpoints import checkpoint, checkpoint_files
from ..data.tokens import read_meta
from ..models import build_model
from ..settings import optional_parts
from ..settings.config import Config, ConfigError, ModelConfig
from ..strategies import ddp
from ..strategies.fsdp import sharded_checkpoint as fsdp_checkpoint


def find_checkpoint(ckpt_dir: Path, say=lambda line: print(line, file=sys.stderr, flush=True)) -> Path | None:
    """The newest intact checkpoint in output_dir/checkpoints: a file step_N.pt or a sharded strategy's
    folder step_N/ (a run may hold both after switching run.strategy; the higher step wins). A
    damaged one is passed over with a line naming it; ConfigError when all of them are damaged."""
    found = [
        checkpoint_files.candidates(ckpt_dir, listing)
        for listing in (checkpoint_files.list_files, checkpoint_files.list_folders)
    ]
    damaged = []
    for path in sorted([p for kind in found for p in kind], key=lambda p: -checkpoint_files.step_of(p)):
        wrong = checkpoint_files.problem(path)
        if wrong is None:
            return path
        say(f"skipping damaged checkpoint {path}: {wrong}")
        damaged.append(path.name)
    if damaged:
        raise ConfigError(f"every checkpoint in {ckpt_dir} is damaged ({', '.join(damaged)}); pass --checkpoint")
    return None


def read_checkpoint(path: Path) -> dict:
    """A checkpoint as one dict, whatever wrote it: "model" (the whole model's state dict, as the
    unwrapped one-process model names it), "step", "config" and the rest of what train.py saved."""
    path = Path(path)
    if path.is_file():
        return ddp.read_checkpoint(path)
    if fsdp_checkpoint.is_dcp_checkpoint(path):
        return fsdp_checkpoint.read_checkpoint(path)
    return optional_parts.read_checkpoint_folder(path)


def load_trained_model(cfg: Config, ckpt: str | None, device: torch.device):
    """Model with the weights of `ckpt` (default: latest in output_dir/checkpoints), its step, the
    checkpoint's path and cfg with the checkpoint's model section."""
    ckpt_dir = Path(cfg.run.output_dir) / "checkpoints"
    if ckpt and not Path(ckpt).exists():
        raise ConfigError(f"--checkpoint {ckpt} does not exist; give a step_N.pt file or a step_N folder")
    path = Path(ckpt) if ckpt else find_checkpoint(ckpt_dir)
    if path is None:
        raise ConfigError(f"no checkpoint found in {ckpt_dir}; train first or pass --checkpoint")
    if ckpt and (wrong := checkpoint_files.problem(path)):
        raise ConfigError(f"--checkpoint {ckpt} is damaged: {wrong}; pass another checkpoint")
    # Intact; then its data. A folder's run state is read first: refused before its shards are
    # consolidated (minutes when large).
    state = read_checkpoint(path) if path.is_file() else None
    if state is not None:
        run_state = state
    elif fsdp_checkpoint.is_dcp_checkpoint(path):
        run_state = fsdp_checkpoint.run_state(path)
    else:
        run_state = optional_parts.checkpoint_folder_state(path)
    checkpoint.check_data(run_state, Path(cfg.data.dir), path, "give --checkpoint of a run trained on data.dir")
    state = state if state is not None else read_checkpoint(path)
    meta = read_meta(Path(cfg.data.dir))
    # The checkpoint's own model settings win, so eval and sample need no training overrides.
    cfg = dataclasses.replace(cfg, model=ModelConfig(**state["config"]["model"]))
    model = build_model(cfg, meta["vocab_size"], load_weights=False)  # the checkpoint has the weights
    model.load_state_dict(state["model"])
    return model.to(device), state["step"], path, cfg
