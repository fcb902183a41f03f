"""What a config costs, without torch: parameters, FLOPs per token, memory per GPU (model states
and activations, on the most loaded GPU of a tensor/pipeline layout) and hours to train. `plan`
prints these figures, fit.py searches for a change that fits, check_project refuses a layout that
does not fit.

    from .estimates import memory, timing
    memory(cfg)                         # bytes per GPU by kind, usable memory, "fits", what the rules refuse
    timing(cfg, tokens=2e10, mfu=0.4)   # hours and GPU-hours on 1, 2, 4 and 8 nodes

Parameters, FLOPs per token and activation bytes are the model family's: models/costs.py names
them, each family's descriptor (models/<family>/descriptor.py) gives its formulas and says where its
measured constants come from, and tests compare them with the torch models (built on the meta
device). Under a tensor/pipeline layout memory is that of the most loaded GPU (stage_params).

Model states per GPU (mixed-precision Adam, Psi = parameters on the GPU after the tensor/pipeline
split, Nd = world / (tensor x pipeline) data-parallel ranks; strategies/memory.py): 16-bit weights
2 Psi, 16-bit grads 2 Psi, optimizer 12 Psi (fp32 master, m, v), bf16 and fp16 alike:
    stage 0 (DDP): 16 Psi   stage 1: 4 Psi + 12 Psi/Nd   stage 2: 2 Psi + 14 Psi/Nd   stage 3: 16 Psi/Nd
Offloading moves the optimizer part (stage 1 on) or the weights (stage 3) to host memory. A strategy
that gathers sharded weights per block adds what it holds gathered at its peak (its plan's
gathered_bytes: FSDP2's; DeepSpeed's ZeRO-3 buffers are left to the reserve). train.py's
DDP keeps fp32 weights under autocast: 4 + 4 + 8 bytes, the same 16 Psi (DDP's gradient buckets may
add up to 4 Psi more; the 10% reserve is meant to absorb such things). A layout or stage the
strategy refuses (its plan's layout_problems) is refused here too, and never suggested.

Activations per GPU for a micro batch b of s tokens: every layer's (the family's layer_activations,
bf16 and fp16 alike), and on the last stage the head and the loss (loss_bytes: the whole logits, or
the chunked loss's peak). Full activation checkpointing keeps each layer's input
(checkpointed_layer_bytes) plus one layer's activations recomputed in backward (the measured peak
sits at the logits instead; counting both is the cautious side). Under a pipeline (1F1B schedule)
stage i keeps min(p - i, m) micro batches of its layers in flight, m the micro batches per optimizer
step; stage 0 keeps the most, the last stage holds the logits. A 10% reserve of GPU memory stands for the CUDA context, NCCL buffers and fragmentation.

Time: tokens (default schedule.max_steps x global batch x sequence_len) x FLOPs per token /
(GPUs x the GPU's dense peak FLOP/s in the run's precision x MFU; precision.on_gpu_type: bf16, or
fp16 on a GPU without it: the V100's 125 TFLOP/s); no pipeline bubble or communication term: the
MFU stands for all of it. FLOPs per token are the family's flops_per_token: 6 x the weights that
multiply, + 12 x layers x width x sequence_len for attention. The published runs of a family
correspond to an MFU by this count that its descriptor notes (tests/test_plan.py computes them).
"""

from __future__ import annotations

from ..models.costs import stage_layers
from ..models.family import family, model_shape
from ..settings.config import Config, ConfigError
from ..settings.gpus import ANSWERS, find_answer
from ..settings.precision import on_gpu_type
from ..strategies.memory import model_states, precision_mode, strategy_plan, uses_pipeline_engine
from .rules import parallel_problems, precision_problems

GIB = 1024**3
RESERVE = 0.10  # share of GPU memory kept free: CUDA context, NCCL buffers, fragmentation
NODE_COUNTS = (1, 2, 4, 8)


def gpu_spec(gpu_type: str, precision: str | None = None) -> tuple[float, float]:
    """(memory bytes, dense peak FLOP/s in precision: gpus.Gpu.peak) of a gpu_type answer."""
    found = find_answer(gpu_type)
    if found is None:
        raise ConfigError(f"cluster.gpu_type={gpu_type!r} is not known to plan; use one of {', '.join(ANSWERS)}")
    gpu, memory_gib = found
    return memory_gib * GIB, gpu.peak(precision)


def gpu_memory(gpu_type: str) -> float:
    """Bytes of memory of a gpu_type answer."""
    return gpu_spec(gpu_type)[0]


# --- parameters ----------------------------------------------------------------------------------


def num_params(shape: dict[str, int], vocab_size: int, arch: str, sequence_len: int = 2048) -> int:
    """All parameters of the model (tied weights once); the family's formula."""
    return family(arch).num_params(shape, vocab_size, sequence_len)


