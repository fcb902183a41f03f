"""The nanochat-style GPT (models/gpt.py) as the rest of the project sees it: sizes by depth,
its formulas, and what it accepts (no torch here)."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ..settings.config import ConfigError
from .family import Family, chunked_loss_bytes
from .gpt_pieces import (
    SHAPED,
    attention_windows,
    gates,
    optimizer_roles,
    padded_vocab,
    scalars,
    smear_gate,
    value_tables,
)

# nanochat's reference run, where its learning rates were tuned: d12, 2^19 tokens a step.
REFERENCE_BATCH_TOKENS = 2**19
REFERENCE_WIDTH = 768
REFERENCE_DEPTH = 12

# Bytes per token per unit of width one block keeps for backward (measured under autocast: the
# bf16 inputs of its matmuls, the fp32 norms' and ReLU^2's, and SDPA's output and log-sum-exp).
ACTIVATION_BYTES_PER_LAYER = 63


@dataclass(frozen=True)
class GPTFamily(Family):
    def size_names(self) -> str:
        return "'tiny', or 'd<depth>' such as d20 (width 64 x depth in heads of 128)"

    def dims(self, size: str, n_kv_head: int | None = None) -> dict:
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

    def shape(self, size: str, n_kv_head: int | None = None, model=None) -> dict:
        """The dims of a size; with the model section (cfg.model) also which pieces it has, which
        the formulas count."""
        shape = self.dims(size, n_kv_head)
        if model is not None:
            shape |= {switch: getattr(model, switch) for switch in SHAPED}
        return shape

    def num_params(self, shape: dict, vocab_size: int, sequence_len: int) -> int:
        h, L, V = shape["n_embd"], shape["n_layer"], padded_vocab(vocab_size, shape.get("vocab_multiple", 1))
        kv = shape["n_kv_head"] * (h // shape["n_head"])
        base = 2 * V * h + L * (2 * h * h + 2 * h * kv + 8 * h * h)  # untied embedding and head; GQA's k, v
        return base + value_tables(shape, V) + gates(shape) + scalars(shape)

    def flops_per_token(self, shape: dict, vocab_size: int, sequence_len: int) -> int:
        """6 x matmul parameters (all but the lookups and the scalars) + attention's scores and values."""
        rows = padded_vocab(vocab_size, shape.get("vocab_multiple", 1))
        lookups = rows * shape["n_embd"] + value_tables(shape, rows)
        matmul = self.num_params(shape, vocab_size, sequence_len) - lookups - scalars(shape)
        head_dim = shape["n_embd"] // shape["n_head"]
        seen = sum(attention_windows(shape.get("window_pattern", "L"), shape["n_layer"], sequence_len))
        return 6 * matmul + 12 * shape["n_head"] * head_dim * seen

    def scaling_params(self, shape: dict, vocab_size: int, sequence_len: int = 0) -> int:
        """The blocks' matrices and the head: the count whose multiple is the compute-optimal number
        of tokens (nanochat's measure; embeddings and scalars left out)."""
        h = shape["n_embd"]
        kv = shape["n_kv_head"] * (h // shape["n_head"])
        rows = padded_vocab(vocab_size, shape.get("vocab_multiple", 1))
        return shape["n_layer"] * (10 * h * h + 2 * h * kv) + rows * h + gates(shape) - smear_gate(shape)

    def muon_params(self, shape: dict, vocab_size: int) -> int:
        """The blocks' matrices: the scaling parameters without the head."""
        return (
            self.scaling_params(shape, vocab_size)
            - padded_vocab(vocab_size, shape.get("vocab_multiple", 1)) * shape["n_embd"]
        )

    def optimizer_groups(self, cfg, shape: dict) -> dict[str, dict]:
        """Each parameter role's hyper-parameters under optim.optimizer=muon (nanochat's recipe): the
        optim.*_lr are for the reference run (REFERENCE_BATCH_TOKENS per step, width
        REFERENCE_WIDTH); every lr but the gates' scales with sqrt(batch tokens / reference), AdamW's
        table lrs also with 1/sqrt(width / reference), and Muon's weight decay with
        sqrt(batch / reference) x (reference horizon / this model's horizon), a compute-optimal
        horizon being a fixed multiple of scaling_params (Wang & Aitchison 2024: keep
        lr x wd x horizon / batch)."""
        o, V, h = cfg.optim, cfg.data.vocab_size, shape["n_embd"]
        batch_tokens = cfg.batch.global_batch_size * cfg.model.sequence_len
        batch = math.sqrt(batch_tokens / REFERENCE_BATCH_TOKENS)
        width = (h / REFERENCE_WIDTH) ** -0.5
        reference = self.scaling_params(self.dims(f"d{REFERENCE_DEPTH}"), V)
        decay = o.weight_decay * batch * reference / self.scaling_params(shape, V)
        adam = {"kind": "adamw", "eps": 1e-10}
        groups = {
            "matrix": {
                "kind": "muon",
                "lr": o.matrix_lr * batch,
                "weight_decay": decay,
                "momentum": 0.95,
                "beta2": 0.9,
            },
            "embedding": {**adam, "lr": o.embedding_lr * batch * width, "betas": (0.8, 0.995), "weight_decay": 0.001},
            "value_embedding": {
                **adam,
                "lr": o.embedding_lr * batch * width / 2,
                "betas": (0.8, 0.995),
                "weight_decay": 0.01,
            },
            "unembedding": {**adam, "lr": o.unembedding_lr * batch * width, "betas": (0.8, 0.96), "weight_decay": 0.01},
            "residual_scalar": {**adam, "lr": o.scalar_lr * batch * 0.01, "betas": (0.8, 0.95), "weight_decay": 0.05},
            "x0_scalar": {**adam, "lr": o.scalar_lr * batch, "betas": (0.96, 0.95), "weight_decay": 0.0},
            "gate_scalar": {**adam, "lr": 0.2, "betas": (0.8, 0.95), "weight_decay": 0.0},
        }
        return {role: hyper for role, hyper in groups.items() if role in optimizer_roles(shape)}

    def layer_activations(self, shape: dict, seq: int, micro: int, tp: int, mode: str, scores_stored: bool) -> float:
        return ACTIVATION_BYTES_PER_LAYER * seq * micro * shape["n_embd"]

    def checkpointed_layer_bytes(self, mode: str) -> float:
        return 2

    def logits_bytes(self, softcap: float) -> float:
        return 4 * (2 if softcap > 0 else 1)  # fp32 logits, and the softcapped copy

    def loss_bytes(self, shape: dict, vocab_size: int, tokens: int, softcap: float, chunked: bool = True) -> float:
        if not chunked:
            return super().loss_bytes(shape, vocab_size, tokens, softcap, chunked)
        rows = padded_vocab(vocab_size, shape.get("vocab_multiple", 1))
        return chunked_loss_bytes(shape["n_embd"], rows, tokens)


FAMILY = GPTFamily(
    name="gpt",
    summary="nanochat-style GPT trained from scratch (rotary, QK-norm, GQA, ReLU^2, untied head)",
    builder="gpt_build:build",
    exporter="gpt_build:to_transformers",
    grouped_query=True,
    muon=True,
    attention_dropout=False,
    rotary=True,
)
