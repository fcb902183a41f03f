"""`plan`: memory per GPU, whether the run fits, and how long it takes on 1, 2, 4 and 8 nodes.

    <package> plan                                  # the project's config and strategy (DDP = ZeRO stage 0)
    <package> plan model.size=d26 batch.micro_batch_size=8
    <package> plan --zero-stage 2 --offload-optimizer   # what DeepSpeed would need
    <package> plan --checkpointing --mfu 0.35 --tokens 2e10
    <package> plan --json                           # machine-readable; exit 1 when it does not fit

Parameters (analytic, equal to models.build_model(...).num_params()): untied embedding and head
V*h each, per layer q and proj h*h each, k and v h*kv_dim each (grouped-query attention), MLP 8*h*h;
no norm gains, no biases.

Model states per GPU (ZeRO paper, mixed-precision Adam, Psi parameters, Nd data-parallel ranks):
bf16 weights 2 Psi, bf16 grads 2 Psi, optimizer 12 Psi (fp32 master, m, v):
    stage 0 (DDP): 16 Psi   stage 1: 4 Psi + 12 Psi/Nd   stage 2: 2 Psi + 14 Psi/Nd   stage 3: 16 Psi/Nd
--offload-optimizer moves the optimizer part to host memory, --offload-params (stage 3) the weights.
train.py's DDP keeps fp32 weights under bf16 autocast: 4 + 4 + 8 bytes, the same 16 Psi (DDP's
gradient buckets may add up to 4 Psi more; the 10% reserve is meant to absorb such things).
DeepSpeed's own estimators add a 4 Psi/Nd fp32 gradient partition and, for stage 3, the gathered
largest layer; tests/test_plan.py compares against them.

Activations per GPU for one micro batch b of s tokens, width h, a heads, L layers, vocab V
(Korthikanti et al. 2022, bf16): s*b*h*(34 + 5*a*s/h) bytes per layer. The 5*a*s/h term is the stored
attention-score matrix; F.scaled_dot_product_attention's flash / memory-efficient kernels on GPUs do
not store it, leaving 34*s*b*h per layer for a GPT-3-style block. This model's block keeps more:
the ReLU^2 MLP stores the fc output, its ReLU and its square (4h wide each), and rotary + QK-norm
keep extra copies of q and k. Measured on an H100 (torch 2.11, bf16 autocast, d20, vocab 8192,
sequence 2048, micro batch 8 and 16: peak 31.2 and 56.9 GiB), it is 63*s*b*h per layer, the
figure used here (ACTIVATION_BYTES_PER_LAYER). With full activation checkpointing every layer
keeps only its bf16 input, 2*s*b*h, plus one layer's activations recomputed during backward. Logits:
b*s*V*4 bytes (the model upcasts them to fp32) and as much again for the softcapped copy.
A 10% reserve of GPU memory stands for the CUDA context, NCCL buffers and fragmentation.

Time: tokens (default schedule.max_steps x global batch x sequence_len) x FLOPs per token / (GPUs x
peak bf16 FLOP/s x MFU); FLOPs per token as GPT.flops_per_token: 6 x matmul parameters (all but the
embedding) + 12 x layers x heads x head_dim x sequence_len.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, replace

from .config import Config, ConfigError
from .rules import model_shape

GIB = 1024**3
RESERVE = 0.10  # share of GPU memory kept free: CUDA context, NCCL buffers, fragmentation

# gpu_type (copier answer) -> (memory GiB, key of metrics.PEAK_FLOPS, the device-name substring).
GPUS = {
    "h100-80gb": (80, "H100"),
    "h800-80gb": (80, "H800"),
    "h200-141gb": (141, "H200"),
    "a100-40gb": (40, "A100"),
    "a100-80gb": (80, "A100"),
    "a800-80gb": (80, "A800"),
    "v100-16gb": (16, "V100"),
    "v100-32gb": (32, "V100"),
    "l40s-48gb": (48, "L40S"),
    "rtx4090-24gb": (24, "RTX 4090"),
}
NODE_COUNTS = (1, 2, 4, 8)


def gpu_spec(gpu_type: str) -> tuple[float, float]:
    """(memory bytes, dense bf16 peak FLOP/s) of a gpu_type answer."""
    from .metrics import PEAK_FLOPS

    if gpu_type not in GPUS:
        raise ConfigError(f"cluster.gpu_type={gpu_type!r} is not known to plan; use one of {', '.join(GPUS)}")
    gib, key = GPUS[gpu_type]
    return gib * GIB, dict(PEAK_FLOPS)[key]


def num_params(shape: dict[str, int], vocab_size: int) -> int:
    h, L = shape["n_embd"], shape["n_layer"]
    kv = shape["n_kv_head"] * (h // shape["n_head"])
    per_layer = 2 * h * h + 2 * h * kv + 8 * h * h
    return 2 * vocab_size * h + L * per_layer


def largest_layer_params(shape: dict[str, int], vocab_size: int) -> int:
    """Largest single parameter tensor (what ZeRO-3 gathers at once)."""
    h = shape["n_embd"]
    return max(vocab_size * h, 4 * h * h)


def flops_per_token(shape: dict[str, int], vocab_size: int, sequence_len: int) -> int:
    """Mirrors GPT.flops_per_token (tests assert equality) so that plan needs no torch model."""
    matmul = num_params(shape, vocab_size) - vocab_size * shape["n_embd"]
    head_dim = shape["n_embd"] // shape["n_head"]
    return 6 * matmul + 12 * shape["n_layer"] * shape["n_head"] * head_dim * sequence_len


def model_states(psi: int, stage: int, nd: int, offload_optimizer: bool = False,
                 offload_params: bool = False) -> dict[str, float]:
    """Bytes per GPU of weights, grads and optimizer (ZeRO paper), and bytes on the host."""
    weights = 2 * psi / nd if stage == 3 else 2 * psi
    grads = 2 * psi / nd if stage >= 2 else 2 * psi
    optimizer = 12 * psi / nd if stage >= 1 else 12 * psi
    host = 0.0
    if offload_optimizer:
        host += optimizer
        optimizer = 0.0
    if offload_params:
        host += weights
        weights = 0.0
    return {"weights": weights, "grads": grads, "optimizer": optimizer, "host": host}


# Bytes per token per unit of width that one block keeps for backward (measured, see above).
ACTIVATION_BYTES_PER_LAYER = 63


def activations(shape: dict[str, int], vocab_size: int, seq: int, micro: int, softcap: float,
                checkpointing: bool) -> float:
    sbh = seq * micro * shape["n_embd"]
    per_layer = ACTIVATION_BYTES_PER_LAYER * sbh
    layers = shape["n_layer"] * 2 * sbh + per_layer if checkpointing else shape["n_layer"] * per_layer
    logits = micro * seq * vocab_size * 4 * (2 if softcap > 0 else 1)
    return layers + logits


@dataclass(frozen=True)
class Setup:
    """What plan varies while searching for a fit."""

    micro: int
    nodes: int
    stage: int
    offload_optimizer: bool
    offload_params: bool
    checkpointing: bool


def memory(cfg: Config, s: Setup) -> dict:
    shape = model_shape(cfg.model.size, cfg.model.n_kv_head, cfg.model.arch)
    vocab = cfg.data.vocab_size
    psi = num_params(shape, vocab)
    nd = s.nodes * cfg.cluster.gpus_per_node
    gpu_bytes, _ = gpu_spec(cfg.cluster.gpu_type)
    states = model_states(psi, s.stage, nd, s.offload_optimizer, s.offload_params)
    act = {c: activations(shape, vocab, cfg.model.sequence_len, s.micro, cfg.model.softcap, c) for c in (False, True)}
    total = states["weights"] + states["grads"] + states["optimizer"] + act[s.checkpointing]
    usable = gpu_bytes * (1 - RESERVE)
    return {
        "params": psi, "data_parallel": nd, **states,
        "activations": act[False], "activations_checkpointed": act[True],
        "total": total, "gpu": gpu_bytes, "usable": usable, "fits": total <= usable,
    }


def zero_hint(cfg: Config, stage: int, offload: bool = False) -> str:
    """The overrides that select a ZeRO stage: config keys where the project has them, else plan's flags."""
    if hasattr(cfg, "deepspeed") and hasattr(cfg.run, "strategy"):
        return (f"run.strategy=deepspeed deepspeed.zero_stage={stage}"
                + (" deepspeed.offload_optimizer=true" if offload else ""))
    return f"plan --zero-stage {stage}" + (" --offload-optimizer" if offload else "")


