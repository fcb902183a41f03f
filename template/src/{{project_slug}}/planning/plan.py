"""`plan`: parameters, memory per GPU, whether the run fits (and the smallest change that makes it
fit), how long it takes on 1, 2, 4 and 8 nodes, how long a stop signal may wait for the next logging
step, and what 2x and 4x the nodes give under strong and weak scaling (scaling.py). Torch-free.

    <package> plan                                  # the project's config: model, strategy, layout, GPU
    <package> plan model.size=d26 batch.micro_batch_size=8
    <package> plan parallel.pipeline=8 cluster.nodes=4   # a family with layouts: another layout
    <package> plan --checkpointing --mfu 0.35 --tokens 2e10
    <package> plan --json                           # machine-readable; exit 1 when it does not fit

This module is the command (flags, the report, its table); the figures and their sources are in
estimates.py, the search for a change that fits in fit.py, the GPUs in gpus.py.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..data.epochs import steps_where_known
from ..models.family import family, model_shape, peak_lrs_line
from ..settings.bounds import fraction, positive_float
from ..settings.config import Config, ConfigError, changed
from ..settings.precision import on_gpu_type
from ..strategies.memory import describe, strategy_plans
from .estimates import ASSUMED_MFU, FP8_SPEEDUP, GIB, RESERVE, fp8_counted, gpu_spec, memory, stop_reaction, timing
from .fit import suggest
from .scaling import render_rows, scaling_rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    for plan in strategy_plans().values():  # a sharding strategy's own flags (its stage, offload)
        for names, options in plan.plan_arguments:
            p.add_argument(*names, **options)
    p.add_argument(
        "--checkpointing",
        action="store_true",
        help="assume full activation checkpointing (default: model.activation_checkpointing)",
    )
    p.add_argument(
        "--tokens",
        type=positive_float,
        help="training tokens (default: max_steps, or the steps schedule.epochs gives, x global batch x sequence_len)",
    )
    p.add_argument(
        "--mfu", type=fraction, default=ASSUMED_MFU, help=f"assumed model FLOPs utilisation (default {ASSUMED_MFU})"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def with_flags(cfg: Config, args: argparse.Namespace) -> Config:
    """The config with plan's flags applied (a strategy's own flags override the config's sharding)."""
    for plan in strategy_plans().values():
        cfg = plan.with_plan_flags(cfg, args)
    return changed(cfg, **{"model.activation_checkpointing": True}) if args.checkpointing else cfg


def build(cfg: Config, args: argparse.Namespace) -> dict:
    if not 0 < args.mfu <= 1:
        raise ConfigError(f"--mfu {args.mfu} must be in (0, 1], e.g. 0.4")
    cfg = with_flags(cfg, args)
    # schedule.epochs: the steps once the data is prepared; before, no token count unless --tokens gives one
    cfg, steps_line = steps_where_known(cfg, Path(cfg.data.dir))
    steps = cfg.schedule.max_steps
    tokens = args.tokens or (steps and steps * cfg.batch.global_batch_size * cfg.model.sequence_len)
    mem = memory(cfg)
    precision = on_gpu_type(cfg)
    return {
        "model": cfg.model.size,
        "arch": cfg.model.arch,
        "gpu_type": cfg.cluster.gpu_type,
        "nodes": cfg.cluster.nodes,
        "gpus_per_node": cfg.cluster.gpus_per_node,
        "micro_batch_size": cfg.batch.micro_batch_size,
        "sequence_len": cfg.model.sequence_len,
        "strategy": describe(cfg),
        "optimizer": optimizer_line(cfg),
        "shard_stage": cfg.sharding().stage,
        "offload_optimizer": cfg.sharding().offload_optimizer,
        "offload_params": cfg.sharding().offload_params,
        "checkpointing": cfg.model.activation_checkpointing,
        "memory": mem,
        "fits": mem["fits"],
        "suggestion": None if mem["fits"] else ("; ".join(mem["problems"]) if mem["problems"] else suggest(cfg)),
        "precision": precision,  # bf16, or fp16 (loss-scaled) on a GPU without bf16; fp32 if asked
        "fp8": cfg.run.fp8,
        "fp8_counted": fp8_counted(cfg),  # False where the rules refuse it: the times are bf16's
        "peak_flops": gpu_spec(cfg.cluster.gpu_type, precision)[1],  # dense, per GPU, for the time table
        "steps_line": steps_line,  # how schedule.epochs gave the steps, or that prepare-data will
        "tokens": tokens,
        "mfu": args.mfu,
        "time": timing(cfg, tokens, args.mfu) if tokens else [],
        "stop": stop_reaction(cfg, args.mfu),
        "scaling": {
            "choice": cfg.batch.scaling,
            "max_steps": steps,
            "rows": scaling_rows(cfg, args.mfu),
        },
    }


