"""What running the config on more nodes does, under both batch.scaling choices: `plan` prints it. No torch.

    from .scaling import scaling_rows
    scaling_rows(cfg, mfu=0.4)   # the config's nodes, then 2x and 4x: strong and weak figures side by side
    render_rows(cfg.batch.scaling, cfg.schedule.max_steps, rows)   # plan's lines

Strong scaling (the default) keeps batch.global_batch_size: the tokens per step and the token budget
(schedule.max_steps x global batch) stay, the gradient accumulation shrinks, each step and the run
take less time. Where the micro batch x the data-parallel GPUs outgrows the global batch, the row
takes the smaller micro batch `copier update --data nodes=N` renders (settings/batch.py micro_batch_at, the
largest up to the config's that splits it) and says so. Weak scaling keeps the batch per data-parallel GPU: the global batch and the tokens
per step grow with the GPUs, a step takes as long as before, so max_steps trains on more tokens in
the same time. Step times are estimates: FLOPs / (GPUs x peak x MFU), as estimates.timing.
"""

from __future__ import annotations

from dataclasses import replace

from ..models.family import model_shape
from ..settings.batch import at_world_size, micro_batch_at, per_rank_batch, resolve_grad_accum
from ..settings.config import Config, ConfigError
from .estimates import flops_per_token, step_speed

NODE_FACTORS = (1, 2, 4)


def step_seconds(cfg: Config, global_batch: int, gpus: int, mfu: float) -> float:
    """Estimated seconds of one optimizer step of global_batch sequences on gpus GPUs."""
    shape = model_shape(cfg.model.size, cfg.model.n_kv_head, cfg.model.arch, cfg.model)
    per_token = flops_per_token(shape, cfg.data.vocab_size, cfg.model.sequence_len, cfg.model.arch)
    return global_batch * cfg.model.sequence_len * per_token / (gpus * step_speed(cfg) * mfu)  # as timing's


def scaling_rows(cfg: Config, mfu: float) -> list[dict]:
    """One row per node count (the config's, then 2x and 4x) with what strong and weak scaling give."""
    steps, seq = cfg.schedule.max_steps, cfg.model.sequence_len

    def total(per_step: float) -> float | None:
        """A run's total of a per-step figure; None before prepare-data when schedule.epochs gives the steps."""
        return None if steps is None else steps * per_step

    fixed = at_world_size(cfg, cfg.cluster.nodes * cfg.cluster.gpus_per_node).batch.global_batch_size
    per_gpu = per_rank_batch(cfg)  # sequences per data-parallel GPU in the config's own shape
    # Strong scaling of this recipe: its global batch kept, the accumulation derived for each world.
    strong = replace(cfg, batch=replace(cfg.batch, scaling="strong", global_batch_size=fixed, grad_accum_steps=None))
    rows = []
    for factor in NODE_FACTORS:
        nodes = cfg.cluster.nodes * factor
        gpus = nodes * cfg.cluster.gpus_per_node
        dp = cfg.data_parallel_size(gpus)
        micro = micro_batch_at(fixed, dp, cfg.batch.micro_batch_size)
        try:
            accum, why = (
                resolve_grad_accum(replace(strong, batch=replace(strong.batch, micro_batch_size=micro)), dp),
                None,
            )
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
                    "micro_batch_size": micro,
                    "micro_batch_lowered": micro < cfg.batch.micro_batch_size,
                    "grad_accum_steps": accum,
                    "problem": why,
                    "tokens": total(fixed * seq),
                    "step_seconds": strong_step,
                    "hours": total(strong_step / 3600),
                },
                "weak": {
                    "global_batch": per_gpu * dp,
                    "tokens": total(per_gpu * dp * seq),
                    "step_seconds": weak_step,
                    "hours": total(weak_step / 3600),
                },
            }
        )
    return rows


def render_rows(choice: str, max_steps: int, rows: list[dict]) -> list[str]:
    """plan's table: the config's choice (batch.scaling) marked, the other one beside it."""
    first = rows[0]
    mark = {"strong": "", "weak": "", choice: " (the config's)"}
    per_gpu = first["weak"]["global_batch"] // first["data_parallel"]
    length = f"{max_steps} steps" if max_steps is not None else "steps from schedule.epochs once the data is prepared"
    lines = [
        f"scaling out, {length} (batch.scaling=strong|weak)",
        f"  strong{mark['strong']}: global batch {first['strong']['global_batch']} and "
        f"{_figure(first['strong']['tokens'], '.3g')} tokens kept, accumulation shrinks | weak{mark['weak']}: "
        f"{per_gpu} sequences per GPU kept, global batch and tokens grow",
        "  nodes  GPUs |  micro  accum  s/step    hours | global batch    tokens  s/step    hours",
    ]
    for r in rows:
        s, w = r["strong"], r["weak"]
        strong = (
            f"{s['micro_batch_size']:6d} {s['grad_accum_steps']:6d} {s['step_seconds']:7.2f} {_figure(s['hours'], '8.2f')}"
            if s["problem"] is None
            else f"{'-':>6} {'-':>6} {'-':>7} {'-':>8}"
        )
        lines.append(
            f"  {r['nodes']:5d} {r['gpus']:5d} | {strong} | {w['global_batch']:12d} {_figure(w['tokens'], '9.3g')} "
            f"{w['step_seconds']:7.2f} {_figure(w['hours'], '8.2f')}"
        )
    for r in rows:
        s = r["strong"]
        if s["problem"]:
            lines.append(f"  {r['nodes']} nodes, strong: {s['problem']}")
        elif s["micro_batch_lowered"]:
            lines.append(
                f"  {r['nodes']} nodes, strong: micro batch {s['micro_batch_size']} (as `copier update --data "
                f"nodes={r['nodes']}` would set: {s['micro_batch_size']} x {r['data_parallel']} data-parallel GPUs "
                f"x {s['grad_accum_steps']} = {s['global_batch']})"
            )
    return lines


def _figure(value: float | None, spec: str) -> str:
    """A run total in the table's format; '?' where the steps are not known yet."""
    return format(value, spec) if value is not None else format("?", ">" + spec.split(".")[0])
