"""The GPT: shapes, initial loss, grouped-query attention, KV-cache decoding, FLOPs, schedule."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import NANOCHAT_PIECES

VOCAB = 512


@pytest.fixture
def gpt(pkg):
    return pkg.module("models.gpt.model")


def make(
    gpt, *, n_kv_head=2, sequence_len=64, softcap=15.0, n_layer=2, n_embd=64, n_head=4, vocab=VOCAB, seed=0, **pieces
):
    torch.manual_seed(seed)
    model = gpt.GPT(
        gpt.GPTConfig(
            vocab_size=vocab,
            sequence_len=sequence_len,
            n_layer=n_layer,
            n_embd=n_embd,
            n_head=n_head,
            n_kv_head=n_kv_head,
            softcap=softcap,
            **pieces,
        )
    )
    model.init_weights()
    return model.eval()


def randomize(model, seed=1):
    """Weights that make every block matter: at init the output projections are zero, so
    attention (and any KV-cache mistake) would not change the logits at all."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            fan_in = p.shape[-1] if p.dim() > 1 else 1
            p.copy_(torch.randn(p.shape, generator=g) * (1.0 if p is model.wte.weight else fan_in**-0.5))
    return model


def tokens(batch, length, seed=0, vocab=VOCAB):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def test_build_model_from_config(pkg, tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    cfg = pkg.config.load_config(empty, ["model.size=tiny", "model.sequence_len=32", "model.n_kv_head=1"])
    model = pkg.models.build_model(cfg, 300)
    c = model.config
    assert (c.n_layer, c.n_embd, c.n_head, c.n_kv_head, c.vocab_size, c.sequence_len) == (2, 64, 4, 1, 300, 32)
    assert model.wte.weight.shape == (300, 64) and model.lm_head.weight.shape == (300, 64)


def test_forward_shapes(gpt):
    model = make(gpt)
    x, y = tokens(3, 20), tokens(3, 20, seed=1)
    assert model(x).shape == (3, 20, VOCAB)
    loss = model(x, y)
    assert loss.shape == () and torch.isfinite(loss)
    per_token = model(x, y, loss_reduction="none")
    assert per_token.shape == (60,)
    assert torch.allclose(per_token.mean(), loss)
    y[:, :5] = -1  # ignored targets
    assert torch.allclose(model(x, y), model(x, y, loss_reduction="none")[(y != -1).reshape(-1)].mean())


def test_initial_loss_is_about_ln_vocab(gpt):
    model = make(gpt, vocab=2048)
    loss = model(tokens(4, 64, vocab=2048), tokens(4, 64, seed=1, vocab=2048)).item()
    assert abs(loss - math.log(2048)) < 0.02, loss


def test_logits_are_softcapped(gpt):
    model = randomize(make(gpt, softcap=5.0))
    with torch.no_grad():
        model.lm_head.weight.mul_(100)
    logits = model(tokens(2, 16))
    assert logits.abs().max() <= 5.0
    assert logits.abs().max() > 4.9  # the cap is reached, so the test means something


def test_attention_is_causal(gpt):
    model = randomize(make(gpt))
    x = tokens(1, 24)
    changed = x.clone()
    changed[0, 12] = (x[0, 12] + 1) % VOCAB
    a, b = model(x), model(changed)
    assert torch.allclose(a[:, :12], b[:, :12], atol=1e-5)
    assert not torch.allclose(a[:, 12:], b[:, 12:], atol=1e-3)


@pytest.mark.parametrize("n_kv_head", [1, 2])
def test_grouped_query_attention_equals_repeated_kv_heads(gpt, n_kv_head):
    """A GQA model computes what a full multi-head model computes when each key/value head is
    copied to the query heads of its group (query head h uses kv head h // group)."""
    gqa = randomize(make(gpt, n_kv_head=n_kv_head))
    mha = make(gpt, n_kv_head=4)
    group, hd = 4 // n_kv_head, gqa.config.head_dim
    assert gqa.blocks[0].attn.c_k.weight.shape == (n_kv_head * hd, 64)
    state = gqa.state_dict()
    for name, w in list(state.items()):
        if name.endswith(("attn.c_k.weight", "attn.c_v.weight")):
            state[name] = w.view(n_kv_head, hd, -1).repeat_interleave(group, dim=0).reshape(4 * hd, -1)
    mha.load_state_dict(state)
    x, y = tokens(2, 32), tokens(2, 32, seed=1)
    assert torch.allclose(gqa(x), mha(x), atol=1e-5)
    loss = gqa.train()(x, y)
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in gqa.parameters())


