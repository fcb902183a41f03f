"""Rules that relate settings to each other, written once and used by `check`, train start
and the template's post-generation task.

Each rule returns messages that name the field, the value, why it is wrong and what to do.
No torch here: the rules must run where only copier and PyYAML are installed.
"""

from __future__ import annotations

from .config import Config, ConfigError
from .sizes import model_shape

__all__ = ["model_shape", "resolve_grad_accum", "check_config", "parallel_problems", "require_valid"]


def resolve_grad_accum(cfg: Config, data_parallel_size: int) -> int:
    """Micro steps per optimizer step so that global = micro * accum * data-parallel size."""
    b = cfg.batch
    per_step = b.micro_batch_size * data_parallel_size
    if b.grad_accum_steps is None:
        if b.global_batch_size % per_step:
            raise ConfigError(
                f"batch.global_batch_size={b.global_batch_size} is not a multiple of batch.micro_batch_size "
                f"({b.micro_batch_size}) x data-parallel size ({data_parallel_size}) = {per_step}; "
                f"set it to {max(per_step, b.global_batch_size // per_step * per_step)} or change micro_batch_size"
            )
        return b.global_batch_size // per_step
    if b.grad_accum_steps * per_step != b.global_batch_size:
        raise ConfigError(
            f"batch.global_batch_size={b.global_batch_size} != micro_batch_size {b.micro_batch_size} x "
            f"grad_accum_steps {b.grad_accum_steps} x data-parallel size {data_parallel_size} "
            f"= {b.grad_accum_steps * per_step}; set batch.grad_accum_steps=null to derive it"
        )
    return b.grad_accum_steps


def check_config(cfg: Config, world_size: int | None = None) -> list[str]:
    """All problems of a config for a world size (default: nodes x gpus_per_node)."""
    problems: list[str] = []
    world = world_size or cfg.cluster.nodes * cfg.cluster.gpus_per_node
    positive = {
        "cluster.nodes": cfg.cluster.nodes,
        "cluster.gpus_per_node": cfg.cluster.gpus_per_node,
        "model.sequence_len": cfg.model.sequence_len,
        "batch.global_batch_size": cfg.batch.global_batch_size,
        "batch.micro_batch_size": cfg.batch.micro_batch_size,
        "schedule.max_steps": cfg.schedule.max_steps,
        "data.vocab_size": cfg.data.vocab_size,
        "checkpoint.keep_last": cfg.checkpoint.keep_last,
        "logging.every_steps": cfg.logging.every_steps,
        "logging.eval_batches": cfg.logging.eval_batches,
    }
    problems += [f"{name}={value} must be at least 1" for name, value in positive.items() if value < 1]
    non_negative = {
        "optim.lr": cfg.optim.lr,
        "optim.weight_decay": cfg.optim.weight_decay,
        "optim.grad_clip": cfg.optim.grad_clip,
        "schedule.warmup_steps": cfg.schedule.warmup_steps,
        "checkpoint.every_steps": cfg.checkpoint.every_steps,
        "logging.eval_every_steps": cfg.logging.eval_every_steps,
    }
    problems += [f"{name}={value} must not be negative" for name, value in non_negative.items() if value < 0]
    if not 0 < cfg.data.val_fraction < 1:
        problems.append(f"data.val_fraction={cfg.data.val_fraction} must be between 0 and 1, e.g. 0.005")
    if not 0 <= cfg.schedule.min_lr_ratio <= 1:
        problems.append(f"schedule.min_lr_ratio={cfg.schedule.min_lr_ratio} must be between 0 and 1")
    if cfg.schedule.warmup_steps > cfg.schedule.max_steps:
        problems.append(
            f"schedule.warmup_steps={cfg.schedule.warmup_steps} exceeds schedule.max_steps={cfg.schedule.max_steps}; "
            "lower the warmup"
        )
    try:
        shape = model_shape(cfg.model.size, cfg.model.n_kv_head, cfg.model.arch)
    except ConfigError as exc:
        return problems + [str(exc)]
    problems += parallel_problems(cfg, shape, world)
    arch = cfg.model.arch
    if arch != "gpt" and cfg.model.n_kv_head is not None:
        problems.append(f"model.n_kv_head={cfg.model.n_kv_head} applies to model.arch=gpt only; set it to null")
    if arch != "bert" and cfg.model.pretrained:
        problems.append(
            f"model.pretrained={cfg.model.pretrained!r}: starting from local weights is built for "
            f'model.arch=bert; set it to "" for {arch}'
        )
    limit = {"bert": 512}.get(arch)
    if limit and cfg.model.sequence_len > limit:
        problems.append(
            f"model.sequence_len={cfg.model.sequence_len} exceeds BERT's {limit} position embeddings; "
            f"use at most {limit}"
        )
    if shape["n_kv_head"] < 1 or shape["n_head"] % shape["n_kv_head"]:
        problems.append(
            f"model.n_kv_head={shape['n_kv_head']} must divide the {shape['n_head']} query heads of "
            f"model.size={cfg.model.size}; use a divisor of {shape['n_head']} or null"
        )
    if shape["n_embd"] % shape["n_head"] or shape["n_embd"] // shape["n_head"] % 2:
        problems.append(
            f"model.size={cfg.model.size} needs a width divisible into heads of even size (rotary embeddings pair dimensions)"
        )
    if min(cfg.batch.micro_batch_size, cfg.batch.global_batch_size, world) >= 1:
        try:
            resolve_grad_accum(cfg, cfg.data_parallel_size(world))
        except ConfigError as exc:
            origin = "" if world_size else f" = {cfg.cluster.nodes} nodes x {cfg.cluster.gpus_per_node} GPUs per node"
            layout = (
                f", data-parallel {cfg.data_parallel_size(world)} = {world} / (tensor {cfg.parallel.tensor} x "
                f"pipeline {cfg.parallel.pipeline})"
                if cfg.parallel.tensor * cfg.parallel.pipeline > 1
                else ""
            )
            problems.append(f"{exc} (for {world} processes{origin}{layout})")
    return problems


