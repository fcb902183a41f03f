"""GPT-3 (models/gpt3.py) as the rest of the project sees it: the paper's sizes, the seeds' parallel
layouts, its formulas, including per pipeline stage after the tensor split (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass

from .family import Family, block_params, chunked_loss_bytes, stage_layers, transformer_layer_activations

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

# The seeds' Megatron-DeepSpeed layouts (A100 40/80 GB nodes of 8), selectable as copier presets.
GPT3_LAYOUTS = {
    "125m-1gpu": {"size": "125M", "nodes": 1, "gpus_per_node": 1, "tp": 1, "pp": 1},
    "125m-2dp": {"size": "125M", "nodes": 1, "gpus_per_node": 2, "tp": 1, "pp": 1},
    "125m-4dp": {"size": "125M", "nodes": 1, "gpus_per_node": 4, "tp": 1, "pp": 1},
    "1.3b-4dp": {"size": "1.3B", "nodes": 1, "gpus_per_node": 4, "tp": 1, "pp": 1},
    "1.3b-8dp": {"size": "1.3B", "nodes": 1, "gpus_per_node": 8, "tp": 1, "pp": 1},
    "1.3b-4dp-4pp": {"size": "1.3B", "nodes": 2, "gpus_per_node": 8, "tp": 1, "pp": 4},
    "13b-4dp-4pp": {"size": "13B", "nodes": 2, "gpus_per_node": 8, "tp": 1, "pp": 4},
    "13b-4dp-8pp": {"size": "13B", "nodes": 4, "gpus_per_node": 8, "tp": 1, "pp": 8},
    "13b-4dp-4pp-4tp": {"size": "13B", "nodes": 8, "gpus_per_node": 8, "tp": 4, "pp": 4},
}


# Per layer, bytes per s*b*h that tensor parallelism does not split, by precision (Korthikanti's 10,
# measured; planning/estimates.py's docstring); the split part is 24/t. Checkpointed: the saved input.
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

    def loss_bytes(self, shape: dict, vocab_size: int, tokens: int, softcap: float, chunked: bool = True) -> float:
        if not chunked:  # DeepSpeed's pipeline: its last stage computes the whole logits
            return super().loss_bytes(shape, vocab_size, tokens, softcap, chunked)
        return chunked_loss_bytes(shape["n_embd"], vocab_size, tokens)


FAMILY = GPT3Family(
    name="gpt3",
    summary="GPT-3 sizes (125M to 175B) with tensor and pipeline parallelism on DeepSpeed",
    builder="gpt3:build_gpt3",
    exporter="gpt3:to_transformers",
    sizes=GPT3_SIZES,
    presets=GPT3_LAYOUTS,
    recipe_by_size=GPT3_RECIPES,
    layouts=True,
)