def optimizer_line(cfg: Config) -> str:
    """What steps the weights at which peak rates: optim.optimizer=muon's are derived for the run."""
    o = cfg.optim
    if o.optimizer == "adamw":
        return f"optimizer: AdamW | peak lr {o.lr:.3g}, weight decay {o.weight_decay:g}"
    m = cfg.model
    groups = family(m.arch).optimizer_groups(cfg, model_shape(m.size, m.n_kv_head, m.arch, m))
    tokens = cfg.batch.global_batch_size * m.sequence_len
    return (
        f"optimizer: Muon on the blocks' matrices, AdamW on the rest | "
        f"{peak_lrs_line({role: g['lr'] for role, g in groups.items()})} | "
        f"Muon weight decay {groups['matrix']['weight_decay']:.3g} | derived for {tokens:,} tokens a step "
        f"(optim.*_lr hold the reference's)"
    )


def render(r: dict) -> str:
    m = r["memory"]
    g = lambda b: f"{b / GIB:8.2f} GiB"  # noqa: E731
    layout = f"tensor {m['tensor']} x pipeline {m['pipeline']} x data {m['data_parallel']}"
    lines = [
        f"model {r['arch']} {r['model']}: {m['params']:,} parameters | {r['strategy']} | "
        f"{r['nodes']} x {r['gpus_per_node']} {r['gpu_type']} ({layout}) | "
        f"micro batch {r['micro_batch_size']} x {r['sequence_len']} tokens",
        r["optimizer"],
        "",
    ]
    if m["pipeline"] > 1 or m["tensor"] > 1:
        lines.append(
            f"memory per GPU (most loaded: pipeline stage {m['pipeline_stage']} of {m['pipeline']}, "
            f"{m['params_per_gpu']:,} parameters, {m['in_flight']} micro batch(es) in flight)"
        )
    else:
        lines.append("memory per GPU")
    used = "  <- used"
    lines += [
        f"  weights                       {g(m['weights'])}",
        f"  grads                         {g(m['grads'])}",
        f"  optimizer                     {g(m['optimizer'])}",
        *([f"  gathered (weights, grads)     {g(m['gathered'])}"] if m["gathered"] else []),
        f"  activations                   {g(m['activations'])}{'' if r['checkpointing'] else used}",
        f"  activations, checkpointed     {g(m['activations_checkpointed'])}{used if r['checkpointing'] else ''}",
        f"  total                         {g(m['total'])}",
        f"  GPU (minus {RESERVE:.0%} reserve)        {g(m['usable'])} of {m['gpu'] / GIB:.0f} GiB",
    ]
    if m["host"]:
        lines.append(f"  host memory (offloaded)       {g(m['host'])}")
    if m["problems"]:
        lines.append("verdict: refused by the rules: " + "; ".join(m["problems"]))
    else:
        lines.append(f"verdict: {'fits' if r['fits'] else 'does NOT fit'}")
        if not r["fits"]:
            lines.append(f"smallest change that fits: {r['suggestion'] or 'none found (a smaller model?)'}")
    kind = "16-bit" if r["precision"] == "fp32" else r["precision"]  # an fp32 run against the 16-bit peak too
    lines += ["", r["steps_line"]] if r["steps_line"] else []
    if r["tokens"]:
        lines += [
            "",
            f"time to train {r['tokens']:.3g} tokens at MFU {r['mfu']:.2f} of the {r['peak_flops'] / 1e12:.0f} "
            f"TFLOP/s dense {kind} peak per GPU"
            + (f", {FP8_SPEEDUP:.2f}x faster with fp8 {r['fp8']} matmuls" if r["fp8_counted"] else "")
            + (
                f", without fp8 {r['fp8']} (refused: see the verdict)"
                if r["fp8"] != "off" and not r["fp8_counted"]
                else ""
            ),
            "  nodes  GPUs     hours  GPU-hours",
        ]
    else:
        lines.append("time to train: give --tokens, or prepare the data so that schedule.epochs gives the steps")
    grid = f"tensor {m['tensor']} x pipeline {m['pipeline']} needs a multiple of {m['tensor'] * m['pipeline']} GPUs"
    lines += [
        f"  {t['nodes']:5d} {t['gpus']:5d} {t['hours']:9.2f} {t['gpu_hours']:10.1f}"
        + ("" if t["layout_fits"] else f"   ({grid})")
        for t in r["time"]
    ]
    stop = r["stop"]
    lines += [
        "",
        f"after a stop signal: up to {stop['steps']} step(s) (about {stop['seconds']:.0f} s; logging.every_steps="
        f"{stop['every_steps']}, fewer where steps are slow), then the save, within cluster.stop_grace_seconds="
        f"{stop['grace_seconds']}"
        + ("   <- tight: one step takes over half of it; raise the grace" if stop["tight"] else ""),
    ]
    return "\n".join(lines + [""] + render_rows(**r["scaling"]))


def run(cfg: Config, args: argparse.Namespace) -> int:
    r = build(cfg, args)
    print(json.dumps(r, indent=2) if args.json else render(r))
    sys.stdout.flush()
    return 0 if r["fits"] else 1