def stage_params(
    shape: dict[str, int], vocab_size: int, arch: str, sequence_len: int, tp: int = 1, pp: int = 1
) -> list[int]:
    """Parameters one GPU holds, per pipeline stage, after the tensor-parallel split."""
    return family(arch).stage_params(shape, vocab_size, sequence_len, tp, pp)


def largest_layer_params(shape: dict[str, int], vocab_size: int, arch: str) -> int:
    """Parameters of the largest module (a module's own tensors: what sharded weights gather at once)."""
    return family(arch).largest_layer_params(shape, vocab_size)


def flops_per_token(shape: dict[str, int], vocab_size: int, sequence_len: int, arch: str) -> int:
    """Training FLOPs per token: the family's formula, which its model's flops_per_token uses too."""
    return family(arch).flops_per_token(shape, vocab_size, sequence_len)


# --- memory ----------------------------------------------------------------------------------------


def layer_activations(
    shape: dict[str, int],
    seq: int,
    micro: int,
    arch: str,
    tp: int = 1,
    mode: str = "autocast",
    scores_stored: bool = False,
) -> float:
    """Bytes one block keeps for backward for one micro batch; scores_stored: attention keeps its
    s x s probabilities (attention dropout), else the fused kernel keeps none."""
    return family(arch).layer_activations(shape, seq, micro, tp, mode, scores_stored)


def activations(
    shape: dict[str, int],
    vocab_size: int,
    seq: int,
    micro: int,
    softcap: float,
    checkpointing: bool,
    arch: str,
    tp: int = 1,
    layers: int | None = None,
    in_flight: int = 1,
    logits: bool = True,
    mode: str = "autocast",
    scores_stored: bool = False,
    chunked_loss: bool = True,
) -> float:
    """Activation bytes on one GPU: `layers` blocks (default all) with `in_flight` micro batches
    kept (pipeline), and the head and loss where this GPU computes the loss (chunked_loss: by
    models/lm_loss.py where the family does, not under a pipeline engine)."""
    fam = family(arch)
    layers = shape["n_layer"] if layers is None else layers
    per_layer = fam.layer_activations(shape, seq, micro, tp, mode, scores_stored)
    if checkpointing:
        saved = fam.checkpointed_layer_bytes(mode)
        kept = in_flight * layers * saved * seq * micro * shape["n_embd"] + (per_layer if layers else 0)
    else:
        kept = in_flight * layers * per_layer
    return kept + (fam.loss_bytes(shape, vocab_size, micro * seq, softcap, chunked_loss) if logits else 0)


def layout_problems(cfg: Config) -> list[str]:
    """What the rules refuse about this layout, strategy and precision on this GPU (empty when allowed)."""
    shape = model_shape(cfg.model.size, cfg.model.n_kv_head, cfg.model.arch, cfg.model)
    world = cfg.cluster.nodes * cfg.cluster.gpus_per_node
    return parallel_problems(cfg, shape, world) + precision_problems(cfg, on_gpu_type(cfg))


