"""`plan`: parameters, memory per GPU, whether the run fits (and the smallest change that makes it
fit), and how long it takes on 1, 2, 4 and 8 nodes. Torch-free except for the peak FLOP/s table.

    <package> plan                                  # the project's config: model, strategy, layout, GPU
    <package> plan model.size=d26 batch.micro_batch_size=8
    <package> plan --zero-stage 2 --offload-optimizer   # what DeepSpeed would need
    <package> plan parallel.pipeline=8 cluster.nodes=4   # gpt3: another layout
    <package> plan --checkpointing --mfu 0.35 --tokens 2e10
    <package> plan --json                           # machine-readable; exit 1 when it does not fit

The post-generation check (check_project) calls `fit_problem` and refuses a layout that does not fit.

Parameters (analytic; tests compare with the torch models built on the meta device):
- gpt (models/gpt.py): untied embedding and head V*h each, per layer q and proj h*h each, k and v
  h*kv_dim each (grouped-query attention), MLP 8*h*h; no norm gains, no biases.
- gpt3 (models/gpt3.py): V*h + S*h (learned positions of sequence_len S) + L*(12h^2 + 13h) + 2h
  (final LayerNorm); the head is the word embedding again. Tensor degree t splits each block's four
  matrices and the column-parallel biases (qkv 3h, fc 4h); the row-parallel biases (proj, fc2),
  the LayerNorms and the embeddings are replicated (no vocabulary-parallel split). Pipeline degree
  p: every stage holds L/p blocks, stage 0 also the embeddings, the last stage the final LayerNorm
  and a tied copy of the word embedding for the head. Memory is that of the most loaded GPU.
- bert (transformers' BertForMaskedLM, no pooler): embeddings (V + 512 + 2)*h + LayerNorm 2h,
  per layer 12h^2 + 13h, MLM head transform h^2 + h + LayerNorm 2h, decoder tied to the word
  embedding plus a V bias.

Model states per GPU (ZeRO paper, mixed-precision Adam, Psi = parameters on the GPU after the
tensor/pipeline split, Nd = world / (tensor x pipeline) data-parallel ranks):
bf16 weights 2 Psi, bf16 grads 2 Psi, optimizer 12 Psi (fp32 master, m, v):
    stage 0 (DDP): 16 Psi   stage 1: 4 Psi + 12 Psi/Nd   stage 2: 2 Psi + 14 Psi/Nd   stage 3: 16 Psi/Nd
deepspeed.offload_optimizer moves the optimizer part to host memory, deepspeed.offload_params
(stage 3) the weights. train.py's DDP keeps fp32 weights under bf16 autocast: 4 + 4 + 8 bytes, the
same 16 Psi (DDP's gradient buckets may add up to 4 Psi more; the 10% reserve is meant to absorb
such things). DeepSpeed's own estimators add a 4 Psi/Nd fp32 gradient partition and, for stage 3,
the gathered largest layer; tests/test_plan.py compares against them. Combinations that
rules.parallel_problems refuses (ZeRO 2 and 3 with tensor or pipeline degrees above 1: those
layouts run on DeepSpeed's pipeline engine) are refused here too, and never suggested.

Activations per GPU for a micro batch b of s tokens, width h, a heads, vocab V (bf16):
- gpt: 63*s*b*h bytes per layer, measured on an H100 for this block (torch 2.11, bf16 autocast,
  d20, vocab 8192, sequence 2048, micro batch 8 and 16: peak 31.2 and 56.9 GiB): the ReLU^2 MLP
  stores the fc output, its ReLU and its square (4h wide each), rotary + QK-norm keep extra copies
  of q and k. Logits b*s*V*4 (upcast to fp32) and as much again for the softcapped copy.
- gpt3 and bert: Korthikanti et al. 2022 with tensor degree t, no sequence parallelism:
  s*b*h*(10 + 24/t) bytes per layer (24/t: what the split heads and MLP keep; 10: LayerNorm and
  block inputs and dropout masks, replicated), plus 5*a*s^2*b/t for the attention scores where the
  kernel stores them. Both families call F.scaled_dot_product_attention (gpt3 directly, bert
  through transformers' default "sdpa"), whose flash / memory-efficient kernels on a GPU keep no
  s x s matrix: that term is left out (ATTENTION_SCORES_STORED). The replicated part is measured
  (H100, torch 2.11, transformers 5.17, width 1024, layers 4 vs 12, two micro batches, peak
  allocated memory of one forward + backward) rather than taken as 10, because the precision
  changes it: REPLICATED_BYTES. gpt3 has no dropout: 8 in pure bf16 (32 in all: the pipeline
  engine's bf16 modules), 12 under autocast (36: train.py's DDP and ZeRO loop, whose LayerNorms run
  and return fp32). bert 11 in bf16 (35), 19 under autocast (43: post-LN in fp32). The logits, on
  the last stage: gpt3 12 bytes per b*s*V (bf16 logits, their fp32 copy for the loss and the
  log-softmax: 4 would be too few by 3x), bert the same for the 15% predicted positions
  (models/bert.py projects only those; measured 1.6-2.0 bytes per b*s*V).
- Full activation checkpointing keeps each layer's input, 2*s*b*h in bf16 (4 for gpt3 under
  autocast: its residual stream is fp32; bert 3), plus one layer's activations recomputed in
  backward (the measured peak sits at the logits instead; counting both is the cautious side).
- Pipeline (1F1B schedule): stage i keeps min(p - i, m) micro batches of its layers in flight, m
  the micro batches per optimizer step; stage 0 keeps the most, the last stage holds the logits.
A 10% reserve of GPU memory stands for the CUDA context, NCCL buffers and fragmentation.

Time: tokens (default schedule.max_steps x global batch x sequence_len) x FLOPs per token /
(GPUs x peak bf16 FLOP/s x MFU); no pipeline bubble or communication term: the MFU stands for all
of it. FLOPs per token as each model's flops_per_token: 6 x the weights that multiply (gpt: all
but the input embedding; gpt3: the blocks' matrices and the tied head, Megatron's
72*L*h^2 + 6*V*h; bert: all but the embedding tables, plus the tied decoder on the 15% predicted
positions) + 12 x layers x width x sequence_len for attention. The seeds' Megatron-DeepSpeed times on A100 40GB
(125M, 2.5B tokens, 1 GPU, ~8 h; 1.3B, 26B tokens, 4 GPUs, ~8 d) both correspond to an MFU of
about 0.27 by this count (tests/test_plan.py); nanochat d20 at 2.2 s a step on 8 A800 to 0.33.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys

from .config import Config, ConfigError
from .rules import parallel_problems, resolve_grad_accum
from .sizes import model_shape

GIB = 1024**3
RESERVE = 0.10  # share of GPU memory kept free: CUDA context, NCCL buffers, fragmentation
BERT_POSITIONS, BERT_TOKEN_TYPES = 512, 2  # BertConfig defaults: position and segment embeddings
BERT_MLM_SHARE = 0.15  # positions models/bert.py predicts (its MLM_PROBABILITY): the head runs on those only

# gpu_type (copier answer) -> (memory GiB, key of metrics.PEAK_FLOPS, the device-name substring).
GPUS = {
    "h100-80gb": (80, "H100"),
    "h800-80gb": (80, "H800"),
    "h200-141gb": (141, "H200"),
    "a100-40gb": (40, "A100"),
    "a100-80gb": (80, "A100"),
    "a800-40gb": (40, "A800"),
    "a800-80gb": (80, "A800"),
    "v100-16gb": (16, "V100"),
    "v100-32gb": (32, "V100"),
    "l40s-48gb": (48, "L40S"),
    "rtx4090-24gb": (24, "RTX 4090"),
}
NODE_COUNTS = (1, 2, 4, 8)

# Bytes per token per unit of width that one gpt block keeps for backward (measured, see above).
ACTIVATION_BYTES_PER_LAYER = 63
# Whether the family's attention keeps the s x s scores for backward (see the docstring).
ATTENTION_SCORES_STORED = {"gpt3": False, "bert": False}
# Per layer, bytes per s*b*h that tensor parallelism does not split, by family and precision
# (Korthikanti's 10, measured; see the docstring); the split part is 24/t.
REPLICATED_BYTES = {("gpt3", "bf16"): 8, ("gpt3", "autocast"): 12, ("bert", "bf16"): 11, ("bert", "autocast"): 19}
# Per layer with activation checkpointing, bytes per s*b*h of the saved layer input.
CHECKPOINT_BYTES = {("gpt3", "bf16"): 2, ("gpt3", "autocast"): 4, ("bert", "bf16"): 3, ("bert", "autocast"): 3}
# Logits and loss, bytes per b*s*V (bert: only the 15% predicted positions reach the head).
LOGITS_BYTES = {"gpt3": 12, "bert": 12 * BERT_MLM_SHARE}


def gpu_memory(gpu_type: str) -> float:
    """Bytes of memory of a gpu_type answer (no torch: the copier task calls this)."""
    if gpu_type not in GPUS:
        raise ConfigError(f"cluster.gpu_type={gpu_type!r} is not known to plan; use one of {', '.join(GPUS)}")
    return GPUS[gpu_type][0] * GIB


def gpu_spec(gpu_type: str) -> tuple[float, float]:
    """(memory bytes, dense bf16 peak FLOP/s) of a gpu_type answer."""
    memory_bytes = gpu_memory(gpu_type)
    from .metrics import PEAK_FLOPS  # metrics imports torch: only the time table needs it

    return memory_bytes, dict(PEAK_FLOPS)[GPUS[gpu_type][1]]


# --- parameters ----------------------------------------------------------------------------------

def block_params(h: int, tp: int = 1) -> int:
    """One GPT-2/3 or BERT block on one tensor-parallel rank: 12h^2 + 13h when tp = 1."""
    return (12 * h * h + 7 * h) // tp + 6 * h  # split: 4 matrices, qkv and fc biases; replicated: 2 biases, 2 norms


def num_params(shape: dict[str, int], vocab_size: int, arch: str = "gpt", sequence_len: int = 2048) -> int:
    """All parameters of the model (tied weights once). sequence_len matters for gpt3 (learned positions)."""
    h, L, V = shape["n_embd"], shape["n_layer"], vocab_size
    if arch == "gpt3":
        return V * h + sequence_len * h + L * block_params(h) + 2 * h
    if arch == "bert":
        return (V + BERT_POSITIONS + BERT_TOKEN_TYPES) * h + 2 * h + L * block_params(h) + h * h + 3 * h + V
    kv = shape["n_kv_head"] * (h // shape["n_head"])
    return 2 * V * h + L * (2 * h * h + 2 * h * kv + 8 * h * h)


def stage_layers(n_layer: int, pp: int) -> list[int]:
    """Blocks per pipeline stage (equal when pp divides the layers, as the rules require)."""
    return [n_layer // pp + (1 if i < n_layer % pp else 0) for i in range(pp)]


def stage_params(shape: dict[str, int], vocab_size: int, arch: str, sequence_len: int, tp: int = 1,
                 pp: int = 1) -> list[int]:
    """Parameters one GPU holds, per pipeline stage, after the tensor-parallel split (gpt3 only;
    the other families run with tp = pp = 1)."""
    if arch != "gpt3" or (tp, pp) == (1, 1):
        return [num_params(shape, vocab_size, arch, sequence_len)]
    h, V = shape["n_embd"], vocab_size
    stages = []
    for i, layers in enumerate(stage_layers(shape["n_layer"], pp)):
        n = layers * block_params(h, tp)
        if i == 0:
            n += V * h + sequence_len * h  # token and position embeddings
        if i == pp - 1:
            n += 2 * h + (V * h if pp > 1 else 0)  # final LayerNorm; the head's tied copy of wte
        stages.append(n)
    return stages


def largest_layer_params(shape: dict[str, int], vocab_size: int, arch: str = "gpt") -> int:
    """Parameters of the largest module (DeepSpeed's estimate_zero3 counts a module's own tensors:
    what ZeRO-3 gathers at once)."""
    h, V = shape["n_embd"], vocab_size
    if arch == "gpt3":
        return max(V * h, 4 * h * h + 4 * h)  # word embedding, or the fc layer with its bias
    if arch == "bert":
        return V * h + V  # the MLM decoder: the tied embedding matrix plus its own bias
    return max(V * h, 4 * h * h)


def flops_per_token(shape: dict[str, int], vocab_size: int, sequence_len: int, arch: str = "gpt") -> int:
    """Training FLOPs per token; mirrors each model's flops_per_token (tests assert equality) so that
    plan needs no torch model."""
    h, L, V = shape["n_embd"], shape["n_layer"], vocab_size
    attention = 12 * L * h * sequence_len
    if arch == "gpt3":
        return 6 * (L * 12 * h * h + V * h) + attention
    if arch == "bert":  # all but the embedding tables (biases and norms included, as models/bert.py
        # counts them), + the tied decoder on the predicted share of the positions
        tables = (V + BERT_POSITIONS + BERT_TOKEN_TYPES) * h
        return int(6 * (num_params(shape, V, arch) - tables) + 6 * BERT_MLM_SHARE * V * h + attention)
    matmul = num_params(shape, vocab_size) - V * h
    head_dim = h // shape["n_head"]
    return 6 * matmul + 12 * L * shape["n_head"] * head_dim * sequence_len


# --- memory ----------------------------------------------------------------------------------------

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


def precision(cfg: Config) -> str:
    """'bf16' where modules run in bf16 without autocast (DeepSpeed's pipeline engine), else
    'autocast' (train.py's loop: DDP with fp32 weights, ZeRO with bf16 weights, both under autocast)."""
    uses_engine = cfg.model.arch == "gpt3" and (cfg.parallel.tensor, cfg.parallel.pipeline) != (1, 1)
    return "bf16" if uses_engine and cfg.run.strategy == "deepspeed" else "autocast"


def layer_activations(shape: dict[str, int], seq: int, micro: int, arch: str, tp: int = 1,
                      mode: str = "autocast") -> float:
    """Bytes one block keeps for backward for one micro batch."""
    sbh = seq * micro * shape["n_embd"]
    if arch == "gpt":
        return ACTIVATION_BYTES_PER_LAYER * sbh
    scores = 5 * shape["n_head"] * seq * seq * micro / tp if ATTENTION_SCORES_STORED[arch] else 0
    return sbh * (REPLICATED_BYTES[arch, mode] + 24 / tp) + scores


def activations(shape: dict[str, int], vocab_size: int, seq: int, micro: int, softcap: float,
                checkpointing: bool, arch: str = "gpt", tp: int = 1, layers: int | None = None,
                in_flight: int = 1, logits: bool = True, mode: str = "autocast") -> float:
    """Activation bytes on one GPU: `layers` blocks (default all) with `in_flight` micro batches
    kept (pipeline), and the logits where this GPU computes the loss."""
    layers = shape["n_layer"] if layers is None else layers
    per_layer = layer_activations(shape, seq, micro, arch, tp, mode)
    if checkpointing:
        saved = 2 if arch == "gpt" else CHECKPOINT_BYTES[arch, mode]
        kept = in_flight * layers * saved * seq * micro * shape["n_embd"] + (per_layer if layers else 0)
    else:
        kept = in_flight * layers * per_layer
    if arch == "gpt":
        per_logit = 4 * (2 if softcap > 0 else 1)  # fp32 logits, and the softcapped copy
    else:
        per_logit = LOGITS_BYTES[arch]
    return kept + (micro * seq * vocab_size * per_logit if logits else 0)


def zero_stage(cfg: Config) -> int:
    """ZeRO stage of the config: 0 for DDP."""
    return cfg.deepspeed.zero_stage if cfg.run.strategy == "deepspeed" else 0


def layout_problems(cfg: Config) -> list[str]:
    """What the rules refuse about this layout and strategy (empty when allowed)."""
    shape = model_shape(cfg.model.size, cfg.model.n_kv_head, cfg.model.arch)
    return parallel_problems(cfg, shape, cfg.cluster.nodes * cfg.cluster.gpus_per_node)


def memory(cfg: Config) -> dict:
    """Per-GPU memory of the config's model, strategy and layout, for its most loaded GPU."""
    arch, seq, vocab, micro = cfg.model.arch, cfg.model.sequence_len, cfg.data.vocab_size, cfg.batch.micro_batch_size
    shape = model_shape(cfg.model.size, cfg.model.n_kv_head, arch)
    tp, pp = cfg.parallel.tensor, cfg.parallel.pipeline
    world = cfg.cluster.nodes * cfg.cluster.gpus_per_node
    nd = cfg.data_parallel_size(world)
    per_step = max(1, cfg.batch.global_batch_size // (micro * nd))  # micro batches per optimizer step
    stage, ds = zero_stage(cfg), cfg.deepspeed
    offload_opt, offload_params = stage > 0 and ds.offload_optimizer, stage == 3 and ds.offload_params
    layers = stage_layers(shape["n_layer"], pp)
    usable = gpu_memory(cfg.cluster.gpu_type) * (1 - RESERVE)
    worst = None
    for i, psi in enumerate(stage_params(shape, vocab, arch, seq, tp, pp)):
        kw = dict(arch=arch, tp=tp, layers=layers[i], in_flight=min(pp - i, per_step), logits=i == pp - 1,
                  mode=precision(cfg))
        act = {c: activations(shape, vocab, seq, micro, cfg.model.softcap, c, **kw) for c in (False, True)}
        states = model_states(psi, stage, nd, offload_opt, offload_params)
        total = states["weights"] + states["grads"] + states["optimizer"] + act[cfg.model.activation_checkpointing]
        if worst is None or total > worst["total"]:
            worst = {"pipeline_stage": i, "params_per_gpu": psi, **states, "activations": act[False],
                     "activations_checkpointed": act[True], "in_flight": kw["in_flight"], "total": total}
    problems = layout_problems(cfg)
    return {
        "params": num_params(shape, vocab, arch, seq), "tensor": tp, "pipeline": pp, "data_parallel": nd,
        **worst, "gpu": gpu_memory(cfg.cluster.gpu_type), "usable": usable, "problems": problems,
        "fits": worst["total"] <= usable and not problems,
    }


# --- the smallest change that fits ---------------------------------------------------------------

def changed(cfg: Config, **changes) -> Config:
    """A copy of cfg with dotted keys set: changed(cfg, **{"batch.micro_batch_size": 4})."""
    new = copy.deepcopy(cfg)
    for key, value in changes.items():
        section, name = key.split(".")
        setattr(getattr(new, section), name, value)
    return new


def with_strategy(cfg: Config, stage: int, offload_optimizer: bool = False, offload_params: bool = False) -> Config:
    """The config on DeepSpeed ZeRO `stage` (a ddp config at stage 0 stays ddp)."""
    strategy = "ddp" if stage == 0 and cfg.run.strategy == "ddp" else "deepspeed"
    return changed(cfg, **{"run.strategy": strategy, "deepspeed.zero_stage": stage if strategy == "deepspeed"
                           else cfg.deepspeed.zero_stage, "deepspeed.offload_optimizer": offload_optimizer,
                           "deepspeed.offload_params": offload_params})


def allowed(cfg: Config) -> bool:
    """The rules accept the layout and the global batch splits into micro batches x data ranks."""
    if layout_problems(cfg):
        return False
    try:
        resolve_grad_accum(cfg, cfg.data_parallel_size(cfg.cluster.nodes * cfg.cluster.gpus_per_node))
    except ConfigError:
        return False
    return True


def fits(cfg: Config) -> bool:
    return allowed(cfg) and memory(cfg)["fits"]


def same_hardware(cfg: Config):
    """Single changes on the same GPUs, in the order plan tries them: smaller micro batch,
    activation checkpointing, higher ZeRO stage, optimizer offload, more pipeline stages."""
    micro = cfg.batch.micro_batch_size // 2
    while micro >= 1:
        yield changed(cfg, **{"batch.micro_batch_size": micro, "batch.grad_accum_steps": None})
        micro //= 2
    if not cfg.model.activation_checkpointing:
        yield changed(cfg, **{"model.activation_checkpointing": True})
    stage = zero_stage(cfg)
    for higher in range(stage + 1, 4):
        yield with_strategy(cfg, higher)
    if not cfg.deepspeed.offload_optimizer or stage == 0:
        yield with_strategy(cfg, max(stage, 1), offload_optimizer=True)
    yield from more_stages(cfg)


def more_stages(cfg: Config):
    """gpt3: the next pipeline degrees that divide the layers (and the world), at ZeRO 0-1."""
    if cfg.model.arch != "gpt3":
        return
    layers = model_shape(cfg.model.size, None, "gpt3")["n_layer"]
    for pp in range(cfg.parallel.pipeline + 1, layers + 1):
        if layers % pp == 0:
            base = with_strategy(cfg, min(zero_stage(cfg), 1), cfg.deepspeed.offload_optimizer and zero_stage(cfg) > 0)
            if base.run.strategy == "ddp":
                base = changed(base, **{"run.strategy": "deepspeed", "deepspeed.zero_stage": 0})
            yield changed(base, **{"parallel.pipeline": pp})


def piles(cfg: Config):
    """The same changes added one on top of the other (a change the rules refuse is left out)."""
    micros = [m for m in range(1, cfg.batch.micro_batch_size + 1)
              if allowed(changed(cfg, **{"batch.micro_batch_size": m, "batch.grad_accum_steps": None}))]
    if micros:
        cfg = changed(cfg, **{"batch.micro_batch_size": micros[0], "batch.grad_accum_steps": None})
        yield cfg
    cfg = changed(cfg, **{"model.activation_checkpointing": True})
    yield cfg
    for stage in range(zero_stage(cfg) + 1, 4):
        if allowed(with_strategy(cfg, stage)):
            cfg = with_strategy(cfg, stage)
            yield cfg
    stage = max(zero_stage(cfg), 1)
    if allowed(with_strategy(cfg, stage, True)):
        cfg = with_strategy(cfg, stage, True)
        yield cfg
    if stage == 3:
        cfg = with_strategy(cfg, 3, True, True)
        yield cfg
    yield from more_stages(cfg)


def more_nodes(cfg: Config):
    """2x, 4x, ... the nodes at the highest ZeRO stage the layout allows (at least the current)."""
    nodes = cfg.cluster.nodes * 2
    while nodes <= 128:
        wider = changed(cfg, **{"cluster.nodes": nodes})
        ds = cfg.deepspeed
        stages = [s for s in range(zero_stage(cfg), 4) if allowed(with_strategy(wider, s))]
        yield (with_strategy(wider, stages[-1], ds.offload_optimizer and stages[-1] > 0,
                             ds.offload_params and stages[-1] == 3) if stages else wider)
        nodes *= 2


def describe(old: Config, new: Config) -> str:
    """The changes from old to new as config keys to set (and copier answers where there is one)."""
    parts = []
    if new.batch.micro_batch_size != old.batch.micro_batch_size:
        accum = resolve_grad_accum(new, new.data_parallel_size(new.cluster.nodes * new.cluster.gpus_per_node))
        parts.append(f"batch.micro_batch_size={new.batch.micro_batch_size} (grad accumulation {accum}, "
                     "global batch unchanged)")
    if new.model.activation_checkpointing and not old.model.activation_checkpointing:
        parts.append("activation checkpointing (model.activation_checkpointing=true)")
    ds_old, ds_new = old.deepspeed, new.deepspeed
    if (zero_stage(new), new.run.strategy, ds_new.offload_optimizer, ds_new.offload_params) != \
            (zero_stage(old), old.run.strategy, ds_old.offload_optimizer, ds_old.offload_params):
        what = f"ZeRO stage {zero_stage(new)}" + (" with the optimizer offloaded to CPU" if ds_new.offload_optimizer else "") \
            + (" and the parameters offloaded" if ds_new.offload_params else "")
        keys = [f"run.strategy={new.run.strategy}"] if new.run.strategy != old.run.strategy else []
        keys.append(f"deepspeed.zero_stage={ds_new.zero_stage}")
        keys += [f"deepspeed.offload_optimizer={str(ds_new.offload_optimizer).lower()}"] \
            if ds_new.offload_optimizer != ds_old.offload_optimizer else []
        keys += [f"deepspeed.offload_params={str(ds_new.offload_params).lower()}"] \
            if ds_new.offload_params != ds_old.offload_params else []
        answers = (["strategy=deepspeed"] if new.run.strategy != old.run.strategy else []) + \
            [f"zero_stage={ds_new.zero_stage}"]
        parts.append(f"{what} ({' '.join(keys)}; copier answers {', '.join(answers)})")
    if new.parallel.pipeline != old.parallel.pipeline:
        p = new.parallel.pipeline
        parts.append(f"{p} pipeline stages (parallel.pipeline={p}; copier answer pipeline_parallel={p})")
    if new.cluster.nodes != old.cluster.nodes:
        n = new.cluster.nodes
        parts.append(f"{n} nodes (cluster.nodes={n}; copier answer nodes={n})")
    return " + ".join(parts)


def suggest(cfg: Config) -> str | None:
    """The first single change on the same hardware that fits; then those changes piled up in the
    same order; then more nodes, alone and on top of the whole pile. None if nothing fits."""
    for cand in same_hardware(cfg):
        if fits(cand):
            return describe(cfg, cand)
    piled = list(piles(cfg))
    for cand in piled:
        if fits(cand):
            return "together: " + describe(cfg, cand)
    full = [c for c in piled if c.parallel.pipeline == cfg.parallel.pipeline][-1:]
    for base in (cfg, *full):
        for cand in more_nodes(base):
            if fits(cand):
                return ("" if base is cfg else "together: ") + describe(cfg, cand)
    return None


# --- time ------------------------------------------------------------------------------------------

def timing(cfg: Config, tokens: float, mfu: float) -> list[dict]:
    shape = model_shape(cfg.model.size, cfg.model.n_kv_head, cfg.model.arch)
    _, peak = gpu_spec(cfg.cluster.gpu_type)
    flops = tokens * flops_per_token(shape, cfg.data.vocab_size, cfg.model.sequence_len, cfg.model.arch)
    rows = []
    grid = cfg.parallel.tensor * cfg.parallel.pipeline
    for nodes in NODE_COUNTS:
        gpus = nodes * cfg.cluster.gpus_per_node
        hours = flops / (gpus * peak * mfu) / 3600
        rows.append({"nodes": nodes, "gpus": gpus, "hours": hours, "gpu_hours": hours * gpus,
                     "layout_fits": gpus % grid == 0})  # the tensor x pipeline grid must tile the GPUs
    return rows


# --- the check at copier time and the command ------------------------------------------------------

def fit_problem(cfg: Config) -> str | None:
    """None when the config fits its GPUs; else one line: the figures and the smallest change."""
    m = memory(cfg)
    if m["fits"]:
        return None
    if m["problems"]:
        return "refused: " + "; ".join(m["problems"])
    g = lambda b: f"{b / GIB:.1f}"  # noqa: E731
    act = m["activations_checkpointed" if cfg.model.activation_checkpointing else "activations"]
    where = f", pipeline stage {m['pipeline_stage']} of {m['pipeline']}" if m["pipeline"] > 1 else ""
    reason = (f"{cfg.model.arch} {cfg.model.size} on {cfg.cluster.nodes} x {cfg.cluster.gpus_per_node} "
              f"{cfg.cluster.gpu_type} ({strategy_text(cfg)}, tensor {m['tensor']} x pipeline {m['pipeline']} x data "
              f"{m['data_parallel']}, micro batch {cfg.batch.micro_batch_size}{where}) needs {g(m['total'])} GiB per GPU "
              f"(weights {g(m['weights'])} + grads {g(m['grads'])} + optimizer {g(m['optimizer'])} + activations "
              f"{g(act)}) > {g(m['usable'])} GiB usable of {m['gpu'] / GIB:.0f} GiB")
    return f"does not fit: {reason}; smallest change: {suggest(cfg) or 'none found (a smaller model or larger GPUs)'}"


def strategy_text(cfg: Config) -> str:
    if cfg.run.strategy != "deepspeed":
        return "DDP (ZeRO stage 0)"
    ds = cfg.deepspeed
    extras = [x for x, on in (("optimizer offload", ds.offload_optimizer), ("param offload", ds.offload_params)) if on]
    return f"DeepSpeed ZeRO stage {ds.zero_stage}" + (" + " + ", ".join(extras) if extras else "")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--zero-stage", type=int, choices=range(4),
                   help="0 = DDP; default: the config's strategy (run.strategy, deepspeed.zero_stage)")
    p.add_argument("--offload-optimizer", action="store_true", default=None,
                   help="optimizer states in host memory (DeepSpeed)")
    p.add_argument("--offload-params", action="store_true", default=None,
                   help="weights in host memory (DeepSpeed stage 3)")
    p.add_argument("--checkpointing", action="store_true",
                   help="assume full activation checkpointing (default: model.activation_checkpointing)")
    p.add_argument("--tokens", type=float, help="training tokens (default: max_steps x global batch x sequence_len)")
    p.add_argument("--mfu", type=float, default=0.4, help="assumed model FLOPs utilisation (default 0.4)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")


def with_flags(cfg: Config, args: argparse.Namespace) -> Config:
    """The config with plan's flags applied (they override the config's strategy)."""
    stage, ds = zero_stage(cfg), cfg.deepspeed
    offload_opt, offload_params = stage > 0 and ds.offload_optimizer, stage == 3 and ds.offload_params
    if args.zero_stage is not None:
        stage, offload_opt, offload_params = args.zero_stage, False, False
    offload_opt = offload_opt if args.offload_optimizer is None else args.offload_optimizer
    offload_params = offload_params if args.offload_params is None else args.offload_params
    if offload_params and stage != 3:
        raise ConfigError("--offload-params needs --zero-stage 3 (DeepSpeed offloads parameters only in stage 3)")
    if offload_opt and stage == 0:
        raise ConfigError("--offload-optimizer needs --zero-stage 1, 2 or 3 (DDP keeps the optimizer on the GPU)")
    cfg = with_strategy(cfg, stage, offload_opt, offload_params) if args.zero_stage is not None or offload_opt \
        or offload_params else cfg
    return changed(cfg, **{"model.activation_checkpointing": True}) if args.checkpointing else cfg


def build(cfg: Config, args: argparse.Namespace) -> dict:
    if not 0 < args.mfu <= 1:
        raise ConfigError(f"--mfu {args.mfu} must be in (0, 1], e.g. 0.4")
    cfg = with_flags(cfg, args)
    tokens = args.tokens or cfg.schedule.max_steps * cfg.batch.global_batch_size * cfg.model.sequence_len
    mem = memory(cfg)
    return {
        "model": cfg.model.size, "arch": cfg.model.arch, "gpu_type": cfg.cluster.gpu_type, "nodes": cfg.cluster.nodes,
        "gpus_per_node": cfg.cluster.gpus_per_node, "micro_batch_size": cfg.batch.micro_batch_size,
        "sequence_len": cfg.model.sequence_len, "strategy": strategy_text(cfg), "zero_stage": zero_stage(cfg),
        "offload_optimizer": cfg.deepspeed.offload_optimizer and zero_stage(cfg) > 0,
        "offload_params": cfg.deepspeed.offload_params and zero_stage(cfg) == 3,
        "checkpointing": cfg.model.activation_checkpointing, "memory": mem, "fits": mem["fits"],
        "suggestion": None if mem["fits"] else ("; ".join(mem["problems"]) if mem["problems"] else suggest(cfg)),
        "tokens": tokens, "mfu": args.mfu, "time": timing(cfg, tokens, args.mfu),
    }


def render(r: dict) -> str:
    m = r["memory"]
    g = lambda b: f"{b / GIB:8.2f} GiB"  # noqa: E731
    layout = f"tensor {m['tensor']} x pipeline {m['pipeline']} x data {m['data_parallel']}"
    lines = [
        f"model {r['arch']} {r['model']}: {m['params']:,} parameters | {r['strategy']} | "
        f"{r['nodes']} x {r['gpus_per_node']} {r['gpu_type']} ({layout}) | "
        f"micro batch {r['micro_batch_size']} x {r['sequence_len']} tokens",
        "",
    ]
    if m["pipeline"] > 1 or m["tensor"] > 1:
        lines.append(f"memory per GPU (most loaded: pipeline stage {m['pipeline_stage']} of {m['pipeline']}, "
                     f"{m['params_per_gpu']:,} parameters, {m['in_flight']} micro batch(es) in flight)")
    else:
        lines.append("memory per GPU")
    lines += [
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
    if m["problems"]:
        lines.append("verdict: refused by the rules: " + "; ".join(m["problems"]))
    else:
        lines.append(f"verdict: {'fits' if r['fits'] else 'does NOT fit'}")
        if not r["fits"]:
            lines.append(f"smallest change that fits: {r['suggestion'] or 'none found (a smaller model?)'}")
    lines += ["", f"time to train {r['tokens']:.3g} tokens at MFU {r['mfu']:.2f}",
              "  nodes  GPUs     hours  GPU-hours"]
    grid = f"tensor {m['tensor']} x pipeline {m['pipeline']} needs a multiple of {m['tensor'] * m['pipeline']} GPUs"
    lines += [f"  {t['nodes']:5d} {t['gpus']:5d} {t['hours']:9.2f} {t['gpu_hours']:10.1f}"
              + ("" if t["layout_fits"] else f"   ({grid})") for t in r["time"]]
    return "\n".join(lines)


def run(cfg: Config, args: argparse.Namespace) -> int:
    r = build(cfg, args)
    print(json.dumps(r, indent=2) if args.json else render(r))
    sys.stdout.flush()
    return 0 if r["fits"] else 1