def greedy_without_cache(model, prompt, steps):
    """Full passes over the last sequence_len tokens (all of them while they fit: a sliding window)."""
    ids = list(prompt)
    for _ in range(steps):
        ids.append(int(model(torch.tensor([ids[-model.config.sequence_len :]]))[0, -1].argmax()))
    return ids[len(prompt) :]


@pytest.mark.parametrize("n_kv_head", [4, 2])
def test_kv_cache_greedy_generation_equals_full_recompute(gpt, n_kv_head):
    # sequence_len 16: 7 prompt tokens + 30 new ones, the first 9 from the KV cache, the rest from
    # a sliding window over the last 16 (positions past the training context are never used).
    model = randomize(make(gpt, n_kv_head=n_kv_head, sequence_len=16))
    prompt = tokens(1, 7, seed=3)[0].tolist()
    with torch.no_grad():
        cached = model.generate(prompt, 30, temperature=0)
        full = greedy_without_cache(model, prompt, 30)
    assert cached == full
    assert len(set(cached)) > 3  # not a degenerate repetition that any bug would also produce


@pytest.mark.parametrize("window_pattern", ["L", "SL"])
def test_kv_cache_logits_match_full_forward_chunk_by_chunk(gpt, window_pattern):
    """Prefill 5 tokens, then a chunk of 6 (the masked path), then single tokens; with a sliding window
    of 4 on the first layer (sequence 16) too."""
    model = randomize(make(gpt, n_kv_head=2, sequence_len=16, window_pattern=window_pattern))
    x = tokens(2, 14, seed=5)
    with torch.no_grad():
        full = model(x)
        cache = gpt.KVCache(model.config.n_layer)
        parts = [model(x[:, :5], cache=cache), model(x[:, 5:11], cache=cache)]
        parts += [model(x[:, t : t + 1], cache=cache) for t in range(11, 14)]
    assert cache.length == 14
    assert torch.allclose(torch.cat(parts, dim=1), full, atol=1e-4)


def test_a_sliding_window_layer_sees_its_window_only(gpt):
    """window_pattern SSL at sequence 32: layers 0 and 1 see 8 earlier positions, the last one all.
    A change at position 0 reaches a windowed layer's output up to position 8 and no further."""
    model = randomize(make(gpt, n_layer=3, sequence_len=32, window_pattern="SSL"))
    assert [b.attn.window for b in model.blocks] == [8, 8, 32]
    x = torch.randn(1, 32, 64, generator=torch.Generator().manual_seed(0))
    changed = x.clone()
    changed[:, 0] += 1.0
    cos, sin = model.cos[:, :32], model.sin[:, :32]
    for block in model.blocks:
        with torch.no_grad():
            moved = (block.attn(changed, cos, sin, None) - block.attn(x, cos, sin, None)).abs().amax(-1)[0]
        reach = 32 if block.attn.window == 32 else 9
        assert (moved[:reach] > 0).all() and (moved[reach:] == 0).all()
    plain = make(gpt, n_layer=3, sequence_len=32)
    c = model.config
    assert plain.flops_per_token() - model.flops_per_token() == 2 * 12 * c.n_head * c.head_dim * (32 - 8)


