"""The nanochat-style GPT (models/gpt/model.py) as the rest of the project sees it: sizes by depth,
its formulas, and what it accepts (no torch here).

Parameters: untied embedding and head V*h each, per layer q and proj h*h each, k and v h*kv_dim each
(grouped-query attention), MLP 8*h*h; no norm gains, no biases; nanochat's pieces where a config
switches them on (pieces.py). FLOPs per token: 6 x the weights that multiply (all but the input
embedding and the value tables) + attention's scores and values over the windows it sees.
Activations: 63*s*b*h bytes per layer (ACTIVATION_BYTES_PER_LAYER), measured on an H100 for this
block (torch 2.11, bf16 autocast, d20, vocab 8192, sequence 2048, micro batch 8 and 16: peak 31.2
and 56.9 GiB): the ReLU^2 MLP stores the fc output, its ReLU and its square (4h wide each), rotary +
QK-norm keep extra copies of q and k. The whole logits take b*s*V*4 bytes (upcast to fp32) and as
much again for the softcapped copy; training takes the chunked loss instead (models/loss_chunks.py).
nanochat's d20 at 2.2 s a step on 8 A800 is an MFU of 0.33 by this count (tests/test_plan.py).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from ...settings.config import ConfigError
from ..family import Family
from ..loss_chunks import chunked_loss_bytes
from ..new_project import LENGTH_ALTERNATIVES
from .pieces import (
    SHAPED,
    VALUE_GATE_CHANNELS,
    attention_windows,
    gates,
    optimizer_roles,
    padded_vocab,
    scalars,
    smear_gate,
    value_layers,
    value_tables,
)

# nanochat's reference run, where its learning rates were tuned: d12, 2^19 tokens a step.
REFERENCE_BATCH_TOKENS = 2**19
REFERENCE_WIDTH = 768
REFERENCE_DEPTH = 12
MUON_STRATEGIES = ("ddp", "fsdp")  # those whose plan runs_muon (strategies/memory.py): the recipe steps Muon there

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

    def repeated_block_params(self, shape: dict, vocab_size: int) -> int:
        """The largest block: attention's and the MLP's matrices, and a value embedding's gate where a
        layer has one (the tables themselves belong to the model, as do the embedding and head)."""
        h = shape["n_embd"]
        kv = shape["n_kv_head"] * (h // shape["n_head"])
        gate = VALUE_GATE_CHANNELS * shape["n_kv_head"] if value_layers(shape) else 0
        return 10 * h * h + 2 * h * kv + gate

    def lookup_tables(self, shape: dict, vocab_size: int) -> list[int]:
        """The token embedding and each value-embedding table (the head is untied)."""
        rows = padded_vocab(vocab_size, shape.get("vocab_multiple", 1))
        per_value_table = value_tables(shape, rows) // max(1, value_layers(shape))
        return [rows * shape["n_embd"]] + [per_value_table] * value_layers(shape)

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

    def config_settings(self, section: str, answers: dict) -> list[tuple[str | None, Any, str]]:
        """nanochat's recipe (gpt_recipe=nanochat: its rotary base, pieces, Muon, warmdown) or the
        earlier one (AdamW at one rate, cosine)."""
        nanochat = answers.get("gpt_recipe", "nanochat") == "nanochat"
        if section == "model":
            return [
                ("size", answers["model_size"], "'tiny' for CPU smoke runs, or d<depth>: width 64*depth, heads of 128 (d20: 477M params at a 32k vocab, 897M with value embeddings)"),
                ("n_kv_head", None, "grouped-query attention: fewer key/value heads than query heads; null = equal"),
                ("sequence_len", 2048, "tokens per sequence"),
                ("softcap", 15.0, "tanh cap on the logits; 0 disables"),
                ("dropout", None, "embedding and residual dropout (e.g. 0.1), masks per sample: any layout gives the same losses; null = none"),
                ("rotary_base", 100000.0 if nanochat else 10000.0, "base of the rotary frequencies"),
                ("init", "unit", "unit: embedding std 1 | scaled: embedding std 0.8, MLP input 0.4x (nanochat's; worse at d4: bench)"),
                ("vocab_multiple", 64 if nanochat else 1, "the embedding and head tables' rows rounded up to this (the GPU's tiles); extra logits cut off"),
                (None, "", "nanochat's further pieces (README, \"The gpt recipe\": what each measured); `export` writes a model with any on"),
                (None, "", "with its own modeling code (trust_remote_code), as transformers' NanoChatForCausalLM has no place for them"),
                ("value_embeddings", nanochat, "value embeddings on alternating layers, gated per head (d4 at 614K tokens: -0.021 bpb; +88% parameters at d20)"),
                ("residual_scalars", nanochat, "learned per-layer scales of the residual stream and of the input embedding"),
                ("smear", nanochat, "each position takes in a gated share of the previous token's embedding (d6 at 1.2M tokens: -0.015 bpb)"),
                ("backout", False, "a learned share of the middle layer's output is taken out before the head"),
                ("qk_scale", 1.2 if nanochat else 1.0, "queries and keys scaled after QK-norm (nanochat's 1.2)"),
                ("window_pattern", "SSSL" if nanochat else "L", "attention per layer, tiled: S a window of a quarter of the sequence, L all; the last layer always L (nanochat's SSSL: d4 at 1.2M tokens -0.012 bpb, 3 seeds; compiled on a GPU flex attention skips what the window hides)"),
            ]  # fmt: skip
        if section == "data":
            return [("rows", "documents" if nanochat else "windows", "training rows: documents (each starts at one, packed best-fit: nanochat's; d4 at 614K tokens -0.023 bpb) | windows (the stream cut every sequence_len)")]  # fmt: skip
        if section == "optim" and nanochat:
            return [
                ("optimizer", "muon" if answers["strategy"] in MUON_STRATEGIES else "adamw", "muon: Muon for the blocks' matrices, AdamW for the rest (run.strategy=ddp or fsdp) | adamw: AdamW at lr for all"),
                (None, "", "Muon's recipe (nanochat's): the rates for 2^19 tokens a step at width 768, scaled to this run's batch and width (`plan` prints them)"),
                ("matrix_lr", 0.02, ""),
                ("embedding_lr", 0.3, ""),
                ("unembedding_lr", 0.008, ""),
                ("scalar_lr", 0.5, ""),
                ("weight_decay", 0.28, "Muon's cautious weight decay at the reference, scaled to the batch and model, decaying to 0"),
                ("lr", self.recipe(answers["model_size"])["lr"], "AdamW's peak learning rate under optimizer: adamw"),
                ("beta1", 0.9, ""),
                ("beta2", self.beta2, ""),
                ("grad_clip", 0.0 if answers["strategy"] in MUON_STRATEGIES else 1.0, "global gradient norm; 0 disables (Muon's recipe clips nothing, as nanochat; 1.0 under adamw)"),
            ]  # fmt: skip
        if section == "optim":
            lines = super().config_settings(section, answers)
            return [("optimizer", "adamw", "AdamW at lr for every parameter | muon: Muon for the blocks' matrices (gpt_recipe=nanochat)"), *lines[1:]]  # fmt: skip
        if section == "schedule" and nanochat:
            return [
                ("max_steps", 20000, ""),
                *LENGTH_ALTERNATIVES,
                ("warmup_steps", 40, ""),
                ("decay", "warmdown", "constant, then linear to lr * min_lr_ratio over the last warmdown_ratio of the steps | cosine"),
                ("warmdown_ratio", 0.65, ""),
                ("min_lr_ratio", 0.05, ""),
            ]  # fmt: skip
        return super().config_settings(section, answers)

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
    builder="build:build",
    exporter="build:to_transformers",
    grouped_query=True,
    muon=True,
    attention_dropout=False,
    rotary=True,
    title="nanochat-style GPT",
    default_size="d20",
    default_strategy="ddp",
    recipes=("nanochat", "adamw"),
    exports_own_code=True,
)
