"""GPT-3 family (Brown et al. 2020) as a list of layers that can be pipelined.

GPT-2/3 block: pre-LayerNorm with bias, causal self-attention, GELU MLP of 4x width, biases on
every linear, learned position embeddings, the input embedding tied to the output head. Dense
attention everywhere (the paper alternates dense and locally banded layers; no open reproduction
keeps the banded ones).

The model is a sequence of layers: Embedding, n_layer x Block, FinalNorm, Head (the embedding's
weight again). Two ways to run it:
- strategies/deepspeed/pipeline.py hands the same layers to DeepSpeed's PipelineModule (pipeline and
  tensor parallel; strategies/deepspeed/tensor_parallel.py shards each Block after it is built);
- GPT3 (below) runs them in one process (DDP, ZeRO 0-3, eval, sample).
Both seed layer i with run.seed + i before building it, so every layout starts from the same
weights and losses can be compared across layouts. Like models/gpt/model.py, this file knows nothing
of distribution.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
import torch.utils.checkpoint

from ..family import PipelineLayers, StageLayer
from ..lm_loss import chunked, linear_cross_entropy
from ..sample_dropout import keyed_dropout, samples
from .descriptor import FAMILY


@dataclass
class GPT3Config:
    vocab_size: int
    sequence_len: int
    n_layer: int
    n_embd: int
    n_head: int
    seed: int = 1337
    dropout: float = 0.0
    """Megatron's hidden dropout (embedding, attention output, MLP output), masks keyed per sample
    (sample_dropout.py)."""
    attention_dropout: float = 0.0
    """Megatron's dropout of the attention probabilities; 0 keeps attention on SDPA's fused kernel."""


def init_linear(linear: nn.Linear, std: float) -> nn.Linear:
    nn.init.normal_(linear.weight, mean=0.0, std=std)
    nn.init.zeros_(linear.bias)
    return linear


class Embedding(nn.Module):
    """Token + position embedding. On the last pipeline stage the same class (tied) computes logits."""

    def __init__(self, cfg: GPT3Config):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.wpe = nn.Embedding(cfg.sequence_len, cfg.n_embd)
        nn.init.normal_(self.wte.weight, std=0.02)
        nn.init.normal_(self.wpe.weight, std=0.01)
        self.dropout = cfg.dropout

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.size(1), device=idx.device)
        return keyed_dropout(self.wte(idx) + self.wpe(positions), self.dropout, 0, self.training)


def head_logits(embedding: Embedding, x: torch.Tensor) -> torch.Tensor:
    """The output head: hidden states times the (tied) token embedding, in fp32 for the loss."""
    return F.linear(x, embedding.wte.weight).float()


class Block(nn.Module):
    """Block `index` (0-based) of the model. head_offset: the first of the n_head heads this
    block's qkv computes (0; a tensor-parallel shard sets its own), which keys attention dropout."""

    def __init__(self, cfg: GPT3Config, index: int = 0):
        super().__init__()
        h = cfg.n_embd
        self.head_dim, self.n_head, self.head_offset = h // cfg.n_head, cfg.n_head, 0
        self.dropout, self.attention_dropout = cfg.dropout, cfg.attention_dropout
        # Dropout keys 3i+1..3i+3 (0 is the embedding), held as data: a layer compiled on its own (the
        # pipeline's stages) then shares one graph with its siblings instead of one per key value.
        self.register_buffer("keys", torch.tensor(3 * index + 1), persistent=False)
        residual_std = 0.02 / math.sqrt(2 * cfg.n_layer)  # GPT-2: scale the residual projections
        self.ln1 = nn.LayerNorm(h)
        self.qkv = init_linear(nn.Linear(h, 3 * h), 0.02)
        self.proj = init_linear(nn.Linear(h, h), residual_std)
        self.ln2 = nn.LayerNorm(h)
        self.fc = init_linear(nn.Linear(h, 4 * h), 0.02)
        self.fc2 = init_linear(nn.Linear(4 * h, h), residual_std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # qkv's output rows are grouped per head ([q k v] of head 0, then head 1, ...), so a split
        # by contiguous rows keeps whole heads; the head count is what qkv returns (all heads in
        # one process, its share on a tensor-parallel rank).
        q, k, v = self.qkv(self.ln1(x)).view(B, T, -1, 3, self.head_dim).transpose(1, 2).unbind(3)
        y = self.attention(q, k, v)
        x = x + keyed_dropout(
            self.proj(y.transpose(1, 2).reshape(B, T, -1)), self.dropout, self.keys + 1, self.training
        )
        y = self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
        return x + keyed_dropout(y, self.dropout, self.keys + 2, self.training)

    def attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Causal attention over (B, heads, T, head_dim). With attention dropout the probabilities
        are materialised (as Megatron does) so their masks can be keyed; SDPA would draw its own."""
        if not (self.training and self.attention_dropout):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        T = q.size(2)
        scores = (q @ k.transpose(-2, -1)) * self.head_dim**-0.5
        future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        probs = F.softmax(scores.masked_fill(future, float("-inf")).float(), dim=-1).to(q.dtype)
        split = (1, self.head_offset, self.n_head)  # heads split over tensor ranks: each draws its own
        return keyed_dropout(probs, self.attention_dropout, self.keys, True, split) @ v


class FinalNorm(nn.LayerNorm):
    pass


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
    return F.cross_entropy(
        logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-1, reduction=reduction
    )


def seeded(seed: int, build):
    """Build a layer under a fixed seed (what PipelineModule(seed_layers=True) does per layer)."""
    torch.manual_seed(seed)
    return build()


class GPT3(nn.Module):
    """The layers in one process: forward(idx, targets) -> loss, like models.gpt.model.GPT."""

    def __init__(self, cfg: GPT3Config, checkpointing: bool = False):
        super().__init__()
        self.cfg, self.checkpointing = cfg, checkpointing
        self.embed = seeded(cfg.seed, lambda: Embedding(cfg))
        self.blocks = nn.ModuleList(seeded(cfg.seed + 1 + i, lambda i=i: Block(cfg, i)) for i in range(cfg.n_layer))
        self.norm = seeded(cfg.seed + 1 + cfg.n_layer, lambda: FinalNorm(cfg.n_embd))

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self) -> int:
        """6 x weights that multiply (all but the embeddings, head included) + attention scores."""
        c = self.cfg
        shape = {"n_layer": c.n_layer, "n_embd": c.n_embd, "n_head": c.n_head, "n_kv_head": c.n_head}
        return FAMILY.flops_per_token(shape, c.vocab_size, c.sequence_len)

    def hidden(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.embed(idx)
        for block in self.blocks:
            if self.checkpointing and self.training:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.norm(x)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None, loss_reduction: str = "mean"):
        x = self.hidden(idx)
        head = self.embed.wte.weight
        if targets is not None and chunked(loss_reduction, x, head):
            # Training's loss without the whole logits (lm_loss.py); the pipeline's last stage (strategies/
            # pipeline.py) still computes them: DeepSpeed hands its loss_fn the head layer's output.
            return linear_cross_entropy(x, head, targets, self.cfg.vocab_size, 0.0, loss_reduction)
        logits = head_logits(self.embed, x)
        if targets is None:
            return logits
        return lm_loss(logits, targets, loss_reduction)

    @torch.no_grad()
    def generate(
        self,
        prompt: list[int],
        max_new_tokens: int,
        temperature: float = 1.0,
        top_k: int | None = None,
        generator: torch.Generator | None = None,
    ) -> list[int]:
        """Continuation tokens, one full pass per token (no KV cache: sampling from a GPT-3
        checkpoint is a check of the weights, not a service). temperature 0 is greedy."""
        ids = torch.tensor([prompt], dtype=torch.long, device=self.embed.wte.weight.device)
        out: list[int] = []
        for _ in range(max_new_tokens):
            logits = self(ids[:, -self.cfg.sequence_len :])[:, -1, :]
            if temperature == 0:
                nxt = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k:
                    kth = torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]
                    logits = logits.masked_fill(logits < kth, -float("inf"))
                nxt = torch.multinomial(F.softmax(logits, -1), 1, generator=generator)
            out.append(int(nxt))
            ids = torch.cat([ids, nxt], dim=1)
        return out


def gpt3_config(cfg, vocab_size: int) -> GPT3Config:
    shape = FAMILY.shape(cfg.model.size)
    return GPT3Config(
        vocab_size=vocab_size,
        sequence_len=cfg.model.sequence_len,
        n_layer=shape["n_layer"],
        n_embd=shape["n_embd"],
        n_head=shape["n_head"],
        seed=cfg.run.seed,
        dropout=cfg.model.dropout or 0.0,
        attention_dropout=cfg.model.attention_dropout or 0.0,
    )


def build_gpt3(cfg, vocab_size: int, load_weights: bool = True) -> GPT3:
    return GPT3(gpt3_config(cfg, vocab_size), cfg.model.activation_checkpointing)


# The pipeline's stages pass (hidden states, dropout keys) along: a stage works on several micro
# batches in turn (1F1B), and each layer needs the keys of the samples in front of it
# (models/sample_dropout.py). The layers are GPT3's, with their weights and names; only forward's
# arguments differ.


class KeyedEmbedding(Embedding):
    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        idx, keys = inputs
        with samples(keys):
            return super().forward(idx), keys


class KeyedBlock(Block):
    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        x, keys = inputs
        with samples(keys):  # also when activation checkpointing recomputes the block in backward
            return super().forward(x), keys


class KeyedFinalNorm(FinalNorm):
    def forward(self, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return super().forward(inputs[0])


def pipeline_layers(cfg, vocab_size: int) -> PipelineLayers:
    """Embedding, blocks, final norm, tied head: GPT3's order (and seeds), as a pipeline's layers.
    Megatron's tensor split: qkv and fc by output features, proj and fc2 by input features."""
    c = gpt3_config(cfg, vocab_size)
    embedding = {"tied": "embed", "tied_weights": ("wte.weight",)}
    return PipelineLayers(
        layers=[
            StageLayer(KeyedEmbedding, (c,), prefix="embed.", **embedding),
            *[StageLayer(KeyedBlock, (c, i), prefix=f"blocks.{i}.", block=True) for i in range(c.n_layer)],
            StageLayer(KeyedFinalNorm, (c.n_embd,), prefix="norm."),
            StageLayer(KeyedEmbedding, (c,), forward=head_logits, **embedding),
        ],
        loss=lm_loss,
        whole=lambda: GPT3(c),
        column_parallel=("qkv", "fc"),
        row_parallel=("proj", "fc2"),
        block_norms=("ln1", "ln2"),
    )


def to_transformers(model: GPT3):
    """transformers' GPT2LMHeadModel with these weights: learned positions, pre-LayerNorm with bias,
    tanh-GELU, tied head. GPT-2's fused qkv is [all q | all k | all v] where ours groups [q k v] per
    head (so a tensor split keeps whole heads), and its Conv1D keeps weights as (in, out)."""
    from transformers import GPT2Config, GPT2LMHeadModel

    c = model.cfg
    config = GPT2Config(
        vocab_size=c.vocab_size,
        n_positions=c.sequence_len,
        n_embd=c.n_embd,
        n_layer=c.n_layer,
        n_head=c.n_head,
        activation_function="gelu_new",
        resid_pdrop=c.dropout,
        embd_pdrop=c.dropout,
        attn_pdrop=c.attention_dropout,
        layer_norm_epsilon=model.norm.eps,
        tie_word_embeddings=True,
    )
    state, h, heads = model.state_dict(), c.n_embd, c.n_head

    def per_part(t: torch.Tensor) -> torch.Tensor:  # rows (head, part, dim) -> (part, head, dim)
        return t.reshape(heads, 3, h // heads, *t.shape[1:]).transpose(0, 1).reshape(3 * h, *t.shape[1:])

    out = {
        "transformer.wte.weight": state["embed.wte.weight"],
        "transformer.wpe.weight": state["embed.wpe.weight"],
        "transformer.ln_f.weight": state["norm.weight"],
        "transformer.ln_f.bias": state["norm.bias"],
    }
    for i in range(c.n_layer):
        ours, theirs = f"blocks.{i}.", f"transformer.h.{i}."
        for a, b in (("ln1", "ln_1"), ("ln2", "ln_2")):
            out[f"{theirs}{b}.weight"], out[f"{theirs}{b}.bias"] = state[f"{ours}{a}.weight"], state[f"{ours}{a}.bias"]
        out[f"{theirs}attn.c_attn.weight"] = per_part(state[f"{ours}qkv.weight"]).t()
        out[f"{theirs}attn.c_attn.bias"] = per_part(state[f"{ours}qkv.bias"])
        for a, b in (("proj", "attn.c_proj"), ("fc", "mlp.c_fc"), ("fc2", "mlp.c_proj")):
            out[f"{theirs}{b}.weight"] = state[f"{ours}{a}.weight"].t()
            out[f"{theirs}{b}.bias"] = state[f"{ours}{a}.bias"]
    hf = GPT2LMHeadModel(config)
    missing, unexpected = hf.load_state_dict({k: v.contiguous() for k, v in out.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)  # the tied head
    hf.tie_weights()
    return hf.eval()