def parallel_problems(cfg: Config, shape: dict, world: int) -> list[str]:
    """Tensor and pipeline degrees against the world size, the model's shape and the strategy."""
    tp, pp, arch = cfg.parallel.tensor, cfg.parallel.pipeline, cfg.model.arch
    if tp < 1 or pp < 1:
        return [f"parallel.tensor={tp} and parallel.pipeline={pp} must be at least 1"]
    if (tp, pp) == (1, 1):
        return []
    if arch != "gpt3":
        return [
            f"parallel.tensor={tp}, parallel.pipeline={pp}: tensor and pipeline parallelism are built for "
            f"model.arch=gpt3 only (this is {arch}); set both to 1 and scale {arch} with ZeRO instead"
        ]
    problems = []
    if world % (tp * pp):
        problems.append(
            f"parallel.tensor {tp} x parallel.pipeline {pp} = {tp * pp} does not divide the {world} "
            f"processes; choose degrees whose product divides {world}"
        )
    if tp > cfg.cluster.gpus_per_node:
        problems.append(
            f"parallel.tensor={tp} exceeds cluster.gpus_per_node={cfg.cluster.gpus_per_node}: tensor "
            "parallelism all-reduces in every layer and must stay inside one node's NVLink"
        )
    if shape["n_head"] % tp:
        problems.append(
            f"parallel.tensor={tp} does not divide the {shape['n_head']} attention heads of "
            f"model.size={cfg.model.size}; use a divisor of {shape['n_head']}"
        )
    if shape["n_layer"] % pp:
        problems.append(
            f"parallel.pipeline={pp} does not divide the {shape['n_layer']} layers of "
            f"model.size={cfg.model.size}; use a divisor of {shape['n_layer']}"
        )
    if cfg.run.strategy != "deepspeed":
        problems.append(
            f"parallel.tensor={tp}/parallel.pipeline={pp} run on DeepSpeed's pipeline engine and "
            "tensor-parallel layers; set run.strategy=deepspeed"
        )
    elif cfg.deepspeed.zero_stage > 1:
        problems.append(
            f"deepspeed.zero_stage={cfg.deepspeed.zero_stage} with parallel.tensor={tp}, parallel.pipeline={pp}: "
            "these layouts run on DeepSpeed's pipeline engine, which shards only optimizer state; "
            "use deepspeed.zero_stage=1 (or 0)"
        )
    return problems


def require_valid(cfg: Config, world_size: int | None = None) -> None:
    problems = check_config(cfg, world_size)
    if problems:
        raise ConfigError("\n".join(problems))
