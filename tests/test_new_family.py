"""A model family is one folder of the template: a LLaMA-style causal LM (RMSNorm with gains, rotary
attention, SwiGLU, untied head) added as template/src/<package>/models/llama/ (its descriptor, its
model, its README section and its own tests) to a copy of this template, with no edit anywhere else,
is offered by copier as an answer, rendered into train.yaml and the README from its descriptor, then
checked, planned, trained with 2 processes under DDP and under DeepSpeed ZeRO-2, evaluated, sampled,
exported to transformers' LlamaForCausalLM with equal logits, and its project's own suite passes (the
package-shape and README tests and the family's own tests).

    .venv/bin/python -m pytest -q tests/test_new_family.py      # about 4 minutes on 2 cores
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import yaml
from conftest import BIN, copy_demo_corpus, copy_template, run, run_project_suite, slug_of

DESCRIPTOR = '''"""A LLaMA-style causal LM as the rest of the project sees it (no torch here)."""

from __future__ import annotations

from dataclasses import dataclass

from ..family import Family


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
    summary="LLaMA-style causal LM (RMSNorm, rotary, SwiGLU)",
    builder="model:build",
    exporter="model:to_transformers",
    sizes={"tiny": {"n_layer": 2, "n_embd": 64, "n_head": 4}, "small": {"n_layer": 12, "n_embd": 768, "n_head": 12}},
    rotary=True,
    title="LLaMA-style LM",
    default_size="tiny",
    default_strategy="ddp",
    recipe_defaults={"global_batch": 64, "micro_batch": 8, "lr": 1e-3, "sequence_len": 256},
)
'''

MODEL = '''"""A LLaMA-style causal LM: pre-norm RMSNorm with gains, rotary attention, SwiGLU MLP, untied head."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .descriptor import FAMILY, ffn_width

EPS = 1e-5
THETA = 10000.0


def rotate(x, cos, sin):
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class Block(nn.Module):
    def __init__(self, h, heads):
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = nn.RMSNorm(h, eps=EPS), nn.RMSNorm(h, eps=EPS)
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
        self.norm, self.head = nn.RMSNorm(h, eps=EPS), nn.Linear(h, vocab_size, bias=False)
        half = h // shape["n_head"] // 2
        angles = torch.outer(torch.arange(sequence_len).float(), THETA ** (-torch.arange(half).float() / half))
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


def to_transformers(model):
    """transformers' LlamaForCausalLM with these weights (qkv split into q, k and v)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    h, heads = model.shape["n_embd"], model.shape["n_head"]
    config = LlamaConfig(
        vocab_size=model.vocab_size, hidden_size=h, intermediate_size=ffn_width(h), num_hidden_layers=len(model.blocks),
        num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=model.sequence_len,
        rms_norm_eps=EPS, rope_theta=THETA, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
    )
    state = {"model.embed_tokens.weight": model.embed.weight, "model.norm.weight": model.norm.weight,
             "lm_head.weight": model.head.weight}
    for i, block in enumerate(model.blocks):
        ours, theirs = block, f"model.layers.{i}."
        q, k, v = ours.qkv.weight.chunk(3)
        state |= {theirs + "self_attn.q_proj.weight": q, theirs + "self_attn.k_proj.weight": k,
                  theirs + "self_attn.v_proj.weight": v, theirs + "self_attn.o_proj.weight": ours.proj.weight,
                  theirs + "mlp.gate_proj.weight": ours.gate.weight, theirs + "mlp.up_proj.weight": ours.up.weight,
                  theirs + "mlp.down_proj.weight": ours.down.weight,
                  theirs + "input_layernorm.weight": ours.attn_norm.weight,
                  theirs + "post_attention_layernorm.weight": ours.mlp_norm.weight}
    hf = LlamaForCausalLM(config)
    hf.load_state_dict({key: value.detach().clone() for key, value in state.items()}, strict=True)
    return hf.eval()
'''

README = """## The LLaMA-style family

`model.arch: llama` ({{ model_size }} here) is a pre-norm decoder with RMSNorm gains, rotary
attention and a SwiGLU MLP; `export` writes it as transformers' LlamaForCausalLM.

"""

FAMILY_TESTS = '''"""The llama family's own tests: its formulas equal its model."""

from __future__ import annotations


