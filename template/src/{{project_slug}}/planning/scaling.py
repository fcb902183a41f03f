"""What running the config on more nodes does, under both batch.scaling choices: `plan` prints it. No torch.

    from .scaling import scaling_rows
    scaling_rows(cfg, mfu=0.4)   # the config's nodes, then 2x and 4x: strong and weak figures side by side
    render_rows(cfg.batch.scaling, cfg.schedule.max_steps, rows)   # plan's lines

Strong scaling (the default) keeps batch.global_batch_size: the tokens per step and the token budget
(schedule.max_steps x global batch) stay, the gradient accumulation shrinks, each step and the run
take less time. Weak scaling keeps the batch per data-parallel GPU: the global batch and the tokens
per step grow with the GPUs, a step takes as long as before, so max_steps trains on more tokens in
the same time. Step times are estimates: FLOPs / (GPUs x peak x MFU), as estimates.timing.
"""

from __future__ import annotations

from dataclasses import replace

from ..models.family import model_shape
from ..settings.config import Config, ConfigError
from .estimates import flops_per_token, gpu_spec
from .rules import at_world_size, per_rank_batch, resolve_grad_accum

NODE_FACTORS = (1, 2, 4)


def step_seconds(cfg: Config, global_batch: int, gpus: int, mfu: float) -> float:
    """Estimated seconds of one optimizer step of global_batch sequences on gpus GPUs."""
    shape = model_shape(cfg.model.size, cfg.model.n_kv_head, cfg.model.arch)
    _, peak = gpu_spec(cfg.cluster.gpu_type)
    per_token = flops_per_token(shape, cfg.data.vocab_size, cfg.model.sequence_len, cfg.model.arch)
    return global_batch * cfg.model.sequence_len * per_token / (gpus * peak * mfu)


def scaling_rows(cfg: Config, mfu: float) -> list[dict]:
    """One row per node count (the config's, then 2x and 4x) with what strong and weak scaling give."""
    steps, seq = cfg.schedule.max_steps, cfg.model.sequence_len
    fixed = at_world_size(cfg, cfg.cluster.nodes * cfg.cluster.gpus_per_node).batch.global_batch_size
    per_gpu = per_rank_batch(cfg)  # sequences per data-parallel GPU in the config's own shape
    # Strong scaling of this recipe: its global batch kept, the accumulation derived for each world.
    strong = replace(cfg, batch=replace(cfg.batch, scaling="strong", global_batch_size=fixed, grad_accum_steps=None))
    rows = []
    for factor in NODE_FACTORS:
        nodes = cfg.cluster.nodes * factor
        gpus = nodes * cfg.cluster.gpus_per_node
        dp = cfg.data_parallel_size(gpus)
        try:
            accum, why = resolve_grad_accum(strong, dp), None
        except ConfigError as exc:
            accum, why = None, str(exc)
        strong_step, weak_step = step_seconds(cfg, fixed, gpus, mfu), step_seconds(cfg, per_gpu * dp, gpus, mfu)
        rows.append(
            {
                "nodes": nodes,
                "gpus": gpus,
                "data_parallel": dp,
                "strong": {
                    "global_batch": fixed,
                    "grad_accum_steps": accum,
                    "problem": why,
                    "tokens": steps * fixed * seq,
                    "step_seconds": strong_step,
                    "hours": steps * strong_step / 3600,
                },
                "weak": {
                    "global_batch": per_gpu * dp,
                    "tokens": steps * per_gpu * dp * seq,
                    "step_seconds": weak_step,
                    "hours": steps * weak_step / 3600,
                },
            }
        )
    return rows


def render_rows(choice: str, max_steps: int, rows: list[dict]) -> list[str]:
    """plan's table: the config's choice (batch.scaling) marked, the other one beside it."""
    first = rows[0]
    mark = {"strong": "", "weak": "", choice: " (the config's)"}
    per_gpu = first["weak"]["global_batch"] // first["data_parallel"]
    lines = [
        f"scaling out, {max_steps} steps (batch.scaling=strong|weak)",
        f"  strong{mark['strong']}: global batch {first['strong']['global_batch']} and "
        f"{first['strong']['tokens']:.3g} tokens kept, accumulation shrinks | weak{mark['weak']}: "
        f"{per_gpu} sequences per GPU kept, global batch and tokens grow",
        "  nodes  GPUs |  accum  s/step    hours | global batch    tokens  s/step    hours",
    ]
    for r in rows:
        s, w = r["strong"], r["weak"]
        strong = (
            f"{s['grad_accum_steps']:6d} {s['step_seconds']:7.2f} {s['hours']:8.2f}"
            if s["problem"] is None
            else f"{'-':>6} {'-':>7} {'-':>8}"
        )
        lines.append(
            f"  {r['nodes']:5d} {r['gpus']:5d} | {strong} | {w['global_batch']:12d} {w['tokens']:9.3g} "
            f"{w['step_seconds']:7.2f} {w['hours']:8.2f}"
        )
    lines += [f"  {r['nodes']} nodes, strong: {r['strong']['problem']}" for r in rows if r["strong"]["problem"]]
    return lines
