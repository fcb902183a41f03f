"""What a GPU needs from the models, held on the CPU: each family's forward + loss is one graph for
torch.compile with dropout on (a graph break would split the kernels and often wait for the GPU);
keyed dropout is one op per site forward and one backward, like torch's; its compiled (fused) form
draws the same masks, bit for bit, as the eager one the CPU runs.

    python -m pytest -q tests/test_compile.py      # ~40 s on two cores: one small Inductor compile
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

B, T, VOCAB = 2, 16, 64


def _keys(pkg, count=B):
    dropout = pkg.module("models.sample_dropout")
    return dropout, dropout.sample_keys(1337, 3, 100, count)


def _gpt(pkg, attention_dropout):
    gpt = pkg.module("models.gpt.model")
    model = gpt.GPT(
        gpt.GPTConfig(vocab_size=VOCAB, sequence_len=T, n_layer=2, n_embd=32, n_head=2, n_kv_head=2, dropout=0.1)
    )
    model.init_weights()
    return model


def _gpt_pieces(pkg, attention_dropout):
    """The GPT with every piece of nanochat's on, a sliding window on its first layer included."""
    gpt = pkg.module("models.gpt.model")
    pieces = {"value_embeddings": True, "residual_scalars": True, "smear": True, "backout": True, "qk_scale": 1.2}
    shape = {"n_layer": 3, "n_embd": 32, "n_head": 2, "n_kv_head": 2}
    config = gpt.GPTConfig(vocab_size=VOCAB, sequence_len=T, dropout=0.1, **shape, **pieces, window_pattern="SL")
    model = gpt.GPT(config)
    model.init_weights()
    return model


def _gpt3(pkg, attention_dropout):
    gpt3 = pkg.module("models.gpt3.model")
    config = gpt3.GPT3Config(
        vocab_size=VOCAB,
        sequence_len=T,
        n_layer=2,
        n_embd=32,
        n_head=4,
        dropout=0.1,
        attention_dropout=attention_dropout,
    )
    return gpt3.GPT3(config)


# Families whose models need no extra package; bert's case is in its family's tests (models/bert/tests/).
FAMILIES = {"gpt": _gpt, "gpt+pieces": _gpt_pieces, "gpt3": _gpt3}


def _inputs(pkg, family):
    ids = torch.randint(0, VOCAB, (B, T), generator=torch.Generator().manual_seed(0))
    return ids, torch.roll(ids, -1, dims=1)


# (family, attention dropout): 0 keeps SDPA's fused kernel, 0.1 materialises the keyed probabilities;
# the gpt has no attention dropout.
CASES = [
    pytest.param(family, p, id=f"{family}-attention{p}", marks=[pytest.mark.part(family)] if family == "gpt3" else [])
    for family in sorted(FAMILIES)
    for p in ((0.0,) if family in ("gpt", "gpt+pieces") else (0.0, 0.1))
]


def test_a_sliding_window_compiled_for_a_gpu_is_the_masked_attention(pkg):
    """model.window_pattern's S layers, compiled on a GPU, run flex attention, whose block mask skips
    what the window hides; compiled here (forward only: flex attention has no CPU backward) it is one
    graph and gives the output of SDPA with the window's mask, over several of its blocks, with
    grouped-query heads."""
    gpt = pkg.module("models.gpt.model")
    batch, heads, kv_heads, length, dim, window = 2, 4, 2, 384, 16, 96
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(batch, heads, length, dim, generator=gen)
    k, v = (torch.randn(batch, kv_heads, length, dim, generator=gen) for _ in range(2))
    assert torch._dynamo.explain(gpt.windowed_flex_attention)(q, k, v, window, True).graph_break_count == 0
    flex = torch.compile(gpt.windowed_flex_attention)(q, k, v, window, True)
    query, key = torch.arange(length)[:, None], torch.arange(length)[None, :]
    allowed = (key <= query) & (query - key <= window)
    masked = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, enable_gqa=True)
    assert torch.allclose(flex, masked, atol=1e-5)
    assert not torch.allclose(flex, F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True))


@pytest.mark.parametrize("family, attention_dropout", CASES)
def test_forward_and_loss_are_one_graph_with_dropout_on(pkg, family, attention_dropout):
    torch.manual_seed(0)
    assert_one_graph(pkg, FAMILIES[family](pkg, attention_dropout).train(), _inputs(pkg, family))


def assert_one_graph(pkg, model, inputs) -> None:
    """The model's forward and loss, dropout on (keyed by sample), compile to one graph, no break."""
    dropout, keys = _keys(pkg)

    def loss(ids, targets):
        with dropout.samples(keys):
            return model(ids, targets)

    explained = torch._dynamo.explain(loss)(*inputs)
    assert explained.graph_break_count == 0, [str(b.reason) for b in explained.break_reasons]
    assert explained.graph_count == 1
    torch._dynamo.reset()


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_keyed_dropout_is_one_op_forward_and_one_backward(pkg):
    """torch's dropout is one kernel each way on a GPU (native_dropout, its backward); ours is one op
    each way, whose CUDA implementation is the compiled, fused hash."""
    dropout, keys = _keys(pkg)
    x = torch.randn(B, T, 32, requires_grad=True)
    grad = torch.ones(B, T, 32)
    with dropout.samples(keys), _Ops() as ops:
        dropout.keyed_dropout(x, 0.1, 3, True).backward(grad)
    kernels = [name for name in ops.names if name != "detach.default"]  # detach: x.grad's accumulation, no kernel
    assert kernels == ["keyed_dropout.default", "keyed_dropout.default"], ops.names


