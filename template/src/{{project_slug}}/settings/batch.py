"""The batch arithmetic: global batch = micro batch x accumulation x data-parallel size, under strong
scaling (the global batch stays whatever the world) or weak (the batch per rank stays). Torch-free and
below everything: the Run resolves a run's accumulation with it (runtime/run_context.py), and planning's
rules, plan's scaling table and copier's train.yaml ask it of other world sizes.
"""

from __future__ import annotations

import dataclasses
import math

from .bounds import MAX_COUNT
from .config import Config, ConfigError


def per_rank_batch(cfg: Config) -> int:
    """Sequences one data-parallel rank takes per optimizer step (micro x accumulation) in the config's
    own shape, cluster.nodes x cluster.gpus_per_node: what batch.scaling=weak keeps on any world size."""
    b = cfg.batch
    if b.grad_accum_steps is not None:
        return b.micro_batch_size * b.grad_accum_steps
    return b.global_batch_size // cfg.data_parallel_size(cfg.cluster.nodes * cfg.cluster.gpus_per_node)


def global_batch_at(cfg: Config, data_parallel_size: int) -> int:
    """The global batch of a run with this many data-parallel ranks. Strong scaling (the default):
    batch.global_batch_size whatever the world, so the recipe and the tokens per step stay and the
    accumulation absorbs the change. Weak: the per-rank batch stays and the global batch follows."""
    if cfg.batch.scaling == "weak":
        return per_rank_batch(cfg) * data_parallel_size
    return cfg.batch.global_batch_size


def micro_batch_at(global_batch: int, data_parallel_size: int, largest: int) -> int:
    """The micro batch that splits global_batch over data_parallel_size ranks: the largest one up to
    `largest` that divides each rank's share, so only the accumulation changes where it can; `largest`
    itself when the share is no whole number (resolve_grad_accum then says what would fix it).
    config/train.yaml renders its micro batch with this (largest: the family's), so `copier update
    --data nodes=N` and plan's scaling table pick the same one."""
    if data_parallel_size < 1 or global_batch % data_parallel_size:
        return largest
    share = global_batch // data_parallel_size  # any size: only the divisors up to `largest` are tried
    return next((m for m in range(largest, 0, -1) if share % m == 0), largest)


def at_world_size(cfg: Config, world_size: int) -> Config:
    """cfg as a run on world_size processes trains: under weak scaling its batch section is set to that
    world's global batch with the accumulation written out (so resolving it again changes nothing)."""
    if cfg.batch.scaling != "weak":
        return cfg
    dp = cfg.data_parallel_size(world_size)
    batch = dataclasses.replace(
        cfg.batch,
        global_batch_size=global_batch_at(cfg, dp),
        grad_accum_steps=per_rank_batch(cfg) // cfg.batch.micro_batch_size,
    )
    return dataclasses.replace(cfg, batch=batch)


def scaling_note(cfg: Config, world_size: int) -> str:
    """What the start line says of batch.scaling, for a config at_world_size has resolved."""
    b, configured = cfg.batch, cfg.data_parallel_size(cfg.cluster.nodes * cfg.cluster.gpus_per_node)
    if b.scaling != "weak":
        return f"strong scaling: global batch {b.global_batch_size} on any number of processes"
    return (
        f"weak scaling: {per_rank_batch(cfg)} sequences per data-parallel rank, so the global batch grows with "
        f"the processes ({per_rank_batch(cfg) * configured} on the config's {cfg.cluster.nodes} x "
        f"{cfg.cluster.gpus_per_node}, {global_batch_at(cfg, cfg.data_parallel_size(world_size))} here)"
    )


def data_parallel_split(cfg: Config, world_size: int, training: bool = True) -> tuple[int, int | None]:
    """(data-parallel size, micro steps per optimizer step) of cfg on world_size processes; the
    accumulation is None unless training (eval and sample take no optimizer steps)."""
    data_parallel = cfg.data_parallel_size(world_size)
    return data_parallel, resolve_grad_accum(cfg, data_parallel) if training else None


def resolve_grad_accum(cfg: Config, data_parallel_size: int) -> int:
    """Micro steps per optimizer step so that global = micro * accum * data-parallel size."""
    b = cfg.batch
    if b.scaling != "weak":
        return _split(b, b.global_batch_size, data_parallel_size)
    # Weak: the global batch follows the ranks, so what must split is the config's own shape (a config
    # at_world_size resolved already holds this world's global batch and its accumulation).
    resolved = b.grad_accum_steps is not None and b.global_batch_size == per_rank_batch(cfg) * data_parallel_size
    if not resolved:
        configured = cfg.data_parallel_size(cfg.cluster.nodes * cfg.cluster.gpus_per_node)
        _split(b, b.global_batch_size, configured, "in the config's shape (batch.scaling=weak)")
    return per_rank_batch(cfg) // b.micro_batch_size


def _split(b, global_batch: int, data_parallel_size: int, where: str = "") -> int:
    """The accumulation that splits global_batch into micro batches on every rank, or one line with the
    nearest values that would (global batch, micro batch, data-parallel sizes)."""
    if b.grad_accum_steps is not None:
        return _explicit(b, global_batch, data_parallel_size, where)
    per_step = b.micro_batch_size * data_parallel_size
    if global_batch % per_step == 0:
        return global_batch // per_step
    below, above = global_batch // per_step * per_step, (global_batch // per_step + 1) * per_step
    # the largest smaller micro batch that splits it over these ranks; the rank counts this micro batch splits it over
    micro = micro_batch_at(global_batch, data_parallel_size, b.micro_batch_size)
    micro = micro if micro < b.micro_batch_size else None
    ranks = _divisors(global_batch // b.micro_batch_size) if global_batch % b.micro_batch_size == 0 else []
    closest = sorted(ranks, key=lambda d: (abs(d - data_parallel_size), d))[:2]
    raise ConfigError(
        f"batch.global_batch_size={global_batch} is not a multiple of batch.micro_batch_size "
        f"({b.micro_batch_size}) x data-parallel size ({data_parallel_size}) = {per_step}{' ' + where if where else ''}; "
        f"set it to {' or '.join(str(v) for v in (below, above) if v)}"
        + (f", or batch.micro_batch_size={micro}" if micro else "")
        + (f", or run on {' or '.join(map(str, sorted(closest)))} data-parallel ranks" if closest else ""),
        key="batch.global_batch_size",
    )


def _divisors(n: int) -> list[int]:
    """The divisors of n in increasing order (n >= 0; none for 0, and none for a count past
    MAX_COUNT, which bounds.py refuses: a million trials at most)."""
    if n > MAX_COUNT:
        return []
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def _explicit(b, global_batch: int, data_parallel_size: int, where: str) -> int:
    expected = b.micro_batch_size * b.grad_accum_steps * data_parallel_size
    if expected != global_batch:
        raise ConfigError(
            f"batch.global_batch_size={global_batch} != micro_batch_size {b.micro_batch_size} x grad_accum_steps "
            f"{b.grad_accum_steps} x data-parallel size {data_parallel_size} = {expected}{' ' + where if where else ''}; set "
            "batch.grad_accum_steps=null to derive it",
            key="batch.grad_accum_steps",
        )
    return b.grad_accum_steps
