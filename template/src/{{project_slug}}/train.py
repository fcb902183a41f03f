"""The training loop: DDP over torchrun ranks, gradient accumulation, bf16 autocast, optional
torch.compile, AdamW with warmup + cosine, clipping, metrics, evaluation and checkpoints.

    torchrun --standalone --nproc-per-node 8 -m <package> train [key=value ...]
    <package> launch devmachine            # builds that torchrun command for you

Each rank reads its own slice of every global batch; the stream position follows from the step,
so a resumed run reads exactly the data it would have read.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from . import checkpoint
from .config import Config, ConfigError, save_config
from .data import TokenData, load_tokenizer, micro_batch_start, read_meta, token_byte_lengths
from .distributed import DistInfo, all_reduce_mean, autocast_context, barrier, init_distributed, print0, shutdown
from .evaluate import evaluate
from .metrics import MetricsLogger, format_step, mfu, peak_flops
from .models import build_model
from .rules import require_valid, resolve_grad_accum


def lr_at(step: int, cfg: Config) -> float:
    """Linear warmup to optim.lr, then cosine decay to lr * min_lr_ratio at max_steps."""
    s, peak = cfg.schedule, cfg.optim.lr
    if step < s.warmup_steps:
        return peak * (step + 1) / s.warmup_steps
    progress = min(1.0, (step - s.warmup_steps) / max(1, s.max_steps - s.warmup_steps))
    return peak * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def build_optimizer(model: torch.nn.Module, cfg: Config, device: torch.device) -> torch.optim.Optimizer:
    # Weight decay shrinks matrices toward zero; on the embedding table it only hurts rare tokens.
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and not n.startswith("wte")]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and not n.startswith("wte"))]
    o = cfg.optim
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": o.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, fused=device.type == "cuda",
    )


def run_training(cfg: Config) -> int:
    info = init_distributed(cfg.run.device)
    try:
        return _train(cfg, info)
    finally:
        shutdown()


def _resume(cfg: Config, ckpt_dir: Path, model, optimizer) -> int:
    latest = checkpoint.find_latest(ckpt_dir) if cfg.checkpoint.resume else None
    if latest is None:
        return 0
    state = checkpoint.load(latest)
    if state["fingerprint"] != cfg.model_fingerprint():
        raise ConfigError(
            f"{latest} was written with a different model or global batch (model section / "
            "batch.global_batch_size changed); restore those settings, use a new run.output_dir, "
            "or set checkpoint.resume=false to start over"
        )
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    checkpoint.restore_rng(state["rng"])
    print0(f"resumed from {latest} at step {state['step']}")
    return state["step"]


def _train(cfg: Config, info: DistInfo) -> int:
    require_valid(cfg, info.world_size)
    accum = resolve_grad_accum(cfg, info.world_size)
    device, T = info.device, cfg.model.sequence_len
    out = Path(cfg.run.output_dir)
    ckpt_dir = out / "checkpoints"
    data_dir = Path(cfg.data.dir)
    meta = read_meta(data_dir)
    train_data = TokenData.open(data_dir, "train", T)
    val_data = TokenData.open(data_dir, "val", T)
    token_bytes = torch.from_numpy(token_byte_lengths(load_tokenizer(data_dir / meta["tokenizer"]))).to(device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True

    torch.manual_seed(cfg.run.seed)  # same init on every rank; DDP also broadcasts rank 0's weights
    model = build_model(cfg, meta["vocab_size"]).to(device)
    optimizer = build_optimizer(model, cfg, device)
    start_step = _resume(cfg, ckpt_dir, model, optimizer)
    if info.is_main:
        out.mkdir(parents=True, exist_ok=True)
        save_config(cfg, out / "config.yaml")

    # compile first, then DDP: DDP's bucketing hooks see the compiled module's parameters.
    runnable = torch.compile(model) if cfg.run.compile and device.type == "cuda" else model
    if info.world_size > 1:
        runnable = DDP(runnable, device_ids=[device.index] if device.type == "cuda" else None)
    autocast = autocast_context(device, cfg.run.dtype)

    b, s = cfg.batch, cfg.schedule
    tokens_per_step = b.global_batch_size * T
    flops_per_token, peak = model.flops_per_token(), peak_flops(device)
    print0(
        f"model {cfg.model.size}: {model.num_params():,} parameters | {info.world_size} process(es) on {device.type} | "
        f"global batch {b.global_batch_size} = micro {b.micro_batch_size} x accum {accum} x {info.world_size} ranks | "
        f"{tokens_per_step:,} tokens/step | steps {start_step}->{s.max_steps}"
    )
    if start_step >= s.max_steps:
        print0(f"already trained to step {start_step} (schedule.max_steps={s.max_steps}); nothing to do")
        return 0

    logger = MetricsLogger(out, info.is_main, cfg.logging.tensorboard)
    window_start, window_steps = time.perf_counter(), 0
    for step in range(start_step, s.max_steps):
        lr = lr_at(step, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss_sum = torch.zeros((), device=device)
        for micro in range(accum):
            first = micro_batch_start(step, micro, info.rank, b.global_batch_size, b.micro_batch_size, accum)
            x, y = train_data.batch(first, b.micro_batch_size)
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            # Gradients are all-reduced only on the last micro step of the accumulation.
            sync = info.world_size == 1 or micro == accum - 1
            with nullcontext() if sync else runnable.no_sync():
                with autocast:
                    loss = runnable(x, y)
                (loss / accum).backward()
            loss_sum += loss.detach()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.optim.grad_clip or float("inf"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        done, window_steps = step + 1, window_steps + 1
        last = done == s.max_steps

        if done % cfg.logging.every_steps == 0 or last:
            loss_value = all_reduce_mean(loss_sum / accum).item()  # .item() also waits for the GPU
            step_time = (time.perf_counter() - window_start) / window_steps
            record = {
                "step": done,
                "loss": loss_value,
                "lr": lr,
                "grad_norm": grad_norm.item(),
                "tokens_per_sec": tokens_per_step / step_time,
                "mfu": mfu(flops_per_token, tokens_per_step / step_time, info.world_size, peak),
                "step_time": step_time,
                "tokens": done * tokens_per_step,
            }
            logger.log(record)
            print0(format_step(record, s.max_steps))
            window_start, window_steps = time.perf_counter(), 0

        if (cfg.logging.eval_every_steps and done % cfg.logging.eval_every_steps == 0) or last:
            result = evaluate(model, val_data, token_bytes, info, b.micro_batch_size, cfg.logging.eval_batches, autocast)
            logger.log({"step": done, "val_loss": result["val_loss"], "val_bpb": result["val_bpb"]})
            print0(f"step {done:>6}/{s.max_steps} | val loss {result['val_loss']:.4f} | val bpb {result['val_bpb']:.4f}")
            window_start, window_steps = time.perf_counter(), 0

        if (cfg.checkpoint.every_steps and done % cfg.checkpoint.every_steps == 0) or last:
            if info.is_main:
                state = {
                    "step": done,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "rng": checkpoint.rng_state(),
                    "config": cfg.to_dict(),
                    "fingerprint": cfg.model_fingerprint(),
                    "world_size": info.world_size,
                }
                path = checkpoint.save(ckpt_dir, done, state, cfg.checkpoint.keep_last)
                print0(f"saved {path}")
            barrier()  # nobody runs ahead of a checkpoint it may need to resume from
            window_start, window_steps = time.perf_counter(), 0

    logger.close()
    print0(f"done: metrics in {out / 'metrics.jsonl'}, checkpoints in {ckpt_dir}")
    return 0
