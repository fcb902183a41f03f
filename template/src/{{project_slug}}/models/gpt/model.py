"""A nanochat-style GPT in plain PyTorch.

Rotary position embeddings, QK-norm, RMSNorm without learnable parameters, no biases, ReLU^2 MLP,
untied input embedding and output head, grouped-query attention (n_kv_head < n_head) and
F.scaled_dot_product_attention (sliding windows, compiled on a GPU: flex attention). nanochat's later pieces are switches of model.* (config.py): value
embeddings, residual and input-embedding scalars, smear, backout, the q/k scale, the rotary base and
its initialisation. The file knows nothing of distribution: strategies/ wraps it for the run's strategy.
It imports torch and its siblings only (gpt/pieces.py, lm_loss.py, sample_dropout.py): an export of a
model with pieces transformers has no class for carries these four files as its modeling code
(gpt/export.py); gpt/build.py builds the network of a project's config. With targets and a
gradient to come, the head and the loss run chunk by chunk (lm_loss.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from ..lm_loss import chunked, linear_cross_entropy
from ..sample_dropout import keyed_dropout
from .pieces import (
    SMEAR_GATE_CHANNELS,
    VALUE_GATE_CHANNELS,
    attention_windows,
    has_backout,
    has_value_embedding,
    padded_vocab,
)


@dataclass
class GPTConfig:
    vocab_size: int
    sequence_len: int
    n_layer: int
    n_embd: int
    n_head: int
    n_kv_head: int
    softcap: float = 15.0
    dropout: float = 0.0
    """On the embedding and each residual branch, masks keyed per sample (sample_dropout.py)."""
    value_embeddings: bool = False
    residual_scalars: bool = False
    smear: bool = False
    backout: bool = False
    qk_scale: float = 1.0
    rotary_base: float = 10000.0
    init: str = "unit"
    window_pattern: str = "L"
    vocab_multiple: int = 1

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


def rms_norm(x: torch.Tensor) -> torch.Tensor:
    # No learnable gain: one fewer thing to tune and to shard.
    return F.rms_norm(x, (x.size(-1),))


def rotary_tables(length: int, head_dim: int, base: float = 10000.0, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of shape (1, length, 1, head_dim/2), broadcastable over (B, T, H, D/2)."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim))
    angles = torch.outer(torch.arange(length, dtype=torch.float32, device=device), inv_freq)
    return angles.cos()[None, :, None, :], angles.sin()[None, :, None, :]


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.size(-1) // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos + x2 * sin, x2 * cos - x1 * sin], dim=-1).type_as(x)


class KVCache:
    """Keys and values of every layer for incremental decoding; `length` tokens are stored, and the
    last token's embedding (smear mixes it into the next one)."""

    def __init__(self, n_layer: int):
        self.keys: list[torch.Tensor | None] = [None] * n_layer
        self.values: list[torch.Tensor | None] = [None] * n_layer
        self.length = 0
        self.last_embedding: torch.Tensor | None = None

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.keys[layer] is not None:
            k = torch.cat([self.keys[layer], k], dim=2)
            v = torch.cat([self.values[layer], v], dim=2)
        self.keys[layer], self.values[layer] = k, v
        return k, v


