"""Validation loss and bits per byte, or a masked LM's perplexity and masked-token accuracy.

    <package> eval                       # the latest checkpoint, one process
    <package> eval --checkpoint runs/checkpoints/step_00001000.pt   # a given one (a file or a folder)
    torchrun --nproc-per-node 8 -m <package> eval   # same, validation batches spread over ranks

Bits per byte divides the summed loss by the UTF-8 bytes the target tokens stand for, so it
compares models with different tokenizers; special tokens (0 bytes) are left out of both sums.
A masked LM predicts only the masked positions (from both sides), so its loss is the mean over
those and perplexity is exp(loss); bits per byte would not compare with a causal model's. Its
batches score themselves (the family's own, models/<family>/). The model comes from
trained_model.py, which reads every strategy's checkpoints.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
from pathlib import Path

import torch

from ..data.splits import open_split
from ..data.tokens import TokenData, bos_id, data_tokenizer, token_byte_lengths
from ..models.family import family
from ..runtime.distributed import (
    DistInfo,
    all_reduce_sum,
    autocast_context,
    init_distributed,
    print0,
    shutdown,
    start_timeout,
)
from ..runtime.run_context import resolve_run
from ..settings.bounds import count
from ..settings.config import Config, ConfigError
from . import tasks
from .trained_model import load_trained_model


@torch.no_grad()
def evaluate(
    model, data: TokenData, token_bytes: torch.Tensor, info: DistInfo, micro_batch: int, num_batches: int, autocast
) -> dict:
    """Mean loss (nats/token) and bits per byte over the first num_batches micro batches of the
    split, dealt round-robin to the ranks: the result does not depend on the number of processes.
    A family's own batches may score themselves (a masked LM's: loss over the predicted positions,
    perplexity and accuracy): their score(model, x, y, autocast) gives a batch's sums and scores(sums)
    the result."""
    was_training = model.training
    model.eval()
    score = getattr(data, "score", None) or functools.partial(next_token_sums, token_bytes=token_bytes)
    num_batches = max(1, min(num_batches, data.num_sequences // micro_batch))
    sums = torch.zeros(4, dtype=torch.float64, device=info.device)
    # Every rank runs the same number of forwards: a strategy that shards the weights gathers them
    # from all ranks in each forward, so a rank left without a batch (fewer batches than ranks)
    # repeats batch 0 and discards it, or the others would wait for it in their gathers.
    rounds = -(-num_batches // info.world_size)
    for b in range(info.rank, rounds * info.world_size, info.world_size):
        counted = b < num_batches
        x, y = data.batch((b if counted else 0) * micro_batch, micro_batch)
        found = score(model, x.to(info.device), y.to(info.device), autocast)
        if counted:
            sums += found
    all_reduce_sum(sums)
    model.train(was_training)
    return data.scores(sums) if hasattr(data, "scores") else next_token_scores(sums)


def next_token_sums(model, x: torch.Tensor, y: torch.Tensor, autocast, token_bytes: torch.Tensor) -> torch.Tensor:
    """One batch's summed loss, tokens, loss on tokens that stand for bytes, and those bytes (fp64)."""
    with autocast:
        per_token = model(x, y, loss_reduction="none").double()
    count = torch.tensor(per_token.numel(), device=per_token.device, dtype=torch.float64)
    nbytes = token_bytes[y.reshape(-1)]
    return torch.stack([per_token.sum(), count, (per_token * (nbytes > 0)).sum(), nbytes.sum().double()])


def next_token_scores(sums: torch.Tensor) -> dict:
    loss = (sums[0] / sums[1]).item()
    bpb = (sums[2] / (math.log(2) * sums[3])).item() if sums[3] > 0 else float("nan")
    return {"val_loss": loss, "val_bpb": bpb, "val_tokens": int(sums[1].item())}


def val_scores(result: dict) -> dict:
    """The scores of an evaluation result (val_loss, val_bpb or val_ppl), without counts."""
    return {k: v for k, v in result.items() if k.startswith("val_") and isinstance(v, float)}


def format_scores(result: dict) -> str:
    """'val loss 5.1234 | val bpb 1.2345' (or a masked LM's '... | val ppl 168.9'): the eval
    command's line and the one train.py prints after each evaluation."""
    return " | ".join(f"{k.replace('_', ' ')} {v:.4f}" for k, v in val_scores(result).items())


