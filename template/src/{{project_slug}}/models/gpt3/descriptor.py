"""GPT-3 (models/gpt3/model.py) as the rest of the project sees it: the paper's sizes, the seeds' parallel
layouts, its formulas, including per pipeline stage after the tensor split (no torch here).

Parameters: V*h + S*h (learned positions of sequence_len S) + L*(12h^2 + 13h) + 2h (final
LayerNorm); the head is the word embedding again. Tensor degree t splits each block's four matrices
and the column-parallel biases (qkv 3h, fc 4h); the row-parallel biases (proj, fc2), the LayerNorms
and the embeddings are replicated (no vocabulary-parallel split). Pipeline degree p: every stage
holds L/p blocks, stage 0 also the embeddings, the last stage the final LayerNorm and a tied copy of
the word embedding for the head. FLOPs per token: the blocks' matrices and the tied head, Megatron's
72*L*h^2 + 6*V*h, + 12*L*h*S for attention. Activations: Korthikanti et al. (costs.py
transformer_layer_activations; it calls F.scaled_dot_product_attention directly) with the measured
REPLICATED_BYTES below; the whole logits on the last stage 12 bytes per b*s*V (bf16 logits, their
fp32 copy for the loss and the log-softmax: 4 would be too few by 3x), where the pipeline engine
gives its loss the whole logits (else the chunked loss). The seeds' Megatron-DeepSpeed times on
A100 40GB (125M, 2.5B tokens, 1 GPU, ~8 h; 1.3B, 26B tokens, 4 GPUs, ~8 d) both correspond to an
MFU of about 0.27 by this count (tests/test_plan.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ..costs import block_params, stage_layers, transformer_layer_activations
from ..family import Family
from ..loss_chunks import chunked_loss_bytes
from ..new_project import LENGTH_ALTERNATIVES

# GPT-3 paper, Table 2.1: layers, width, heads, batch in tokens (here in 2048-token sequences:
# 0.5M -> 256, 1M -> 512, 2M -> 1024, 3.2M -> 1536 as Megatron runs it) and learning rate.
# Two printed values cannot be built and every reproduction (Megatron-DeepSpeed included) changes them:
# 1.3B lists 24 heads of 128 for width 2048 (16 heads of 128 here); 13B lists d_model 5140 (40 x 128 = 5120).
GPT3_SIZES = {
    "tiny": {"n_layer": 4, "n_embd": 64, "n_head": 4, "global_batch": 16, "lr": 1e-3},
    "125M": {"n_layer": 12, "n_embd": 768, "n_head": 12, "global_batch": 256, "lr": 6.0e-4},
    "350M": {"n_layer": 24, "n_embd": 1024, "n_head": 16, "global_batch": 256, "lr": 3.0e-4},
    "760M": {"n_layer": 24, "n_embd": 1536, "n_head": 16, "global_batch": 256, "lr": 2.5e-4},
    "1.3B": {"n_layer": 24, "n_embd": 2048, "n_head": 16, "global_batch": 512, "lr": 2.0e-4},
    "2.7B": {"n_layer": 32, "n_embd": 2560, "n_head": 32, "global_batch": 512, "lr": 1.6e-4},
    "6.7B": {"n_layer": 32, "n_embd": 4096, "n_head": 32, "global_batch": 1024, "lr": 1.2e-4},
    "13B": {"n_layer": 40, "n_embd": 5120, "n_head": 40, "global_batch": 1024, "lr": 1.0e-4},
    "175B": {"n_layer": 96, "n_embd": 12288, "n_head": 96, "global_batch": 1536, "lr": 0.6e-4},
}

# Micro batch per size (sequences per forward on one GPU: what the seeds' layouts fit on A100s) and
# the nominal parameters the step budget is counted from (20 tokens per parameter).
GPT3_RECIPES = {
    size: {"global_batch": row["global_batch"], "lr": row["lr"], "micro_batch": micro, "params": params}
    for (size, row), (micro, params) in zip(
        GPT3_SIZES.items(),
        [(2, 2e6), (8, 125e6), (8, 350e6), (4, 760e6), (4, 1.3e9), (2, 2.7e9), (1, 6.7e9), (1, 13e9), (1, 175e9)],
    )
}

# The seeds' Megatron-DeepSpeed layouts (A100 nodes of 8: 80 GB for 13B, 40 GB for the rest), copier's presets.
GPT3_LAYOUTS = {
    "125m-1gpu": {"size": "125M", "nodes": 1, "gpus_per_node": 1, "tp": 1, "pp": 1, "gpu_type": "a100-40gb"},
    "125m-2dp": {"size": "125M", "nodes": 1, "gpus_per_node": 2, "tp": 1, "pp": 1, "gpu_type": "a100-40gb"},
    "125m-4dp": {"size": "125M", "nodes": 1, "gpus_per_node": 4, "tp": 1, "pp": 1, "gpu_type": "a100-40gb"},
    "1.3b-4dp": {"size": "1.3B", "nodes": 1, "gpus_per_node": 4, "tp": 1, "pp": 1, "gpu_type": "a100-40gb"},
    "1.3b-8dp": {"size": "1.3B", "nodes": 1, "gpus_per_node": 8, "tp": 1, "pp": 1, "gpu_type": "a100-40gb"},
    "1.3b-4dp-4pp": {"size": "1.3B", "nodes": 2, "gpus_per_node": 8, "tp": 1, "pp": 4, "gpu_type": "a100-40gb"},
    "13b-4dp-4pp": {"size": "13B", "nodes": 2, "gpus_per_node": 8, "tp": 1, "pp": 4, "gpu_type": "a100-80gb"},
    "13b-4dp-8pp": {"size": "13B", "nodes": 4, "gpus_per_node": 8, "tp": 1, "pp": 8, "gpu_type": "a100-80gb"},
    "13b-4dp-4pp-4tp": {"size": "13B", "nodes": 8, "gpus_per_node": 8, "tp": 4, "pp": 4, "gpu_type": "a100-80gb"},
}


# Per layer, bytes per s*b*h that tensor parallelism does not split, by precision; the split part is
# 24/t. Measured (H100, torch 2.11, width 1024, layers 4 vs 12, two micro batches, peak allocated
# memory of one forward + backward) rather than taken as Korthikanti's 10, because the precision
# changes it; no dropout: 8 in pure bf16 (32 in all: the pipeline engine's bf16 modules), 12 under
# autocast (36: the training loop's, whose LayerNorms run and return fp32). Checkpointed: the saved
# input, 4 under autocast as the residual stream is fp32.
REPLICATED_BYTES = {"bf16": 8, "autocast": 12}
CHECKPOINT_BYTES = {"bf16": 2, "autocast": 4}


@dataclass(frozen=True)
class GPT3Family(Family):
    def num_params(self, shape: dict, vocab_size: int, sequence_len: int) -> int:
        h, L, V = shape["n_embd"], shape["n_layer"], vocab_size
        return V * h + sequence_len * h + L * block_params(h) + 2 * h  # tied head; learned positions

    def flops_per_token(self, shape: dict, vocab_size: int, sequence_len: int) -> int:
        h, L, V = shape["n_embd"], shape["n_layer"], vocab_size
        return 6 * (L * 12 * h * h + V * h) + 12 * L * h * sequence_len

    def largest_layer_params(self, shape: dict, vocab_size: int) -> int:
        h = shape["n_embd"]
        return max(vocab_size * h, 4 * h * h + 4 * h)  # word embedding, or the fc layer with its bias

    def stage_params(self, shape: dict, vocab_size: int, sequence_len: int, tp: int, pp: int) -> list[int]:
        if (tp, pp) == (1, 1):
            return [self.num_params(shape, vocab_size, sequence_len)]
        h, V, stages = shape["n_embd"], vocab_size, []
        for i, layers in enumerate(stage_layers(shape["n_layer"], pp)):
            n = layers * block_params(h, tp)
            if i == 0:
                n += V * h + sequence_len * h  # token and position embeddings
            if i == pp - 1:
                n += 2 * h + (V * h if pp > 1 else 0)  # final LayerNorm; the head's tied copy of wte
            stages.append(n)
        return stages

    def layer_activations(self, shape: dict, seq: int, micro: int, tp: int, mode: str, scores_stored: bool) -> float:
        return transformer_layer_activations(shape, seq, micro, tp, REPLICATED_BYTES[mode], scores_stored)

    def checkpointed_layer_bytes(self, mode: str) -> float:
        return CHECKPOINT_BYTES[mode]

    def config_settings(self, section: str, answers: dict) -> list[tuple[str | None, Any, str]]:
        """The paper's recipe for the size: its lr, and a budget of 20 tokens per parameter with GPT-3's
        warmup over 375M tokens."""
        size = answers["model_size"]
        recipe = self.recipe(size)
        if section == "model":
            return [
                ("size", size, f"{' | '.join(self.sizes)} (GPT-3 paper, Table 2.1)"),
                ("sequence_len", 2048, "GPT-3's context"),
                ("dropout", None, "hidden dropout (Megatron's 0.1), masks per sample; null = none"),
                ("attention_dropout", None, "dropout of the attention probabilities (Megatron's 0.1); null = none, which keeps the fused flash kernel"),
            ]  # fmt: skip
        if section == "optim":
            lines = super().config_settings(section, answers)
            return [lines[0], ("lr", recipe["lr"], f"AdamW peak learning rate (GPT-3 paper for {size})"), *lines[2:]]
        if section == "schedule":
            tokens_per_step = recipe["global_batch"] * 2048
            steps = math.ceil(20 * recipe["params"] / tokens_per_step)
            return [
                ("max_steps", steps, "20 tokens per parameter (the seeds' budgets: 125M -> 2.5B, 1.3B -> 26B, 13B -> 260B tokens)"),
                *LENGTH_ALTERNATIVES,
                ("warmup_steps", min(math.ceil(375e6 / tokens_per_step), steps // 10), "GPT-3 warmed up over 375M tokens"),
                ("min_lr_ratio", 0.1, "cosine decays to lr * min_lr_ratio"),
            ]  # fmt: skip
        return super().config_settings(section, answers)

    def loss_bytes(self, shape: dict, vocab_size: int, tokens: int, softcap: float, chunked: bool = True) -> float:
        if not chunked:  # DeepSpeed's pipeline: its last stage computes the whole logits
            return super().loss_bytes(shape, vocab_size, tokens, softcap, chunked)
        return chunked_loss_bytes(shape["n_embd"], vocab_size, tokens)


FAMILY = GPT3Family(
    name="gpt3",
    summary="GPT-3 sizes (125M to 175B) with tensor and pipeline parallelism on DeepSpeed",
    builder="model:build_gpt3",
    exporter="model:to_transformers",
    pipeline_layers="model:pipeline_layers",
    sizes=GPT3_SIZES,
    presets=GPT3_LAYOUTS,
    recipe_by_size=GPT3_RECIPES,
    title="GPT-3 {size}",
    default_size="125M",
    default_strategy="deepspeed",
    vocab_size=50304,
    vocab_note="GPT-2's 50257 padded to a multiple of 128",
)