def test_a_padded_vocabulary_cuts_its_logits_and_counts_its_rows(gpt, pkg):
    """vocab 300 in tables of 320 rows (model.vocab_multiple=64): logits of 300, the same loss as the
    logits give, and plan's parameters and FLOPs are the module's."""
    model = randomize(make(gpt, vocab=300, vocab_multiple=64, value_embeddings=True))
    assert model.wte.weight.shape[0] == model.lm_head.weight.shape[0] == model.value_embeds["1"].weight.shape[0] == 320
    x, y = tokens(2, 16, vocab=300), tokens(2, 16, seed=1, vocab=300)
    logits = model(x)
    assert logits.shape == (2, 16, 300)
    assert torch.allclose(model(x, y), torch.nn.functional.cross_entropy(logits.view(-1, 300), y.view(-1)))
    family = pkg.module("models.gpt.descriptor").FAMILY
    c = model.config
    shape = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_kv_head": 2, "value_embeddings": True, "vocab_multiple": 64}
    assert family.num_params(shape, 300, c.sequence_len) == model.num_params()
    assert family.flops_per_token(shape, 300, c.sequence_len) == model.flops_per_token()


def test_sampling_is_reproducible_with_a_seeded_generator(gpt):
    model = randomize(make(gpt))
    prompt = [1, 2, 3]

    def sample(seed):
        g = torch.Generator().manual_seed(seed)
        return model.generate(prompt, 20, temperature=1.0, top_k=20, generator=g)

    assert sample(0) == sample(0)
    assert sample(0) != sample(1)
    assert all(0 <= t < VOCAB for t in sample(2))


def test_generation_slides_over_the_context_far_past_it(gpt):
    """sequence_len 16 and rotary tables for 160 positions: 200 new tokens after a 40-token prompt
    (itself longer than the context) come out, seeded sampling repeats them, greedy matches full passes."""
    model = randomize(make(gpt, sequence_len=16))
    prompt = tokens(1, 40, seed=4)[0].tolist()

    def sample(seed):
        return model.generate(prompt, 200, temperature=1.0, top_k=20, generator=torch.Generator().manual_seed(seed))

    first = sample(7)
    assert len(first) == 200 and all(0 <= t < VOCAB for t in first)
    assert sample(7) == first and sample(8) != first
    with torch.no_grad():
        assert model.generate(prompt, 40, temperature=0) == greedy_without_cache(model, prompt, 40)


def test_top_k_1_is_greedy(gpt):
    model = randomize(make(gpt))
    g = torch.Generator().manual_seed(0)
    assert model.generate([5, 6], 15, temperature=0.7, top_k=1, generator=g) == model.generate(
        [5, 6], 15, temperature=0
    )


@pytest.mark.parametrize("n_kv_head, sequence_len", [(4, 64), (2, 128), (1, 32)])
def test_flops_per_token(gpt, n_kv_head, sequence_len):
    model = make(gpt, n_kv_head=n_kv_head, sequence_len=sequence_len)
    c = model.config
    params = sum(p.numel() for p in model.parameters())
    embedding = c.vocab_size * c.n_embd
    expected = 6 * (params - embedding) + 12 * c.n_layer * c.n_head * c.head_dim * c.sequence_len
    assert model.flops_per_token() == expected
    # The same count from the shapes: q, k, v, proj, 2 MLP matrices per layer, and the head.
    hd = c.head_dim
    per_layer = c.n_embd * c.n_head * hd * 2 + 2 * c.n_embd * c.n_kv_head * hd + 8 * c.n_embd**2
    assert params - embedding == c.n_layer * per_layer + c.vocab_size * c.n_embd
    assert model.num_params() == params