def candidates(cfg: Config, s: Setup):
    """Single changes in the order plan tries them: (description, setup)."""
    nd = s.nodes * cfg.cluster.gpus_per_node
    micro = s.micro // 2
    while micro >= 1:
        if cfg.batch.global_batch_size % (micro * nd) == 0:
            accum = cfg.batch.global_batch_size // (micro * nd)
            yield (f"batch.micro_batch_size={micro} (grad accumulation {accum}, global batch unchanged)",
                   replace(s, micro=micro))
        micro //= 2
    if not s.checkpointing:
        yield "activation checkpointing (plan --checkpointing; DeepSpeed: activation_checkpointing)", \
            replace(s, checkpointing=True)
    for stage in range(s.stage + 1, 4):
        yield f"ZeRO stage {stage} with DeepSpeed ({zero_hint(cfg, stage)})", replace(s, stage=stage)
    if not s.offload_optimizer:
        stage = max(s.stage, 1)
        yield (f"ZeRO stage {stage} with the optimizer offloaded to CPU ({zero_hint(cfg, stage, offload=True)})",
               replace(s, stage=stage, offload_optimizer=True))
    nodes = s.nodes * 2
    while nodes <= 128:
        stage = max(s.stage, 3)
        yield (f"{nodes} nodes (copier update --data nodes={nodes}) with ZeRO stage {stage} "
               f"({zero_hint(cfg, stage)} cluster.nodes={nodes})", replace(s, nodes=nodes, stage=stage))
        nodes *= 2


