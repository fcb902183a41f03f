"""The chunked language-model loss (models/lm_loss.py) against the whole logits: the same loss and
gradients (fp32 to rounding, bf16 autocast within bf16's), never an (N x vocab) tensor, and the GPTs'
training loss (gpt, gpt3) equal to the cross-entropy of the logits they return.

    python -m pytest -q tests/test_lm_loss.py      # a few seconds
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

N, WIDTH, VOCAB, ROWS = 37, 16, 50, 64  # 37 tokens, a head of 64 rows of which 50 are the vocabulary
CHUNK = 8  # tokens per chunk: five chunks, the last of 5


@pytest.fixture
def lm_loss(pkg):
    return pkg.module("models.lm_loss")


def _inputs(seed=0, n=N, width=WIDTH, rows=ROWS, vocab=VOCAB, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, width, generator=g, dtype=dtype)
    weight = torch.randn(rows, width, generator=g, dtype=dtype) * 0.5
    targets = torch.randint(0, vocab, (n,), generator=g)
    targets[::4] = -1  # ignored
    return hidden, weight, targets


def _plain(hidden, weight, targets, softcap, reduction, vocab=VOCAB):
    """The whole logits, as the models computed the loss before lm_loss.py."""
    logits = F.linear(hidden, weight)[:, :vocab].float()
    if softcap > 0:
        logits = softcap * torch.tanh(logits / softcap)
    return F.cross_entropy(logits, targets, ignore_index=-1, reduction=reduction)


def _loss_and_grads(loss_fn, hidden, weight, targets, *, scale=1.0, autocast=False):
    hidden, weight = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = loss_fn(hidden, weight, targets)
    (scale * loss).backward()
    return loss.detach(), hidden.grad, weight.grad


def _assert_near(got, want, rel):
    """Every element within rel x the largest magnitude of `want` (fp32 or bf16 rounding)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    bound = rel * want.abs().max().clamp(min=1e-30)
    assert (got - want).abs().max() <= bound, ((got - want).abs().max().item(), bound.item())


@pytest.mark.parametrize("softcap", [0.0, 5.0])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_chunks_give_the_loss_and_gradients_of_the_whole_logits_in_fp32(lm_loss, softcap, reduction):
    hidden, weight, targets = _inputs()

    def chunked(h, w, t):
        loss = lm_loss.linear_cross_entropy(h, w, t, VOCAB, softcap, reduction, rows=CHUNK)
        assert type(loss.grad_fn).__name__ == "LinearCrossEntropyBackward"  # the chunked path ran
        return loss

    got = _loss_and_grads(chunked, hidden, weight, targets, scale=0.37)
    want = _loss_and_grads(lambda h, w, t: _plain(h, w, t, softcap, reduction), hidden, weight, targets, scale=0.37)
    for g, w in zip(got, want):
        _assert_near(g, w, 1e-5)
    assert got[1][3::4].abs().max() > 0 and (got[1][::4] == 0).all()  # ignored tokens get no gradient
    assert got[2][:VOCAB].abs().max() > 0 and (got[2][VOCAB:] == 0).all()  # nor the padding rows


@pytest.mark.parametrize("softcap", [0.0, 15.0])
def test_under_bf16_autocast_the_chunks_are_as_close_to_fp64_as_the_whole_logits(lm_loss, softcap):
    hidden, weight, targets = _inputs(seed=1, n=300, width=64, rows=512, vocab=500)
    hidden, weight = hidden * 2, weight * 0.6  # logits of a few units: the softcap matters

    def chunked(h, w, t):
        return lm_loss.linear_cross_entropy(h, w, t, 500, softcap, "mean", rows=64)

    def plain(h, w, t):
        return _plain(h, w, t, softcap, "mean", vocab=500)

    got = _loss_and_grads(chunked, hidden, weight, targets, autocast=True)
    whole = _loss_and_grads(plain, hidden, weight, targets, autocast=True)
    exact = _loss_and_grads(plain, hidden.double(), weight.double(), targets)
    for g, w, e in zip(got, whole, exact):
        assert g.dtype == w.dtype  # fp32 loss and gradients (the inputs' dtype), as autocast gives
        _assert_near(g, w, 2e-2)  # a few bf16 roundings apart
        error, whole_error = ((x.double() - e).norm() / e.norm() for x in (g, w))
        assert error <= 1.25 * whole_error + 1e-6, (error.item(), whole_error.item())
        assert whole_error > 1e-5  # bf16 did round: the comparison means something


