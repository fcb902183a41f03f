"""The nanochat-style GPT (models/gpt.py) as the rest of the project sees it: sizes by depth,
its formulas, and what it accepts (no torch here)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..settings.config import ConfigError
from .family import Family

# Bytes per token per unit of width one block keeps for backward (measured under autocast: the
# bf16 inputs of its matmuls, the fp32 norms' and ReLU^2's, and SDPA's output and log-sum-exp).
ACTIVATION_BYTES_PER_LAYER = 63


@dataclass(frozen=True)
class GPTFamily(Family):
    def size_names(self) -> str:
        return "'tiny', or 'd<depth>' such as d20 (width 64 x depth in heads of 128)"

    def shape(self, size: str, n_kv_head: int | None = None) -> dict:
        """'tiny', or nanochat's depth dial 'd<depth>': width 64 x depth rounded up to heads of 128."""
        if size == "tiny":
            shape = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_kv_head": 2}
        else:
            match = re.fullmatch(r"d([1-9][0-9]*)", size)
            if not match:
                raise ConfigError(f"model.size={size!r} is not a gpt size; use 'tiny' or 'd<depth>' such as d20")
            depth = int(match.group(1))
            n_embd = math.ceil(64 * depth / 128) * 128
            shape = {"n_layer": depth, "n_embd": n_embd, "n_head": n_embd // 128, "n_kv_head": n_embd // 128}
        if n_kv_head is not None:
            shape["n_kv_head"] = n_kv_head
        return shape

    def num_params(self, shape: dict, vocab_size: int, sequence_len: int) -> int:
        h, L, V = shape["n_embd"], shape["n_layer"], vocab_size
        kv = shape["n_kv_head"] * (h // shape["n_head"])
        return 2 * V * h + L * (2 * h * h + 2 * h * kv + 8 * h * h)  # untied embedding and head; GQA's k, v

    def flops_per_token(self, shape: dict, vocab_size: int, sequence_len: int) -> int:
        """6 x matmul parameters (all but the embedding lookup) + attention's scores and values."""
        matmul = self.num_params(shape, vocab_size, sequence_len) - vocab_size * shape["n_embd"]
        head_dim = shape["n_embd"] // shape["n_head"]
        return 6 * matmul + 12 * shape["n_layer"] * shape["n_head"] * head_dim * sequence_len

    def layer_activations(self, shape: dict, seq: int, micro: int, tp: int, mode: str, scores_stored: bool) -> float:
        return ACTIVATION_BYTES_PER_LAYER * seq * micro * shape["n_embd"]

    def checkpointed_layer_bytes(self, mode: str) -> float:
        return 2

    def logits_bytes(self, softcap: float) -> float:
        return 4 * (2 if softcap > 0 else 1)  # fp32 logits, and the softcapped copy


FAMILY = GPTFamily(
    name="gpt",
    summary="nanochat-style GPT trained from scratch (rotary, QK-norm, GQA, ReLU^2, untied head)",
    builder="gpt:build",
    exporter="gpt:to_transformers",
    grouped_query=True,
    attention_dropout=False,
    rotary=True,
)