def describe(cfg: Config, s: Setup) -> str:
    parts = [f"batch.micro_batch_size={s.micro}" if s.micro != cfg.batch.micro_batch_size else "",
             "activation checkpointing" if s.checkpointing else "",
             f"ZeRO stage {s.stage} ({zero_hint(cfg, s.stage, s.offload_optimizer)})" if s.stage else "",
             f"param offload ({'deepspeed.offload_params=true' if hasattr(cfg, 'deepspeed') else 'plan --offload-params'})"
             if s.offload_params else "",
             f"cluster.nodes={s.nodes} (copier update --data nodes={s.nodes})" if s.nodes != cfg.cluster.nodes else ""]
    return " + ".join(p for p in parts if p)


def piled(cfg: Config, s: Setup):
    """The same changes as `candidates`, each added on top of the previous ones."""
    nd = s.nodes * cfg.cluster.gpus_per_node
    micro = min((m for m in range(1, s.micro + 1) if cfg.batch.global_batch_size % (m * nd) == 0), default=s.micro)
    s = replace(s, micro=micro)
    yield s
    s = replace(s, checkpointing=True)
    yield s
    for stage in range(s.stage + 1, 4):
        s = replace(s, stage=stage)
        yield s
    s = replace(s, offload_optimizer=True)
    yield s
    s = replace(s, offload_params=True)
    yield s
    for k in range(1, 8):
        yield replace(s, nodes=s.nodes * 2**k)


def suggest(cfg: Config, s: Setup) -> str | None:
    """The first single change that fits; failing that, the first pile of changes (in the same order)."""
    for text, cand in candidates(cfg, s):
        if memory(cfg, cand)["fits"]:
            return text
    for cand in piled(cfg, s):
        if memory(cfg, cand)["fits"]:
            return "together: " + describe(cfg, cand)
    return None