def memory(cfg: Config) -> dict:
    """Per-GPU memory of the config's model, strategy and layout, for its most loaded GPU."""
    arch, seq, vocab, micro = cfg.model.arch, cfg.model.sequence_len, cfg.data.vocab_size, cfg.batch.micro_batch_size
    shape = model_shape(cfg.model.size, cfg.model.n_kv_head, arch, cfg.model)
    tp, pp = cfg.parallel.tensor, cfg.parallel.pipeline
    world = cfg.cluster.nodes * cfg.cluster.gpus_per_node
    nd = cfg.data_parallel_size(world)
    per_step = max(1, cfg.batch.global_batch_size // (micro * nd))  # micro batches per optimizer step
    sharded = cfg.sharding()
    layers = stage_layers(shape["n_layer"], pp)
    usable = gpu_memory(cfg.cluster.gpu_type) * (1 - RESERVE)
    muon = family(arch).muon_params(shape, vocab) if cfg.optim.optimizer == "muon" else 0
    gathered = strategy_plan(cfg).gathered_bytes(cfg, shape, vocab, on_gpu_type(cfg))
    worst = None
    for i, psi in enumerate(stage_params(shape, vocab, arch, seq, tp, pp)):
        kw = dict(
            arch=arch,
            tp=tp,
            layers=layers[i],
            in_flight=min(pp - i, per_step),
            logits=i == pp - 1,
            mode=precision_mode(cfg),
            scores_stored=bool(cfg.model.attention_dropout),
            chunked_loss=not uses_pipeline_engine(cfg),
        )
        act = {c: activations(shape, vocab, seq, micro, cfg.model.softcap, c, **kw) for c in (False, True)}
        states = model_states(psi, sharded, nd, muon, not strategy_plan(cfg).muon_state_sharded)
        total = (
            states["weights"]
            + states["grads"]
            + states["optimizer"]
            + gathered
            + act[cfg.model.activation_checkpointing]
        )
        if worst is None or total > worst["total"]:
            worst = {
                "pipeline_stage": i,
                "params_per_gpu": psi,
                **states,
                "gathered": gathered,
                "activations": act[False],
                "activations_checkpointed": act[True],
                "in_flight": kw["in_flight"],
                "total": total,
            }
    problems = layout_problems(cfg)
    return {
        "params": num_params(shape, vocab, arch, seq),
        "tensor": tp,
        "pipeline": pp,
        "data_parallel": nd,
        **worst,
        "gpu": gpu_memory(cfg.cluster.gpu_type),
        "usable": usable,
        "problems": problems,
        "fits": worst["total"] <= usable and not problems,
    }


# --- time ------------------------------------------------------------------------------------------

ASSUMED_MFU = 0.4  # plan's default: DDP measured 39-46% on one H100 across the template's three families
# run.fp8's speedup of a whole step: nanochat measured +17% tokens/s from tensorwise fp8 at d20 on an
# H100, torchtitan +48% at 8B (the share of time in large matmuls grows with the model); plan takes
# the smaller. Only the matmuls gain, and only where they dominate: MFU stays against the bf16 peak.
FP8_SPEEDUP = 1.15


def fp8_counted(cfg: Config) -> bool:
    """Whether run.fp8 speeds the estimate: not where the rules refuse it (a GPU without fp8, fp16, an
    eager model, what the strategy refuses), which plan's verdict says; such a run trains without it."""
    if cfg.run.fp8 == "off":
        return False
    return not any("run.fp8" in p.keys for p in precision_problems(cfg, on_gpu_type(cfg)))


def step_speed(cfg: Config) -> float:
    """Dense FLOP/s per GPU at 100% MFU for cfg's precision: the bf16 (or fp16) peak, times
    FP8_SPEEDUP under a run.fp8 the rules allow."""
    _, peak = gpu_spec(cfg.cluster.gpu_type, on_gpu_type(cfg))
    return peak * (FP8_SPEEDUP if fp8_counted(cfg) else 1.0)


def timing(cfg: Config, tokens: float, mfu: float) -> list[dict]:
    shape = model_shape(cfg.model.size, cfg.model.n_kv_head, cfg.model.arch, cfg.model)
    peak = step_speed(cfg)
    flops = tokens * flops_per_token(shape, cfg.data.vocab_size, cfg.model.sequence_len, cfg.model.arch)
    rows = []
    grid = cfg.parallel.tensor * cfg.parallel.pipeline
    for nodes in NODE_COUNTS:
        gpus = nodes * cfg.cluster.gpus_per_node
        hours = flops / (gpus * peak * mfu) / 3600
        rows.append(
            {"nodes": nodes, "gpus": gpus, "hours": hours, "gpu_hours": hours * gpus, "layout_fits": gpus % grid == 0}
        )  # the tensor x pipeline grid must tile the GPUs
    return rows


STOP_WAIT_SHARE = 0.25
"""The share of cluster.stop_grace_seconds a stop may wait for the ranks' next agreement on it; the
rest is the save's."""


def stop_wait_steps(step_seconds: float, every_steps: int, grace_seconds: float) -> int:
    """Steps between the ranks' agreements on a stop (training/preemption.py): logging.every_steps,
    fewer when that many steps would take over STOP_WAIT_SHARE of the grace; at least one."""
    if step_seconds <= 0:
        return every_steps
    return max(1, min(every_steps, int(grace_seconds * STOP_WAIT_SHARE / step_seconds)))


def stop_reaction(cfg: Config, mfu: float) -> dict:
    """How long a stop signal may wait for the ranks' agreement (stop_wait_steps at this MFU on
    cluster.nodes x cluster.gpus_per_node GPUs), against cluster.stop_grace_seconds, which has to cover
    that and the save: tight when over half of it, which only a step longer than that makes."""
    shape = model_shape(cfg.model.size, cfg.model.n_kv_head, cfg.model.arch, cfg.model)
    peak = step_speed(cfg)
    step_tokens = cfg.batch.global_batch_size * cfg.model.sequence_len
    step_flops = step_tokens * flops_per_token(shape, cfg.data.vocab_size, cfg.model.sequence_len, cfg.model.arch)
    step_seconds = step_flops / (cfg.cluster.nodes * cfg.cluster.gpus_per_node * peak * mfu)
    grace = cfg.cluster.stop_grace_seconds
    steps = stop_wait_steps(step_seconds, cfg.logging.every_steps, grace)
    return {
        "every_steps": cfg.logging.every_steps,
        "steps": steps,
        "step_seconds": step_seconds,
        "seconds": steps * step_seconds,
        "grace_seconds": grace,
        "tight": steps * step_seconds > grace / 2,
    }