def windowed_flex_attention(q, k, v, window: int, gqa: bool) -> torch.Tensor:
    """Causal attention over the whole sequence where each query sees `window` earlier positions
    (q, k, v: (B, heads, T, head_dim)), by torch's flex attention: its block mask skips the tiles wholly
    outside the window, so a short window costs a fraction of full attention's FLOPs where SDPA's mask
    computes them all. Compiled only (eager flex attention materialises the scores; no CPU backward)."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def within(batch, head, query, key):
        return (key <= query) & (query - key <= window)

    T = q.size(-2)
    return flex_attention(
        q, k, v, block_mask=create_block_mask(within, None, None, T, T, device=q.device), enable_gqa=gqa
    )


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig, layer: int):
        super().__init__()
        self.layer, self.n_head, self.n_kv_head, self.head_dim = layer, cfg.n_head, cfg.n_kv_head, cfg.head_dim
        self.c_q = nn.Linear(cfg.n_embd, cfg.n_head * cfg.head_dim, bias=False)
        self.c_k = nn.Linear(cfg.n_embd, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.c_v = nn.Linear(cfg.n_embd, cfg.n_kv_head * cfg.head_dim, bias=False)
        self.c_proj = nn.Linear(cfg.n_head * cfg.head_dim, cfg.n_embd, bias=False)
        self.qk_scale = cfg.qk_scale
        # Earlier positions a query sees besides its own (a sliding window where below the sequence).
        self.window = attention_windows(cfg.window_pattern, cfg.n_layer, cfg.sequence_len)[layer]
        self.sliding = self.window < cfg.sequence_len
        self.ve_gate = (
            nn.Linear(VALUE_GATE_CHANNELS, cfg.n_kv_head, bias=False)
            if cfg.value_embeddings and has_value_embedding(layer, cfg.n_layer)
            else None
        )

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cache: KVCache | None,
        ve: torch.Tensor | None = None,
    ) -> torch.Tensor:
        B, T, _ = x.shape
        q = self.c_q(x).view(B, T, self.n_head, self.head_dim)
        k = self.c_k(x).view(B, T, self.n_kv_head, self.head_dim)
        v = self.c_v(x).view(B, T, self.n_kv_head, self.head_dim)
        if ve is not None:  # the value embedding, let in per head by a gate in (0, 3)
            gate = 3 * torch.sigmoid(self.ve_gate(x[..., :VALUE_GATE_CHANNELS]))
            v = v + gate.unsqueeze(-1) * ve.view(B, T, self.n_kv_head, self.head_dim)
        # QK-norm after rotary keeps attention logits bounded without a learned scale.
        q, k = rms_norm(apply_rotary(q, cos, sin)), rms_norm(apply_rotary(k, cos, sin))
        if self.qk_scale != 1.0:  # sharper attention than unit-norm queries and keys give
            q, k = q * self.qk_scale, k * self.qk_scale
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        past = 0
        if cache is not None:
            past = cache.length
            k, v = cache.append(self.layer, k, v)
        gqa = self.n_kv_head != self.n_head
        if past == 0 and not self.sliding:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        elif past == 0 and q.is_cuda and torch.compiler.is_compiling():
            y = windowed_flex_attention(q, k, v, self.window, gqa)  # training on a GPU: skips what the window hides
        else:
            # New queries see the cached positions and the causal part of their own chunk, within the
            # window (a mask: SDPA computes every block, the hidden ones too).
            query = torch.arange(past, past + T, device=x.device)[:, None]
            key = torch.arange(past + T, device=x.device)[None, :]
            allowed = key <= query
            if self.sliding:
                allowed &= query - key <= self.window
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=gqa)
        return self.c_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(F.relu(self.c_fc(x)).square())


class Block(nn.Module):
    def __init__(self, cfg: GPTConfig, layer: int):
        super().__init__()
        self.layer, self.dropout = layer, cfg.dropout
        self.attn = CausalSelfAttention(cfg, layer)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, cache, ve=None):
        # Dropout keys: 0 is the embedding, 2*layer+1 and 2*layer+2 this block's two branches.
        x = x + keyed_dropout(
            self.attn(rms_norm(x), cos, sin, cache, ve), self.dropout, 2 * self.layer + 1, self.training
        )
        return x + keyed_dropout(self.mlp(rms_norm(x)), self.dropout, 2 * self.layer + 2, self.training)


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.config = cfg
        self.checkpointing = False  # model.activation_checkpointing: recompute blocks in backward
        rows = padded_vocab(cfg.vocab_size, cfg.vocab_multiple)
        self.wte = nn.Embedding(rows, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layer))
        self.lm_head = nn.Linear(cfg.n_embd, rows, bias=False)
        kv_dim = cfg.n_kv_head * cfg.head_dim
        self.value_embeds = nn.ModuleDict(
            {str(i): nn.Embedding(rows, kv_dim) for i in range(cfg.n_layer) if self.ve_gate(i) is not None}
        )
        if cfg.residual_scalars:
            self.resid_lambdas = nn.Parameter(torch.ones(cfg.n_layer))
            self.x0_lambdas = nn.Parameter(torch.zeros(cfg.n_layer))
        if cfg.smear:
            self.smear_gate = nn.Linear(SMEAR_GATE_CHANNELS, 1, bias=False)
            self.smear_lambda = nn.Parameter(torch.zeros(1))
        if has_backout(cfg.backout, cfg.n_layer):
            self.backout_lambda = nn.Parameter(torch.zeros(1))
        # Rotary tables cover 10x the training context so sampling can run past it.
        cos, sin = rotary_tables(cfg.sequence_len * 10, cfg.head_dim, cfg.rotary_base)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def ve_gate(self, layer: int):
        return self.blocks[layer].attn.ve_gate

    @torch.no_grad()
    def init_weights(self) -> None:
        """Embedding ~ N(0, 1) (init=scaled: 0.8); matrices uniform with std 1/sqrt(width) (the MLP's
        input at 0.4x under init=scaled); output projections and a head initialised near 0 start every
        residual branch and the logits small, so early steps are stable. Value embeddings as the
        value matrices; gates slightly open; the residual scale from 1.15 down to 1.05 and the input
        embedding's share from 0.2 down to 0.05 with depth; no smear; backout at 0.2."""
        c = self.config
        scaled = c.init == "scaled"
        nn.init.normal_(self.wte.weight, std=0.8 if scaled else 1.0)
        nn.init.normal_(self.lm_head.weight, std=0.001)
        bound = 3**0.5 * c.n_embd**-0.5
        for block in self.blocks:
            for lin in (block.attn.c_q, block.attn.c_k, block.attn.c_v):
                nn.init.uniform_(lin.weight, -bound, bound)
            fc = 0.4 * bound if scaled else bound
            nn.init.uniform_(block.mlp.c_fc.weight, -fc, fc)
            nn.init.zeros_(block.attn.c_proj.weight)
            nn.init.zeros_(block.mlp.c_proj.weight)
            if block.attn.ve_gate is not None:
                nn.init.uniform_(block.attn.ve_gate.weight, 0.0, 0.02)
        for table in self.value_embeds.values():
            nn.init.uniform_(table.weight, -bound, bound)
        if c.residual_scalars:
            depth = torch.arange(c.n_layer, dtype=torch.float32) / max(c.n_layer - 1, 1)
            self.resid_lambdas.copy_(1.15 - 0.10 * depth)
            self.x0_lambdas.copy_(0.20 - 0.15 * depth)
        if c.smear:
            nn.init.uniform_(self.smear_gate.weight, 0.0, 0.02)
            nn.init.zeros_(self.smear_lambda)
        if has_backout(c.backout, c.n_layer):
            nn.init.constant_(self.backout_lambda, 0.2)
        self.init_rotary()

    @torch.no_grad()
    def init_rotary(self) -> None:
        """The rotary tables (buffers kept out of checkpoints), for wherever the module was made."""
        c = self.config
        cos, sin = rotary_tables(self.cos.size(1), c.head_dim, c.rotary_base, device=self.cos.device)
        self.cos.copy_(cos)
        self.sin.copy_(sin)

    def param_roles(self) -> dict[str, str]:
        """Each parameter's role for the optimizer (strategies/optimizer.py): "matrix" (Muon),
        "embedding", "value_embedding", "unembedding", "residual_scalar", "x0_scalar", "gate_scalar"."""
        roles = {}
        for name, _ in self.named_parameters():
            if name.startswith("blocks."):
                roles[name] = "matrix"
            elif name.startswith("value_embeds."):
                roles[name] = "value_embedding"
            else:
                roles[name] = {
                    "wte.weight": "embedding",
                    "lm_head.weight": "unembedding",
                    "resid_lambdas": "residual_scalar",
                    "x0_lambdas": "x0_scalar",
                }.get(name, "gate_scalar")  # smear and backout
        return roles

    def lookup_tables(self) -> list[nn.Embedding]:
        """The tables only ever read by a lookup through their module (the head is untied, and no
        weight of theirs is read directly): a sharding strategy may gather each on its own."""
        return [self.wte, *self.value_embeds.values()]

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self) -> int:
        """Training FLOPs per token, counted on the module: 6 x the weights of its matmuls (every
        nn.Linear; the tables are lookups, the scalars element-wise) + attention's scores and values
        (12 x heads x head_dim x the positions each layer sees). planning/ derives the same from the
        shape."""
        matmul = sum(m.weight.numel() for m in self.modules() if isinstance(m, nn.Linear))
        return 6 * matmul + sum(12 * b.attn.n_head * b.attn.head_dim * b.attn.window for b in self.blocks)

    def forward(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        cache: KVCache | None = None,
        loss_reduction: str = "mean",
    ) -> torch.Tensor:
        """Logits (B, T, vocab) without targets; with targets the cross-entropy loss
        (targets of -1 are ignored; loss_reduction='none' gives it per token). Where a gradient
        will be asked for, the loss of 'mean' or 'sum' comes from lm_loss.py's chunks, equal to the
        logits' within fp32 rounding."""
        T = idx.size(1)
        start = cache.length if cache is not None else 0
        cos, sin = self.cos[:, start : start + T], self.sin[:, start : start + T]
        c = self.config
        x = rms_norm(self.wte(idx))
        if c.smear:
            x = self._smear(x, cache)
        x = keyed_dropout(x, c.dropout, 0, self.training)
        x0, middle = x, None
        for i, block in enumerate(self.blocks):
            if c.residual_scalars:
                x = self.resid_lambdas[i] * x + self.x0_lambdas[i] * x0
            ve = self.value_embeds[str(i)](idx) if str(i) in self.value_embeds else None
            if self.checkpointing and self.training and cache is None:
                # Keep only the block's input; its activations are recomputed during backward.
                x = torch.utils.checkpoint.checkpoint(block, x, cos, sin, None, ve, use_reentrant=False)
            else:
                x = block(x, cos, sin, cache, ve)
            if i == c.n_layer // 2:
                middle = x
        if has_backout(c.backout, c.n_layer):  # the middle layer's features, partly taken back out before the head
            x = x - self.backout_lambda * middle
        if cache is not None:
            cache.length += T
        x = rms_norm(x)
        if targets is not None and chunked(loss_reduction, x, self.lm_head.weight):
            # Training's loss: the head and the loss chunk by chunk, never the whole logits (lm_loss.py).
            return linear_cross_entropy(x, self.lm_head.weight, targets, c.vocab_size, c.softcap, loss_reduction)
        logits = self.lm_head(x)[..., : c.vocab_size].float()  # the padding's rows cut off
        if self.config.softcap > 0:
            logits = self.config.softcap * torch.tanh(logits / self.config.softcap)
        if targets is None:
            return logits
        return F.cross_entropy(
            logits.view(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1, reduction=loss_reduction
        )

    def _smear(self, x: torch.Tensor, cache: KVCache | None) -> torch.Tensor:
        """Each position takes in a gated share of the previous token's embedding (the first token
        of a decode step takes the cached one)."""
        gate = lambda part: self.smear_lambda * torch.sigmoid(self.smear_gate(part[..., :SMEAR_GATE_CHANNELS]))  # noqa: E731
        previous = cache.last_embedding if cache is not None else None
        if cache is not None:
            cache.last_embedding = x[:, -1:]
        smeared = x[:, 1:] + gate(x[:, 1:]) * x[:, :-1]
        first = x[:, :1] if previous is None else x[:, :1] + gate(x[:, :1]) * previous
        return torch.cat([first, smeared], dim=1)

    @torch.no_grad()
    def generate(
        self,
        prompt: list[int],
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> list[int]:
        """Sample continuation tokens. While the context (config.sequence_len) has room, with a KV
        cache: one pass over the prompt, then one token at a time. Past it, a sliding window: each
        token is read from the last sequence_len tokens in a full pass, at the positions the model
        was trained on (a longer prompt is read from its end). temperature 0 is greedy."""
        device = self.wte.weight.device
        context = self.config.sequence_len
        cache = KVCache(self.config.n_layer)
        tokens = list(prompt)
        ids = torch.tensor([tokens[-context:]], dtype=torch.long, device=device)
        out: list[int] = []
        for _ in range(max_new_tokens):
            if len(tokens) > context:  # the cache would pass the context: start over at position 0
                ids, cache = torch.tensor([tokens[-context:]], dtype=torch.long, device=device), None
            logits = self(ids, cache=cache)[:, -1, :]
            if temperature == 0:
                nxt = logits.argmax(dim=-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, float("-inf"))
                nxt = torch.multinomial(F.softmax(logits, dim=-1), 1, generator=generator)
            out.append(int(nxt))
            tokens.append(int(nxt))
            ids = nxt
        return out