def timing(cfg: Config, tokens: float, mfu: float) -> list[dict]:
    shape = model_shape(cfg.model.size, cfg.model.n_kv_head, cfg.model.arch)
    _, peak = gpu_spec(cfg.cluster.gpu_type)
    flops = tokens * flops_per_token(shape, cfg.data.vocab_size, cfg.model.sequence_len)
    rows = []
    for nodes in NODE_COUNTS:
        gpus = nodes * cfg.cluster.gpus_per_node
        hours = flops / (gpus * peak * mfu) / 3600
        rows.append({"nodes": nodes, "gpus": gpus, "hours": hours, "gpu_hours": hours * gpus})
    return rows


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--zero-stage", type=int, choices=range(4),
                   help="0 = DDP; default: the config's strategy (run.strategy, deepspeed.zero_stage when present)")
    p.add_argument("--offload-optimizer", action="store_true", default=None,
                   help="optimizer states in host memory (DeepSpeed)")
    p.add_argument("--offload-params", action="store_true", default=None,
                   help="weights in host memory (DeepSpeed stage 3)")
    p.add_argument("--checkpointing", action="store_true", help="assume full activation checkpointing")
    p.add_argument("--tokens", type=float, help="training tokens (default: max_steps x global batch x sequence_len)")
    p.add_argument("--mfu", type=float, default=0.4, help="assumed model FLOPs utilisation (default 0.4)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def configured_strategy(cfg: Config) -> tuple[int, bool, bool]:
    """(ZeRO stage, offload optimizer, offload params) of the config: stage 0 for DDP. Configs without
    run.strategy / a deepspeed section (older projects) mean DDP."""
    ds = getattr(cfg, "deepspeed", None)
    if getattr(cfg.run, "strategy", "ddp") != "deepspeed" or ds is None:
        return 0, False, False
    return ds.zero_stage, ds.offload_optimizer, ds.offload_params


def build(cfg: Config, args: argparse.Namespace) -> dict:
    stage, offload_opt, offload_params = configured_strategy(cfg)
    if args.zero_stage is not None:
        stage, offload_opt, offload_params = args.zero_stage, False, False
    args.zero_stage = stage
    args.offload_optimizer = offload_opt if args.offload_optimizer is None else args.offload_optimizer
    args.offload_params = offload_params if args.offload_params is None else args.offload_params
    if args.offload_params and args.zero_stage != 3:
        raise ConfigError("--offload-params needs --zero-stage 3 (DeepSpeed offloads parameters only in stage 3)")
    if args.offload_optimizer and args.zero_stage == 0:
        raise ConfigError("--offload-optimizer needs --zero-stage 1, 2 or 3 (DDP keeps the optimizer on the GPU)")
    if not 0 < args.mfu <= 1:
        raise ConfigError(f"--mfu {args.mfu} must be in (0, 1], e.g. 0.4")
    setup = Setup(cfg.batch.micro_batch_size, cfg.cluster.nodes, args.zero_stage, args.offload_optimizer,
                  args.offload_params, args.checkpointing)
    tokens = args.tokens or cfg.schedule.max_steps * cfg.batch.global_batch_size * cfg.model.sequence_len
    mem = memory(cfg, setup)
    return {
        "model": cfg.model.size, "gpu_type": cfg.cluster.gpu_type, "nodes": cfg.cluster.nodes,
        "gpus_per_node": cfg.cluster.gpus_per_node, "micro_batch_size": setup.micro,
        "sequence_len": cfg.model.sequence_len, "zero_stage": setup.stage,
        "offload_optimizer": setup.offload_optimizer, "offload_params": setup.offload_params,
        "checkpointing": setup.checkpointing, "memory": mem, "fits": mem["fits"],
        "suggestion": None if mem["fits"] else suggest(cfg, setup),
        "tokens": tokens, "mfu": args.mfu, "time": timing(cfg, tokens, args.mfu),
    }


def render(r: dict) -> str:
    m = r["memory"]
    g = lambda b: f"{b / GIB:8.2f} GiB"  # noqa: E731
    strategy = "DDP (ZeRO stage 0)" if r["zero_stage"] == 0 else f"DeepSpeed ZeRO stage {r['zero_stage']}"
    extras = [x for x, on in (("optimizer offload", r["offload_optimizer"]), ("param offload", r["offload_params"]))
              if on]
    lines = [
        f"model {r['model']}: {m['params']:,} parameters | {strategy}{' + ' + ', '.join(extras) if extras else ''} | "
        f"{r['nodes']} x {r['gpus_per_node']} {r['gpu_type']} (data-parallel {m['data_parallel']}) | "
        f"micro batch {r['micro_batch_size']} x {r['sequence_len']} tokens",
        "",
        "memory per GPU",
        f"  weights                       {g(m['weights'])}",
        f"  grads                         {g(m['grads'])}",
        f"  optimizer                     {g(m['optimizer'])}",
        f"  activations                   {g(m['activations'])}{'' if r['checkpointing'] else '  <- used'}",
        f"  activations, checkpointed     {g(m['activations_checkpointed'])}{'  <- used' if r['checkpointing'] else ''}",
        f"  total                         {g(m['total'])}",
        f"  GPU (minus {RESERVE:.0%} reserve)        {g(m['usable'])} of {m['gpu'] / GIB:.0f} GiB",
    ]
    if m["host"]:
        lines.append(f"  host memory (offloaded)       {g(m['host'])}")
    lines.append(f"verdict: {'fits' if r['fits'] else 'does NOT fit'}")
    if not r["fits"]:
        lines.append(f"smallest change that fits: {r['suggestion'] or 'none found (a smaller model?)'}")
    lines += ["", f"time to train {r['tokens']:.3g} tokens at MFU {r['mfu']:.2f}",
              "  nodes  GPUs     hours  GPU-hours"]
    lines += [f"  {t['nodes']:5d} {t['gpus']:5d} {t['hours']:9.2f} {t['gpu_hours']:10.1f}" for t in r["time"]]
    return "\n".join(lines)


def run(cfg: Config, args: argparse.Namespace) -> int:
    r = build(cfg, args)
    print(json.dumps(r, indent=2) if args.json else render(r))
    sys.stdout.flush()
    return 0 if r["fits"] else 1