def run_eval(cfg: Config, ckpt: str | None = None, num_batches: int | None = None) -> dict:
    info = init_distributed(cfg.run.device, start_timeout=start_timeout(cfg.run))
    try:
        model, step, path, cfg = load_trained_model(cfg, ckpt, info.device)
        run = resolve_run(cfg, info)  # the checkpoint's config on this process
        data_dir = Path(cfg.data.dir)
        val = open_split(cfg, data_dir, "val", run.family)
        token_bytes = torch.from_numpy(token_byte_lengths(data_tokenizer(data_dir)))
        result = evaluate(
            model,
            val,
            token_bytes.to(run.device),
            run,
            run.micro_batch_size,
            num_batches or cfg.logging.eval_batches,
            autocast_context(run.device, run.precision),
        )
        return _written(
            cfg, info, step, path, result, f"{format_scores(result)} | {result['val_tokens']:,} tokens | {path}"
        )
    finally:
        shutdown()


def all_finite(value) -> bool:
    """Whether every number in a result (nested dicts and lists) is finite."""
    if isinstance(value, dict):
        return all(all_finite(v) for v in value.values())
    if isinstance(value, list):
        return all(all_finite(v) for v in value)
    return not isinstance(value, float) or math.isfinite(value)


def _written(cfg: Config, info: DistInfo, step: int, path, result: dict, line: str) -> dict:
    """The result with its step and checkpoint, printed once and written to output_dir/eval.json."""
    result = {"step": step, "checkpoint": str(path), **result}
    print0(f"step {step} | {line}")
    if info.is_main and not all_finite(result):  # an earlier eval.json is worth more than a NaN
        raise ConfigError(
            f"a score came out NaN or infinite; {Path(cfg.run.output_dir) / 'eval.json'} is left as it was"
        )
    if info.is_main:
        (Path(cfg.run.output_dir) / "eval.json").write_text(json.dumps(result, indent=2))
    return result


def run_tasks(cfg: Config, names: str, ckpt: str | None, bundle: str | None, max_per_task: int | None) -> dict:
    """`eval --tasks core|label,...`: accuracy per task and CORE (evaluation/tasks.py), eval.json."""
    if not family(cfg.model.arch).causal:
        raise ConfigError(
            f"--tasks: the bundle's tasks score continuations of a causal model; model.arch={cfg.model.arch} is "
            "masked, so `eval` without --tasks reports its masked-token loss and perplexity"
        )
    data_dir = Path(cfg.data.dir)
    wanted = None if names == "core" else [name.strip() for name in names.split(",") if name.strip()]
    if wanted == []:
        raise ConfigError(f"--tasks {names!r} names no task; give 'core' (every task) or labels a,b")
    task_list = tasks.load_bundle(Path(bundle) if bundle else tasks.bundle_path(cfg), wanted)
    info = init_distributed(cfg.run.device, start_timeout=start_timeout(cfg.run))
    try:
        model, step, path, cfg = load_trained_model(cfg, ckpt, info.device)
        run = resolve_run(cfg, info)  # the checkpoint's config on this process
        tok = data_tokenizer(data_dir)
        autocast = autocast_context(run.device, run.precision)
        result = tasks.evaluate_tasks(
            model, tok, bos_id(tok), task_list, cfg.model.sequence_len, info, autocast, max_per_task
        )
        return _written(cfg, info, step, path, result, f"{path}\n{tasks.table(result)}")
    finally:
        shutdown()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", help="checkpoint file or folder (default: latest)")
    p.add_argument("--batches", type=count, help="micro batches per rank (default: logging.eval_batches)")
    p.add_argument("--tasks", help="'core' (every task of the bundle) or task labels a,b: accuracy and CORE")
    p.add_argument("--bundle", help="task bundle folder (default: eval.bundle_dir, else <data.dir>/eval_bundle)")
    p.add_argument("--max-per-task", type=count, help="items per task at most (a fixed shuffle)")


def run(cfg: Config, args: argparse.Namespace) -> int:
    if args.tasks:
        run_tasks(cfg, args.tasks, args.checkpoint, args.bundle, args.max_per_task)
    else:
        run_eval(cfg, args.checkpoint, args.batches)
    return 0