def test_gradients_accumulate_over_micro_batches_and_repeated_backward(lm_loss):
    """Two micro batches summed into .grad, and a retained graph's backward run twice, as the plain
    path does (backward scales a copy of what forward kept, never the kept tensors)."""
    results = {}
    for name, fn in {
        "chunked": lambda h, w, t: lm_loss.linear_cross_entropy(h, w, t, VOCAB, 5.0, "mean", rows=CHUNK),
        "plain": lambda h, w, t: _plain(h, w, t, 5.0, "mean"),
    }.items():
        h0, weight, t0 = _inputs(seed=2)
        h1, _, t1 = _inputs(seed=3)
        for t in (h0, h1, weight):
            t.requires_grad_()
        fn(h0, weight, t0).backward()
        loss = fn(h1, weight, t1)
        loss.backward(retain_graph=True)
        loss.backward()
        results[name] = (weight.grad, h0.grad, h1.grad)
    for got, want in zip(results["chunked"], results["plain"]):
        _assert_near(got, want, 1e-5)


def test_no_tensor_holds_the_whole_logits(lm_loss):
    """Forward and backward of 96 tokens x 200 vocabulary entries in chunks of 8 tokens: no op makes
    a tensor larger than a group of chunks' logits or the head's weight."""
    hidden, weight, targets = _inputs(n=96, width=8, rows=256, vocab=200)
    hidden.requires_grad_()
    weight.requires_grad_()

    class Largest(TorchDispatchMode):
        largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    Largest.largest = max(Largest.largest, t.numel())
            return out

    with Largest():
        lm_loss.linear_cross_entropy(hidden, weight, targets, 200, 15.0, "mean", rows=8).backward()
    group = lm_loss.CHUNKS_PER_HEAD_GRADIENT * 8 * 200  # a group's logit gradients, for the head's
    assert Largest.largest == max(group, 256 * 8) < 96 * 200
    Largest.largest = 0
    with Largest():
        _plain(hidden, weight, targets, 15.0, "mean", vocab=200).backward()
    assert Largest.largest == 96 * 256  # the plain path: logits of every row of the head


def test_evaluation_and_per_token_losses_take_the_whole_logits(lm_loss):
    hidden, weight, targets = _inputs()
    weight.requires_grad_()
    per_token = lm_loss.linear_cross_entropy(hidden, weight, targets, VOCAB, 5.0, "none")
    assert per_token.shape == (N,) and type(per_token.grad_fn).__name__ != "LinearCrossEntropyBackward"
    _assert_near(per_token, _plain(hidden, weight, targets, 5.0, "none"), 1e-6)
    with torch.no_grad():
        loss = lm_loss.linear_cross_entropy(hidden, weight, targets, VOCAB, 5.0, "mean")
    assert loss.grad_fn is None
    _assert_near(loss, _plain(hidden, weight, targets, 5.0, "mean").detach(), 1e-6)


def test_no_counted_target_is_a_nan_mean_with_zero_gradients_as_cross_entropy_gives(lm_loss):
    hidden, weight, targets = _inputs()
    targets[:] = -1
    got = _loss_and_grads(
        lambda h, w, t: lm_loss.linear_cross_entropy(h, w, t, VOCAB, 0.0, "mean", rows=CHUNK), hidden, weight, targets
    )
    want = _loss_and_grads(lambda h, w, t: _plain(h, w, t, 0.0, "mean"), hidden, weight, targets)
    assert math.isnan(got[0]) and math.isnan(want[0])
    for g, w in zip(got[1:], want[1:]):
        assert (g == 0).all() and (w == 0).all()


def test_what_forward_keeps_is_what_plan_counts(lm_loss, pkg):
    """The tensors the chunked loss saves for backward: the hidden states' gradient (tokens x width in
    the matmul's dtype) and the head's (rows x width, fp32), as models/loss_chunks.py counts them."""
    chunks = pkg.module("models.loss_chunks")
    hidden, weight, targets = _inputs()
    hidden.requires_grad_()
    weight.requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.numel() * t.element_size()) or t, lambda t: t
    ):
        lm_loss.linear_cross_entropy(hidden, weight, targets, VOCAB, 5.0, "mean", rows=CHUNK)
    kept = N * WIDTH * 4 + ROWS * WIDTH * 4
    assert sum(saved) == kept + 4  # and the count of tokens, for "mean"
    group = chunks.CHUNK_LOGITS * (chunks.CHUNK_BYTES_PER_LOGIT + 4 * chunks.CHUNKS_PER_HEAD_GRADIENT)
    transient = group + ROWS * WIDTH * 4
    assert chunks.chunked_loss_bytes(WIDTH, ROWS, N, matmul_bytes=4) == kept + transient


@pytest.mark.part("gpt3")
def test_plan_counts_a_d20_loss_in_chunks_and_the_pipelines_in_whole_logits(pkg):
    families = pkg.module("models.family")
    gpt, gpt3 = families.family("gpt"), families.family("gpt3")
    tokens, vocab = 16 * 2048, 32768
    shape = gpt.shape("d20")
    whole = gpt.loss_bytes(shape, vocab, tokens, 15.0, chunked=False)
    assert whole == tokens * vocab * 8  # fp32 logits and their softcapped copy
    assert gpt.loss_bytes(shape, vocab, tokens, 15.0) < whole / 6
    shape3 = gpt3.shape("1.3B")
    assert gpt3.loss_bytes(shape3, 50304, 4 * 2048, 0.0) < gpt3.loss_bytes(shape3, 50304, 4 * 2048, 0.0, chunked=False)