def test_training_steps_lower_the_loss(gpt):
    """The model can learn: a few AdamW steps on one fixed batch drive its loss down."""
    model = make(gpt).train()
    x, y = tokens(4, 32), tokens(4, 32, seed=1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    first = model(x, y).item()
    for _ in range(30):
        opt.zero_grad()
        model(x, y).backward()
        opt.step()
    assert model(x, y).item() < first - 1.0


def test_learning_rate_schedule(pkg, tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    cfg = pkg.config.load_config(
        empty, ["optim.lr=0.01", "schedule.warmup_steps=10", "schedule.max_steps=110", "schedule.min_lr_ratio=0.1"]
    )
    schedule = pkg.module("training.schedule")

    def lr_at(step, cfg):
        return 0.01 * schedule.at(step, cfg.schedule).lr_factor

    assert lr_at(0, cfg) == pytest.approx(0.001)  # linear warmup
    assert lr_at(4, cfg) == pytest.approx(0.005)
    assert lr_at(9, cfg) == pytest.approx(0.01)  # peak at the end of warmup
    assert lr_at(10, cfg) == pytest.approx(0.01)
    assert lr_at(60, cfg) == pytest.approx(0.01 * (0.1 + 0.9 * 0.5))  # half way down the cosine
    assert lr_at(110, cfg) == pytest.approx(0.001)  # lr * min_lr_ratio at max_steps
    decay = [lr_at(s, cfg) for s in range(10, 111)]
    assert all(a >= b for a, b in zip(decay, decay[1:]))

    # nanochat's: constant until the last warmdown_ratio of the steps, then linear to min_lr_ratio;
    # Muon's momentum warms up from 0.85 to 0.97 and falls to 0.90 during the warmdown.
    cfg = pkg.config.changed(
        cfg, **{"schedule.decay": "warmdown", "schedule.warmdown_ratio": 0.5, "schedule.max_steps": 1000}
    )
    assert lr_at(500, cfg) == pytest.approx(0.01)
    assert lr_at(750, cfg) == pytest.approx(0.01 * (0.5 + 0.5 * 0.1))
    assert lr_at(1000, cfg) == pytest.approx(0.001)
    points = [schedule.at(s, cfg.schedule) for s in (0, 200, 400, 499, 1000)]
    assert [round(p.muon_momentum, 3) for p in points] == [0.85, 0.91, 0.97, 0.97, 0.9]
    assert points[0].weight_decay_factor == 1.0 and points[-1].weight_decay_factor == pytest.approx(0.0)

    # Without decay (min_lr_ratio=1) nothing reads max_steps: a run extended by a larger max_steps and
    # resumed takes the steps of one given that max_steps from the start.
    for decay in ("warmdown", "cosine"):
        short, long = (
            pkg.config.changed(cfg, **{"schedule.decay": decay, "schedule.min_lr_ratio": 1.0, "schedule.max_steps": n})
            for n in (500, 1000)
        )
        assert [schedule.at(s, short.schedule) for s in range(0, 501, 50)] == [
            schedule.at(s, long.schedule) for s in range(0, 501, 50)
        ]
        assert (
            schedule.at(450, long.schedule).weight_decay_factor == 1.0
            and schedule.at(450, long.schedule).muon_momentum == 0.97
        )


def test_optimizer_skips_weight_decay_on_the_embedding(pkg, gpt, tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    cfg = pkg.config.load_config(empty, ["optim.weight_decay=0.25"])
    model = make(gpt)
    run = pkg.run_context.resolve_run(cfg, pkg.distributed.one_process(torch.device("cpu")))
    opt = pkg.module("strategies.optimizer").build_optimizer(model, run)
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] == 0.25 for p in g["params"]}
    assert id(model.wte.weight) not in decayed
    assert id(model.lm_head.weight) in decayed and id(model.blocks[0].attn.c_q.weight) in decayed
    assert sum(len(g["params"]) for g in opt.param_groups) == len(list(model.parameters()))


def test_muon_steps_the_blocks_matrices_and_adamw_the_rest_at_the_derived_rates(pkg, tmp_path):
    """optim.optimizer=muon: every parameter in one group; the blocks' matrices in Muon groups of one
    shape each; the tables, head and scalars with AdamW; the lrs scaled from nanochat's reference
    (2^19 tokens, width 768) to this batch and width; the update orthogonalised; and the loss falls."""
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    cfg = pkg.config.load_config(
        empty,
        ["model.size=tiny", "model.sequence_len=64", f"data.vocab_size={VOCAB}", "batch.global_batch_size=2048",
         "optim.optimizer=muon", *NANOCHAT_PIECES],
    )  # fmt: skip
    model = pkg.module("models").build_model(cfg, VOCAB)
    optimizer = pkg.module("strategies.optimizer")
    opt = optimizer.build_optimizer(
        model, pkg.run_context.resolve_run(cfg, pkg.distributed.one_process(torch.device("cpu")))
    )
    names = {id(p): n for n, p in model.named_parameters()}
    grouped = [names[id(p)] for g in opt.param_groups for p in g["params"]]
    assert sorted(grouped) == sorted(names.values())
    for g in opt.param_groups:
        members = [names[id(p)] for p in g["params"]]
        if g["kind"] == "muon":
            assert all(n.startswith("blocks.") for n in members) and len({p.shape for p in g["params"]}) == 1
        else:
            assert not any(n.startswith("blocks.") for n in members)
    batch = (2048 * 64 / 2**19) ** 0.5
    peaks = {g["role"]: lr for g, (lr, _) in zip(opt.param_groups, opt.peaks)}
    assert peaks["matrix"] == pytest.approx(0.02 * batch)
    assert peaks["embedding"] == pytest.approx(0.3 * batch * (64 / 768) ** -0.5)
    assert peaks["value_embedding"] == pytest.approx(peaks["embedding"] / 2)
    assert peaks["unembedding"] == pytest.approx(0.008 * batch * (64 / 768) ** -0.5)

    g = torch.randn(3, 96, 40, generator=torch.Generator().manual_seed(0))
    singular = torch.linalg.svdvals(optimizer.orthogonalize(g))
    assert singular.min() > 0.6 and singular.max() < 1.25  # near-orthogonal, whatever g's spectrum

    x = torch.randint(0, VOCAB, (4, 64), generator=torch.Generator().manual_seed(1))
    first = model(x, x).item()
    for step in range(20):
        optimizer.set_schedule(opt, pkg.module("training.schedule").at(step + 100, cfg.schedule))
        opt.zero_grad()
        model(x, x).backward()
        opt.step()
    assert model(x, x).item() < first - 1.0


def test_gradient_norm_is_accumulated_in_fp64_and_clips_to_the_limit(pkg):
    """DDP and DeepSpeed ZeRO 0 clip by strategies/common.py's norm, taken the way ZeRO 1-3 take
    theirs (each gradient's norm in fp64), so all strategies log and clip by the same number. torch's
    fp32 norm of these gradients is 8e-6 (relative) off on a 2-core x86 CPU."""
    grad_norm = pkg.module("strategies.common")
    gen = torch.Generator().manual_seed(0)
    params = [torch.nn.Parameter(torch.zeros(shape)) for shape in ((4096, 256), (256,), (3, 5))]
    for p in params:
        p.grad = torch.rand(p.shape, generator=gen) * 1e-3
    exact = torch.cat([p.grad.double().flatten() for p in params]).norm().item()
    before = [p.grad.clone() for p in params]

    norm = grad_norm.clip_gradients(params, None)  # no limit: the gradients stay as they are
    assert norm.dtype == torch.float32 and norm.item() == pytest.approx(exact, rel=1e-7, abs=0)
    assert all(torch.equal(p.grad, b) for p, b in zip(params, before))

    limit = exact / 4
    assert grad_norm.clip_gradients(params, limit).item() == pytest.approx(exact, rel=1e-7, abs=0)
    clipped = torch.cat([p.grad.double().flatten() for p in params]).norm().item()
    assert clipped == pytest.approx(limit * exact / (exact + 1e-6), rel=1e-6, abs=0)  # torch's factor
    assert grad_norm.global_grad_norm([]).item() == 0.0
