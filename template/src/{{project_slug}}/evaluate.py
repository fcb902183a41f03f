"""Validation loss and bits per byte (gpt, gpt3) or perplexity (bert) on the held-out shard.

    <package> eval                       # latest checkpoint (DDP file or DeepSpeed folder), one process
    <package> eval --checkpoint runs/checkpoints/step_00001000     # a DeepSpeed checkpoint folder
    torchrun --nproc-per-node 8 -m <package> eval   # same, validation batches spread over ranks

Bits per byte divides the summed loss by the UTF-8 bytes the target tokens stand for, so it
compares models with different tokenizers; special tokens (0 bytes) are left out of both sums.
A masked LM predicts only the masked positions (from both sides), so for bert the loss is the mean
over those and perplexity is exp(loss); bits per byte would not compare with a causal model's.
DeepSpeed checkpoints hold ZeRO shards; they are consolidated into one fp32 state dict here
(deepspeed.utils.zero_to_fp32), so eval and sample run in one process whatever the training layout.
"""

from __future__ import annotations

import argparse
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
from .splits import open_split
from .strategies.pipeline import consolidated_weights


@torch.no_grad()
def evaluate(model, data: TokenData, token_bytes: torch.Tensor, info: DistInfo, micro_batch: int,
             num_batches: int, autocast) -> dict:
    """Mean loss (nats/token) and bits per byte over the first num_batches micro batches of the
    split, dealt round-robin to the ranks: the result does not depend on the number of processes.
    Masked-LM data (mlm_data.MaskedTokenData): mean loss over the predicted positions and perplexity."""
    was_training = model.training
    model.eval()
    masked_lm = getattr(data, "masked_lm", False)
    num_batches = max(1, min(num_batches, data.num_sequences // micro_batch))
    sums = torch.zeros(4, dtype=torch.float64, device=info.device)  # loss, tokens, loss on bytes, bytes
    for b in range(info.rank, num_batches, info.world_size):
        x, y = data.batch(b * micro_batch, micro_batch)
        x, y = x.to(info.device), y.to(info.device)
        with autocast:
            per_token = model(x, y, loss_reduction="none").double()
        count = torch.tensor(per_token.numel(), device=info.device, dtype=torch.float64)
        if masked_lm:  # one value per predicted position; no bytes
            sums[:2] += torch.stack([per_token.sum(), count])
            continue
        nbytes = token_bytes[y.reshape(-1)]
        sums += torch.stack([per_token.sum(), count, (per_token * (nbytes > 0)).sum(), nbytes.sum().double()])
    all_reduce_sum(sums)
    model.train(was_training)
    loss = (sums[0] / sums[1]).item()
    if masked_lm:
        return {"val_loss": loss, "val_ppl": math.exp(loss), "val_tokens": int(sums[1].item())}
    bpb = (sums[2] / (math.log(2) * sums[3])).item() if sums[3] > 0 else float("nan")
    return {"val_loss": loss, "val_bpb": bpb, "val_tokens": int(sums[1].item())}


def format_scores(result: dict) -> str:
    """'val loss 5.1234 | val ppl 168.9' (bert) or '... | val bpb 1.2345' (gpt, gpt3)."""
    return " | ".join(f"{k.replace('_', ' ')} {v:.4f}" for k, v in result.items()
                      if k.startswith("val_") and isinstance(v, float))


def find_checkpoint(ckpt_dir: Path) -> Path | None:
    """The newest checkpoint in output_dir/checkpoints: a DDP file step_N.pt or a DeepSpeed folder
    step_N/ (a run may hold both after switching run.strategy; the higher step wins)."""
    from .strategies.deepspeed import find_latest as find_latest_folder  # imports no deepspeed

    found = [p for p in (checkpoint.find_latest(ckpt_dir), find_latest_folder(ckpt_dir)) if p is not None]
    return max(found, key=lambda p: int(p.name.removeprefix("step_").removesuffix(".pt"))) if found else None


def load_checkpoint_state(path: Path) -> dict:
    """A checkpoint as one dict, whatever wrote it: "model" (a full fp32 state dict for the
    unwrapped model), "step", "config" and the rest of what train.py saved.

    A file is a DDP checkpoint. A folder is a DeepSpeed one: its mp_rank_00_model_states.pt holds
    train.py's client state and, for ZeRO 0, the weights; ZeRO 1-3 weights are consolidated from
    the fp32 partitions of the optimizer shards by DeepSpeed's zero_to_fp32 (on the CPU, any
    number of shards, no process group)."""
    path = Path(path)
    if path.is_file():
        return checkpoint.load(path)
    # mp_rank_00_*: the data-parallel group's file (pipeline checkpoints add layer_* files beside it).
    states = sorted(path.glob("mp_rank_00_model_states.pt")) or sorted(path.glob("*model_states.pt")) if path.is_dir() else []
    if not states:
        raise ConfigError(f"{path} is neither a checkpoint file nor a DeepSpeed checkpoint folder "
                          "(no *model_states.pt); pass --checkpoint with one of those")
    state = torch.load(states[0], map_location="cpu", weights_only=False)
    weights = consolidated_weights(path, state["config"]["model"])  # gpt3 layouts: files per layer
    sharded = any(path.glob("*optim_states.pt"))  # ZeRO 1-3 write per-rank optimizer shards
    if weights is None and state.get("ds_config", {}).get("zero_optimization", {}).get("stage", int(sharded)) > 0:
        from .strategies.deepspeed import import_deepspeed

        import_deepspeed()  # sets DS_ACCELERATOR=cpu where there is no GPU, or says how to install
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        weights = get_fp32_state_dict_from_zero_checkpoint(str(path.parent), tag=path.name)
    elif weights is None:
        weights = state["module"]  # ZeRO 0: the module's own state dict
    client = {k: v for k, v in state.items() if k not in _DEEPSPEED_KEYS}
    return {**client, "model": {k: v.float() if v.is_floating_point() else v for k, v in weights.items()}}


# What DeepSpeed itself stores beside train.py's client state in *model_states.pt.
_DEEPSPEED_KEYS = {"module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "shared_params",
                   "frozen_param_fragments", "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names",
                   "skipped_steps", "global_steps", "global_samples", "dp_world_size", "mp_world_size", "ds_config",
                   "ds_version"}


def load_trained_model(cfg: Config, ckpt: str | None, device: torch.device):
    """Model with the weights of `ckpt` (default: latest in output_dir/checkpoints), and its step."""
    ckpt_dir = Path(cfg.run.output_dir) / "checkpoints"
    if ckpt and not Path(ckpt).exists():
        raise ConfigError(f"--checkpoint {ckpt} does not exist; give a step_N.pt file or a DeepSpeed step_N folder")
    path = Path(ckpt) if ckpt else find_checkpoint(ckpt_dir)
    if path is None:
        raise ConfigError(f"no checkpoint found in {ckpt_dir}; train first or pass --checkpoint")
    state = load_checkpoint_state(path)
    meta = read_meta(Path(cfg.data.dir))
    # The checkpoint's own model settings win, so eval and sample need no training overrides.
    cfg = dataclasses.replace(cfg, model=ModelConfig(**state["config"]["model"]))
    if cfg.model.arch == "bert":
        from .models.bert import build_bert

        model = build_bert(cfg, meta["vocab_size"], load_weights=False)  # the checkpoint has them
    else:
        model = build_model(cfg, meta["vocab_size"])
    model.load_state_dict(state["model"])
    return model.to(device), state["step"], path, cfg


def run_eval(cfg: Config, ckpt: str | None = None, num_batches: int | None = None) -> dict:
    info = init_distributed(cfg.run.device)
    try:
        model, step, path, cfg = load_trained_model(cfg, ckpt, info.device)
        data_dir = Path(cfg.data.dir)
        val = open_split(cfg, data_dir, "val")
        token_bytes = torch.from_numpy(token_byte_lengths(load_tokenizer(data_dir / read_meta(data_dir)["tokenizer"])))
        result = evaluate(model, val, token_bytes.to(info.device), info, cfg.batch.micro_batch_size,
                          num_batches or cfg.logging.eval_batches, autocast_context(info.device, cfg.run.dtype))
        result = {"step": step, "checkpoint": str(path), **result}
        print0(f"step {step} | {format_scores(result)} | {result['val_tokens']:,} tokens | {path}")
        if info.is_main:
            (Path(cfg.run.output_dir) / "eval.json").write_text(json.dumps(result, indent=2))
        return result
    finally:
        shutdown()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", help="checkpoint file or folder (default: latest)")
    p.add_argument("--batches", type=int, help="micro batches per rank (default: logging.eval_batches)")


def run(cfg: Config, args: argparse.Namespace) -> int:
    run_eval(cfg, args.checkpoint, args.batches)
    return 0