@pytest.mark.parametrize(
    "shape, split", [((B, T, 48), None), ((B, 4, T, T), (1, 4, 8)), ((B, T, 12), (2, 12, 36))], ids=str
)
def test_the_fused_kernel_draws_the_eager_masks(pkg, shape, split):
    """Inductor's kernel (C++ here, Triton on a GPU, from the same graph) against the eager
    expression: the same masks, so a compiled and an eager run, or a GPU and a CPU, agree."""
    dropout, keys = _keys(pkg)
    x = torch.randn(shape)
    draw = (dropout._layer_key(5), int(0.3 * 2**32), 1 / 0.7, split)
    eager = dropout._dropped(x, keys, *draw)
    assert torch.equal(dropout._fused()(x, keys, *draw), eager)
    assert 0.2 < (eager == 0).float().mean() < 0.4


def test_compiled_dropout_inside_a_model_matches_eager(pkg):
    """Traced into a compiled model the expression replaces the op: same outputs and gradients."""
    dropout, keys = _keys(pkg)
    layer = torch.nn.Linear(32, 32)
    x = torch.randn(B, T, 32)

    def forward(x):
        with dropout.samples(keys):
            return dropout.keyed_dropout(F.gelu(layer(x)), 0.2, 7, True)

    eager = forward(x)
    compiled = torch.compile(forward, backend="aot_eager", fullgraph=True)(x)
    assert torch.equal(eager, compiled)
    torch._dynamo.reset()


@pytest.mark.part("gpt3", "deepspeed")
def test_a_pipeline_stage_compiled_layer_by_layer_is_one_graph(pkg, caplog):
    """DeepSpeed's PipelineModule.compile() compiles each layer of a stage on its own. Blocks differ
    only in their dropout keys, held as data: twelve layers share one graph (a key as a Python int
    was a recompile per layer, eager past torch's limit of 8 with only a log line); their output and
    gradients equal eager's within fp32 noise (Inductor on the CPU)."""
    from torch._dynamo.utils import counters

    gpt3, (dropout, keys) = pkg.module("models.gpt3.model"), _keys(pkg)
    config = gpt3.GPT3Config(vocab_size=VOCAB, sequence_len=T, n_layer=12, n_embd=32, n_head=4, dropout=0.1)
    torch.manual_seed(0)
    stage = [gpt3.Block(config, index) for index in range(12)]
    x = torch.randn(B, T, 32, requires_grad=True)  # a later stage's input: activations that carry gradients

    def run():
        for layer in stage:
            layer.zero_grad(set_to_none=True)
        y = x
        with dropout.samples(keys):
            for layer in stage:
                y = layer(y)
            y.square().mean().backward()
        return y.detach(), [p.grad.clone() for layer in stage for p in layer.parameters()]

    eager, eager_grads = run()
    torch._dynamo.reset()
    counters.clear()
    for layer in stage:
        layer.compile()
    with caplog.at_level("WARNING", logger="torch._dynamo"):
        compiled, compiled_grads = run()
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not [r.message for r in caplog.records if "recompile" in r.getMessage()]
    torch.testing.assert_close(compiled, eager, rtol=1e-5, atol=1e-6)
    for got, want in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    torch._dynamo.reset()


def test_every_strategy_compiles_on_cuda_and_says_why_not_elsewhere(pkg, cfg_with):
    compiled = pkg.module("strategies.common").compiled
    assert compiled(cfg_with().run, torch.device("cuda", 0)) == (True, "compiled")  # the default: run.compile=true
    assert compiled(cfg_with("run.compile=false").run, torch.device("cuda", 0)) == (False, "eager (run.compile=false)")
    on_cpu, note = compiled(cfg_with().run, torch.device("cpu"))
    assert not on_cpu and note == "eager on cpu (run.compile applies on CUDA)"


@pytest.mark.part("deepspeed")
def test_zero3_stays_eager_on_cuda(pkg, cfg_with):
    """ZeRO-3's partitioned weights are empty outside its gather hooks: tracing them fails on a GPU."""
    zero_compiled = pkg.module("strategies.deepspeed.engine").zero_compiled
    cuda = torch.device("cuda", 0)
    for stage in (1, 2):
        assert zero_compiled(cfg_with("run.strategy=deepspeed", f"deepspeed.zero_stage={stage}"), cuda)[0]
    on, note = zero_compiled(cfg_with("run.strategy=deepspeed", "deepspeed.zero_stage=3"), cuda)
    assert not on and "ZeRO-3" in note
    assert zero_compiled(cfg_with("run.strategy=deepspeed", "deepspeed.zero_stage=3", "run.compile=false"), cuda) == (
        False,
        "eager (run.compile=false)",
    )
