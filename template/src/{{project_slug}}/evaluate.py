"""Validation loss and bits per byte on the held-out shard.

    <package> eval                       # latest checkpoint, one process
    torchrun --nproc-per-node 8 -m <package> eval   # same, validation batches spread over ranks

Bits per byte divides the summed loss by the UTF-8 bytes the target tokens stand for, so it
compares models with different tokenizers; special tokens (0 bytes) are left out of both sums.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch

from . import checkpoint
from .config import Config, ConfigError, ModelConfig
from .data import TokenData, load_tokenizer, read_meta, token_byte_lengths
from .distributed import DistInfo, all_reduce_sum, autocast_context, init_distributed, print0, shutdown
from .models import build_model


@torch.no_grad()
def evaluate(model, data: TokenData, token_bytes: torch.Tensor, info: DistInfo, micro_batch: int,
             num_batches: int, autocast) -> dict:
    """Mean loss (nats/token) and bits per byte over the first num_batches micro batches of the
    split, dealt round-robin to the ranks: the result does not depend on the number of processes."""
    was_training = model.training
    model.eval()
    num_batches = max(1, min(num_batches, data.num_sequences // micro_batch))
    sums = torch.zeros(4, dtype=torch.float64, device=info.device)  # loss, tokens, loss on bytes, bytes
    for b in range(info.rank, num_batches, info.world_size):
        x, y = data.batch(b * micro_batch, micro_batch)
        x, y = x.to(info.device), y.to(info.device)
        with autocast:
            per_token = model(x, y, loss_reduction="none").double()
        nbytes = token_bytes[y.reshape(-1)]
        sums += torch.stack([per_token.sum(), torch.tensor(per_token.numel(), device=info.device, dtype=torch.float64),
                             (per_token * (nbytes > 0)).sum(), nbytes.sum().double()])
    all_reduce_sum(sums)
    model.train(was_training)
    loss = (sums[0] / sums[1]).item()
    bpb = (sums[2] / (math.log(2) * sums[3])).item() if sums[3] > 0 else float("nan")
    return {"val_loss": loss, "val_bpb": bpb, "val_tokens": int(sums[1].item())}


def load_trained_model(cfg: Config, ckpt: str | None, device: torch.device):
    """Model with the weights of `ckpt` (default: latest in output_dir/checkpoints), and its step."""
    path = Path(ckpt) if ckpt else checkpoint.find_latest(Path(cfg.run.output_dir) / "checkpoints")
    if path is None or not path.is_file():
        raise ConfigError(f"no checkpoint found in {Path(cfg.run.output_dir) / 'checkpoints'}; train first or pass --checkpoint")
    state = checkpoint.load(path)
    meta = read_meta(Path(cfg.data.dir))
    # The checkpoint's own model settings win, so eval and sample need no training overrides.
    cfg = dataclasses.replace(cfg, model=ModelConfig(**state["config"]["model"]))
    model = build_model(cfg, meta["vocab_size"])
    model.load_state_dict(state["model"])
    return model.to(device), state["step"], path, cfg


def run_eval(cfg: Config, ckpt: str | None = None, num_batches: int | None = None) -> dict:
    info = init_distributed(cfg.run.device)
    try:
        model, step, path, cfg = load_trained_model(cfg, ckpt, info.device)
        data_dir = Path(cfg.data.dir)
        val = TokenData.open(data_dir, "val", cfg.model.sequence_len)
        token_bytes = torch.from_numpy(token_byte_lengths(load_tokenizer(data_dir / read_meta(data_dir)["tokenizer"])))
        result = evaluate(model, val, token_bytes.to(info.device), info, cfg.batch.micro_batch_size,
                          num_batches or cfg.logging.eval_batches, autocast_context(info.device, cfg.run.dtype))
        result = {"step": step, "checkpoint": str(path), **result}
        print0(f"step {step} | val loss {result['val_loss']:.4f} | val bpb {result['val_bpb']:.4f} | "
               f"{result['val_tokens']:,} tokens | {path}")
        if info.is_main:
            (Path(cfg.run.output_dir) / "eval.json").write_text(json.dumps(result, indent=2))
        return result
    finally:
        shutdown()