def test_parameter_count_is_the_descriptors(pkg, cfg_with):
    cfg = cfg_with("model.arch=llama", "model.size=tiny", "model.sequence_len=64")
    family = pkg.module("models.family").family("llama")
    model = family.build(cfg, 512)
    assert model.num_params() == family.num_params(family.shape("tiny"), 512, 64)
'''

LLAMA = ["model.arch=llama", "model.size=tiny", "model.sequence_len=64", "batch.global_batch_size=16",
         "batch.micro_batch_size=4", "batch.grad_accum_steps=null", "schedule.max_steps=10", "schedule.warmup_steps=2",
         "checkpoint.every_steps=10", "logging.every_steps=2", "logging.eval_every_steps=0", "optim.lr=0.003",
         "cluster.nodes=1", "cluster.gpus_per_node=2", "run.device=cpu"]  # fmt: skip


def copy_with_llama(copy: Path, descriptor: str = DESCRIPTOR) -> Path:
    """A copy of this template at `copy` with a llama folder holding `descriptor`; the folder."""
    copy_template(copy)
    folder = copy / "template" / "src" / "{{project_slug}}" / "models" / "llama"
    (folder / "tests").mkdir(parents=True)
    (folder / "__init__.py").write_text('"""The LLaMA-style family."""\n')
    (folder / "descriptor.py").write_text(descriptor)
    return folder


@pytest.fixture(scope="module")
def template_with_llama(tmp_path_factory) -> Path:
    """A copy of this template with the llama family's one folder added, and nothing else changed."""
    copy = tmp_path_factory.mktemp("template-with-llama")
    folder = copy_with_llama(copy)
    (folder / "model.py").write_text(MODEL)
    (folder / "README.md.jinja").write_text(README)
    (folder / "tests" / "test_llama.py").write_text(FAMILY_TESTS)
    return copy


@pytest.fixture(scope="module")
def llama_project(template_with_llama, tmp_path_factory, demo_corpus) -> Path:
    root = tmp_path_factory.mktemp("llama")
    data = copy_demo_corpus(demo_corpus, root / "data")
    # strategy=deepspeed: the project holds DeepSpeed's folder too (the tests train under DDP and ZeRO-2)
    answers = {"project_name": "Llama Run", "model": "llama", "strategy": "deepspeed"}
    answers |= {"data_dir": data, "output_dir": root / "runs"}
    cmd = [str(BIN / "copier"), "copy", "--trust", "--defaults"]
    for key, value in answers.items():
        cmd += ["--data", f"{key}={value}"]
    done = run([*cmd, str(template_with_llama), str(root / "project")])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return root / "project"


@pytest.mark.parametrize(
    "broken, words",
    [
        ("a syntax error", ["line 28: SyntaxError: '(' was never closed"]),
        ("a field of another type", ["FAMILY.rotary='yes' is not true or false"]),
    ],
)
def test_copier_refuses_a_fork_whose_family_folder_cannot_be_loaded_in_one_line(tmp_path, broken, words):
    """A family folder of the template broken as a user's edit breaks it: copier stops in one line
    naming the descriptor and what is wrong in it (it was a hundred-line traceback through the copier
    extension), and writes nothing."""
    if broken == "a syntax error":
        descriptor = DESCRIPTOR.rstrip().removesuffix(")")
    else:
        descriptor = DESCRIPTOR.replace("rotary=True", 'rotary="yes"')
    folder = copy_with_llama(tmp_path / "fork", descriptor)
    answers = ["--data", "project_name=Fork Run", "--data", f"data_dir={tmp_path / 'data'}"]
    answers += ["--data", f"output_dir={tmp_path / 'runs'}"]
    copier = [str(BIN / "copier"), "copy", "--trust", "--defaults", *answers]
    done = run([*copier, str(tmp_path / "fork"), str(tmp_path / "project")])
    output = done.stdout + done.stderr
    lines = [line for line in output.splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1, output[-3000:]
    assert lines[0].startswith(f"{folder / 'descriptor.py'} cannot be loaded: "), lines[0]
    assert all(word in lines[0] for word in words), lines[0]
    assert not (tmp_path / "project").exists()


# The exported folder's logits against the trained model's, as the project loads it for eval.
SAME_LOGITS = """
import sys, torch
from transformers import AutoModelForCausalLM
from {package}.evaluation.trained_model import load_trained_model
from {package}.settings.config import load_config
cfg = load_config(None, sys.argv[2:])
ours = load_trained_model(cfg, None, torch.device("cpu"))[0].float().eval()
theirs = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
ids = torch.randint(0, ours.vocab_size, (2, 32), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    print("max difference", (ours(ids) - theirs(ids).logits).abs().max().item())
"""


def project_command(project: Path, *args: str, expect: int = 0, timeout: int = 600) -> str:
    """`python -m <package> ARGS` in the project, or `python -c SCRIPT ARGS` for args[0] == "-c"."""
    entry = ["-c", args[1].format(package=slug_of(project))] if args[0] == "-c" else ["-m", slug_of(project), args[0]]
    done = run(
        [sys.executable, *entry, *args[2 if args[0] == "-c" else 1 :]],
        cwd=project,
        env={"PYTHONPATH": str(project / "src"), "OMP_NUM_THREADS": "1"},
        timeout=timeout,
    )
    output = done.stdout + done.stderr
    assert done.returncode == expect, f"{' '.join(args[:2])}: exit {done.returncode}\n{output[-4000:]}"
    return output


def test_copier_offers_the_family_and_renders_it_from_its_descriptor(template_with_llama, llama_project):
    spec = yaml.safe_load((template_with_llama / "copier.yml").read_text())
    assert "llama" not in json.dumps(spec)  # copier.yml was not edited: the menu comes from the descriptors
    train = yaml.safe_load((llama_project / "config" / "train.yaml").read_text())
    assert train["model"]["arch"] == "llama" and train["model"]["size"] == "tiny"
    assert train["optim"]["lr"] == 1e-3  # the descriptor's recipe
    assert (
        train["run"]["strategy"] == "deepspeed"
        and (llama_project / "src" / slug_of(llama_project) / "strategies" / "deepspeed").is_dir()
    )
    assert "parallel" not in train  # no pipeline layers: no layout to choose
    readme = (llama_project / "README.md").read_text()
    assert readme.splitlines()[2].startswith("A LLaMA-style LM trained with DeepSpeed")
    assert "## The LLaMA-style family" in readme and "(tiny here)" in readme
    menu = run([str(BIN / "copier"), "copy", "--trust", "--defaults", "--data", "model=mamba",
                str(template_with_llama), str(llama_project.parent / "refused")])  # fmt: skip
    assert menu.returncode != 0 and "llama" in menu.stdout + menu.stderr


def test_the_family_checks_plans_trains_evaluates_samples_and_exports(llama_project, tmp_path):
    project_command(llama_project, "check", *LLAMA)
    plan = project_command(llama_project, "plan", *LLAMA, "model.size=small", "cluster.gpu_type=h100-80gb")
    assert "model llama small" in plan
    refused = project_command(llama_project, "check", *LLAMA, "model.size=huge", expect=1)
    assert "model.size='huge' is not a llama size; use one of tiny, small" in refused
    for name, strategy in (
        ("ddp", ["run.strategy=ddp"]),
        ("zero2", ["run.strategy=deepspeed", "deepspeed.zero_stage=2"]),
    ):
        out = tmp_path / name
        args = [*LLAMA, *strategy, f"run.output_dir={out}"]
        project_command(llama_project, "launch", "devmachine", "--nproc-per-node", "2", *args, timeout=900)
        losses = [r["loss"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
        assert len(losses) >= 2 and losses[-1] < losses[0], losses  # it learns
        assert "bpb" in project_command(llama_project, "eval", *args)
        sampled = project_command(llama_project, "sample", *args, "--prompt", "The", "--max-new-tokens", "4",
                                  "--temperature", "0")  # fmt: skip
        assert "The" in sampled
    export = project_command(llama_project, "export", str(tmp_path / "export"), *args)
    assert "as LlamaForCausalLM" in export
    compared = project_command(llama_project, "-c", SAME_LOGITS, str(tmp_path / "export"), *args)
    assert float(re.search(r"max difference (\S+)", compared)[1]) < 1e-4, compared


def test_the_project_suite_passes_with_the_family(llama_project):
    """The package's shape and README list, and the family's own tests (collected in a llama project)."""
    log = run_project_suite(llama_project, "tests/test_package_shape.py", "src", name="llama-project")
    assert "test_llama.py::test_parameter_count_is_the_descriptors PASSED" in log
    assert "test_readme_lists_every_module PASSED" in log