# --- the models ---------------------------------------------------------------------------------------

B, T, MODEL_VOCAB = 2, 24, 300


def _tokens(seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, MODEL_VOCAB, (B, T), generator=g)
    y = torch.randint(0, MODEL_VOCAB, (B, T), generator=g)
    y[:, :3] = -1
    return x, y


def _gpt(pkg):
    gpt = pkg.module("models.gpt.model")
    torch.manual_seed(0)
    config = gpt.GPTConfig(
        vocab_size=MODEL_VOCAB,
        sequence_len=T,
        n_layer=2,
        n_embd=32,
        n_head=2,
        n_kv_head=1,
        softcap=5.0,
        vocab_multiple=64,  # 320 rows: padding the loss must cut off
        value_embeddings=True,
        residual_scalars=True,
        smear=True,
    )
    model = gpt.GPT(config)
    model.init_weights()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # every block matters (init leaves the output projections at zero)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.3 * (p.shape[-1] if p.dim() > 1 else 1) ** -0.5)
    return model


def _gpt3(pkg):
    gpt3 = pkg.module("models.gpt3.model")
    return gpt3.GPT3(gpt3.GPT3Config(vocab_size=MODEL_VOCAB, sequence_len=T, n_layer=2, n_embd=32, n_head=4))


def _model_loss_and_grads(model, loss_of):
    model.zero_grad(set_to_none=True)
    loss = loss_of(model)
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("family", ["gpt", pytest.param("gpt3", marks=pytest.mark.part("gpt3"))])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_the_models_training_loss_is_the_cross_entropy_of_their_logits(pkg, lm_loss, monkeypatch, family, reduction):
    """Loss and every parameter's gradient (the tied gpt3 embedding's included) equal the plain path
    through the logits the model returns, with the loss in chunks of 10 tokens."""
    monkeypatch.setattr(lm_loss, "CHUNK_LOGITS", 10 * MODEL_VOCAB)
    model = (_gpt if family == "gpt" else _gpt3)(pkg).train()
    x, y = _tokens(seed=4)

    def chunked(m):
        loss = m(x, y, loss_reduction=reduction)
        assert type(loss.grad_fn).__name__ == "LinearCrossEntropyBackward"
        return loss

    def plain(m):
        logits = m(x)
        return F.cross_entropy(logits.view(-1, MODEL_VOCAB), y.view(-1), ignore_index=-1, reduction=reduction)

    got, got_grads = _model_loss_and_grads(model, chunked)
    want, want_grads = _model_loss_and_grads(model, plain)
    _assert_near(got, want, 1e-5)
    assert got_grads.keys() == want_grads.keys()
    for name in want_grads:
        assert want_grads[name].abs().max() > 0, name  # a gradient that could differ
        _assert_near(got_grads[name], want_grads[name], 1e-5)


def test_the_gpt_loss_under_bf16_autocast(pkg, lm_loss, monkeypatch):
    monkeypatch.setattr(lm_loss, "CHUNK_LOGITS", 10 * MODEL_VOCAB)
    model = _gpt(pkg).train()
    x, y = _tokens(seed=5)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, got_grads = _model_loss_and_grads(model, lambda m: m(x, y))
        want, want_grads = _model_loss_and_grads(
            model, lambda m: F.cross_entropy(m(x).view(-1, MODEL_VOCAB), y.view(-1), ignore_index=-1)
        )
    _assert_near(got, want, 1e-2)
    for name in want_grads:
        _assert_near(got_grads[name], want_grads[name], 5e-2)


def test_the_chunked_loss_compiles_into_one_graph_with_the_eager_gradients(pkg, lm_loss, monkeypatch):
    """Traced whole with the model (what run.compile does on a GPU): forward and backward equal eager's."""
    monkeypatch.setattr(lm_loss, "CHUNK_LOGITS", 10 * MODEL_VOCAB)
    model = _gpt(pkg).train()
    x, y = _tokens(seed=6)
    eager, eager_grads = _model_loss_and_grads(model, lambda m: m(x, y))
    torch._dynamo.reset()
    compiled_model = torch.compile(model, backend="aot_eager", fullgraph=True)
    try:
        compiled, compiled_grads = _model_loss_and_grads(model, lambda m: compiled_model(x, y))
    finally:
        torch._dynamo.reset()
    _assert_near(compiled, eager, 1e-6)
    for name in eager_grads:
        _assert_near(compiled_grads[name], eager_grads[name], 1e-5)
