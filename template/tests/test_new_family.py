"""A model family is one new file: a LLaMA-style causal LM (RMSNorm with gains, rotary attention,
SwiGLU, untied head) dropped into models/ of a copy of this project is checked, planned, trained
with 2 processes under DDP and under DeepSpeed ZeRO-2, evaluated and sampled, with no edit
anywhere else.

    python -m pytest -q tests/test_new_family.py
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PACKAGE, ROOT, TRAIN_OVERRIDES, subprocess_env

NEW_FAMILY = '''"""A LLaMA-style causal LM: pre-norm RMSNorm with gains, rotary attention, SwiGLU MLP, untied head."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .family import Family


def ffn_width(h: int) -> int:
    return (8 * h // 3 + 15) // 16 * 16  # SwiGLU's two thirds of 4h, rounded to 16


@dataclass(frozen=True)
class LlamaFamily(Family):
    def num_params(self, shape, vocab_size, sequence_len):
        h, L, f = shape["n_embd"], shape["n_layer"], ffn_width(shape["n_embd"])
        return 2 * vocab_size * h + L * (4 * h * h + 3 * h * f + 2 * h) + h

    def flops_per_token(self, shape, vocab_size, sequence_len):
        matmul = self.num_params(shape, vocab_size, sequence_len) - vocab_size * shape["n_embd"]
        return 6 * matmul + 12 * shape["n_layer"] * shape["n_embd"] * sequence_len

    def layer_activations(self, shape, seq, micro, tp, mode, scores_stored):
        return 40 * seq * micro * shape["n_embd"]  # an estimate: norms, q/k/v, attention out, SwiGLU's three


FAMILY = LlamaFamily(
    name="llama",
    summary="LLaMA-style causal LM",
    builder="llama:build",
    sizes={"tiny": {"n_layer": 2, "n_embd": 64, "n_head": 4}, "small": {"n_layer": 12, "n_embd": 768, "n_head": 12}},
    rotary=True,
)


def rotate(x, cos, sin):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = nn.RMSNorm(h), nn.RMSNorm(h)
        self.qkv, self.proj = nn.Linear(h, 3 * h, bias=False), nn.Linear(h, h, bias=False)
        f = ffn_width(h)
        self.gate, self.up, self.down = nn.Linear(h, f, bias=False), nn.Linear(h, f, bias=False), nn.Linear(f, h, bias=False)

    def forward(self, x, cos, sin):
        B, T, C = x.shape
        q, k, v = self.qkv(self.attn_norm(x)).view(B, T, 3, self.heads, C // self.heads).transpose(1, 3).unbind(2)
        y = F.scaled_dot_product_attention(rotate(q, cos, sin), rotate(k, cos, sin), v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        h = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


class Llama(nn.Module):
    def __init__(self, shape, vocab_size, sequence_len):
        super().__init__()
        h, self.shape, self.vocab_size, self.sequence_len = shape["n_embd"], shape, vocab_size, sequence_len
        self.embed = nn.Embedding(vocab_size, h)
        self.blocks = nn.ModuleList(Block(h, shape["n_head"]) for _ in range(shape["n_layer"]))
        self.norm, self.head = nn.RMSNorm(h), nn.Linear(h, vocab_size, bias=False)
        half = h // shape["n_head"] // 2
        angles = torch.outer(torch.arange(sequence_len).float(), 10000.0 ** (-torch.arange(half).float() / half))
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())

    def flops_per_token(self):
        return FAMILY.flops_per_token(self.shape, self.vocab_size, self.sequence_len)

    def forward(self, idx, targets=None, loss_reduction="mean"):
        T = idx.size(1)
        x = self.embed(idx)
        for block in self.blocks:
            x = block(x, self.cos[:T], self.sin[:T])
        logits = self.head(self.norm(x)).float()
        if targets is None:
            return logits
        return F.cross_entropy(logits.flatten(0, 1), targets.reshape(-1), ignore_index=-1, reduction=loss_reduction)

    @torch.no_grad()
    def generate(self, prompt, max_new_tokens, temperature=1.0, top_k=None, generator=None):
        ids, out = torch.tensor([prompt], device=self.cos.device), []
        for _ in range(max_new_tokens):
            logits = self(ids[:, -self.sequence_len :])[:, -1]
            if temperature == 0:
                nxt = logits.argmax(-1, keepdim=True)
            else:
                logits = logits / temperature
                if top_k:
                    logits[logits < torch.topk(logits, min(top_k, logits.size(-1))).values[:, -1:]] = -float("inf")
                nxt = torch.multinomial(F.softmax(logits, -1), 1, generator=generator)
            out.append(int(nxt))
            ids = torch.cat([ids, nxt], dim=1)
        return out


def build(cfg, vocab_size, load_weights=True):
    return Llama(FAMILY.shape(cfg.model.size), vocab_size, cfg.model.sequence_len)
'''


@pytest.fixture(scope="module")
def project_with_llama(tmp_path_factory) -> Path:
    """This project's source and config copied, plus the new family's one file."""
    copy = tmp_path_factory.mktemp("with_llama")
    shutil.copytree(ROOT / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    shutil.copytree(ROOT / "config", copy / "config")
    (copy / "src" / PACKAGE / "models" / "llama.py").write_text(NEW_FAMILY)
    return copy


def run(project: Path, *args: str, expect: int = 0, timeout: float = 300) -> str:
    env = subprocess_env({"PYTHONPATH": str(project / "src")})
    done = subprocess.run(
        [sys.executable, "-m", PACKAGE, *args], cwd=project, env=env, capture_output=True, text=True, timeout=timeout
    )
    output = done.stdout + done.stderr
    assert done.returncode == expect, f"{' '.join(args[:2])}: exit {done.returncode}\n{output[-4000:]}"
    return output


LLAMA = [
    *TRAIN_OVERRIDES,
    "model.arch=llama",
    "schedule.max_steps=10",
    "checkpoint.every_steps=10",
    "cluster.nodes=1",
    "cluster.gpus_per_node=2",
]


def test_a_new_family_is_checked_and_planned(project_with_llama):
    run(project_with_llama, "check", *LLAMA)
    plan = run(project_with_llama, "plan", *LLAMA, "model.size=small", "cluster.gpu_type=h100-80gb")
    assert "model llama small" in plan
    refused = run(project_with_llama, "check", *LLAMA, "model.size=huge", expect=1)
    assert "model.size='huge' is not a llama size; use one of tiny, small" in refused
    unknown = run(project_with_llama, "check", *LLAMA, "model.arch=mamba", expect=1)
    assert "model.arch='mamba' is not a model family" in unknown and "llama" in unknown


@pytest.mark.parametrize("strategy", [["run.strategy=ddp"], ["run.strategy=deepspeed", "deepspeed.zero_stage=2"]])
def test_a_new_family_trains_evaluates_and_samples(project_with_llama, demo_data, tmp_path, strategy):
    out = tmp_path / "runs"
    args = [*LLAMA, *strategy, f"data.dir={demo_data}", f"run.output_dir={out}"]
    run(project_with_llama, "launch", "devmachine", "--nproc-per-node", "2", *args, timeout=600)
    losses = [r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert len(losses) >= 2 and losses[-1] < losses[0], losses  # it learns
    evaluated = run(project_with_llama, "eval", *args)
    assert "bits per byte" in evaluated or "bpb" in evaluated, evaluated
    sampled = run(project_with_llama, "sample", *args, "--prompt", "The", "--max-new-tokens", "8", "--temperature", "0")
    assert "The" in sampled
