"""Dropout keyed by the sample (models/sample_dropout.py): the gpt model on CPU.

    python -m pytest -q tests/test_dropout.py      # about a minute on two cores

torch's dropout draws from each process's generator, so 1 and 2 processes gave different losses
and data-parallel ranks seeded alike drew the same masks for different samples. Keyed masks make
the losses of 1, 2 and 4 processes agree, under DDP and FSDP2 (measured: within 1e-6, fp32), checked
at 1e-5. bert and
gpt3 have the same checks in their own test files.
"""

from __future__ import annotations

import pytest
import torch

TOL = 1e-5
DROPOUT = ["model.dropout=0.1", "schedule.max_steps=10", "checkpoint.every_steps=10"]


def _tiny_gpt(pkg, dropout: float):
    gpt = pkg.module("models.gpt.model")
    config = gpt.GPTConfig(vocab_size=64, sequence_len=16, n_layer=2, n_embd=32, n_head=2, n_kv_head=2, dropout=dropout)
    torch.manual_seed(0)
    model = gpt.GPT(config)
    model.init_weights()
    for block in model.blocks:  # the zero-initialised projections would hide the branches' masks
        torch.nn.init.normal_(block.attn.c_proj.weight, std=0.1)
        torch.nn.init.normal_(block.mlp.c_proj.weight, std=0.1)
    return model.train()


def _logits(pkg, model, tokens: torch.Tensor, first: int, step: int = 0) -> torch.Tensor:
    dropout = pkg.module("models.sample_dropout")
    with dropout.samples(dropout.sample_keys(1337, step, first, tokens.size(0))):
        return model(tokens)


def test_data_parallel_ranks_draw_different_masks_for_their_samples(pkg):
    """Two ranks run the same tokens as their first sample (sequences 0 and 4 of the stream): the
    masks, and so the outputs, differ; torch's dropout seeded alike on both gave the same."""
    model = _tiny_gpt(pkg, 0.1)
    tokens = torch.randint(0, 64, (1, 16))
    rank0, rank1 = _logits(pkg, model, tokens, first=0), _logits(pkg, model, tokens, first=4)
    assert not torch.allclose(rank0, rank1)
    assert torch.equal(_logits(pkg, model, tokens, first=0), rank0)  # a pure function of the sample
    later = _logits(pkg, model, tokens, first=0, step=1)  # the same sample at another step: new masks
    assert not torch.allclose(later, rank0)
    plain = _tiny_gpt(pkg, 0.0)
    assert torch.equal(_logits(pkg, plain, tokens, first=0), _logits(pkg, plain, tokens, first=4))


def test_a_sample_gets_its_masks_wherever_it_runs(pkg):
    """Sample 5 alone, or second of a micro batch starting at 4: the same output."""
    model = _tiny_gpt(pkg, 0.1)
    tokens = torch.randint(0, 64, (3, 16))
    together = _logits(pkg, model, tokens, first=4)
    alone = _logits(pkg, model, tokens[1:2], first=5)
    assert torch.allclose(together[1:2], alone, atol=1e-6)


def test_dropout_outside_a_micro_batch_is_an_error_not_a_silent_draw(pkg):
    model = _tiny_gpt(pkg, 0.1)
    with pytest.raises(RuntimeError, match="samples"):
        model(torch.randint(0, 64, (1, 16)))
    model.eval()
    model(torch.randint(0, 64, (1, 16)))  # no dropout in eval: nothing to key


@pytest.fixture(scope="module")
def dropout_runs(once, cli, demo_data, train):
    def run(nproc: int, *extra: str):
        return lambda out: train(cli, demo_data, out, nproc, *DROPOUT, "cluster.gpus_per_node=4", *extra).stdout

    runs = {nproc: once(f"dropout_{nproc}proc", run(nproc))[0] for nproc in (1, 2, 4)}
    return {**runs, "fsdp2": once("dropout_fsdp_2proc", run(2, "run.strategy=fsdp"))[0]}


@pytest.mark.parametrize("nproc", [2, 4, "fsdp2"])
def test_processes_give_the_losses_of_one_with_dropout_on(nproc, dropout_runs, metrics):
    """2 and 4 DDP processes, and 2 FSDP2 processes (each rank holds half of every weight)."""
    one, _ = metrics(dropout_runs[1])
    many, _ = metrics(dropout_runs[nproc])
    assert [r["step"] for r in many] == [r["step"] for r in one]
    for got, want in zip(many, one):
        assert abs(got["loss"] - want["loss"]) < TOL, (nproc, got, want)
        assert abs(got["grad_norm"] - want["grad_norm"]) < TOL * max(1.0, want["grad_norm"]), (nproc, got, want)


def test_dropout_changes_the_losses(dropout_runs, run_1proc, metrics):
    """The runs above do drop: their losses are not those of the same run without dropout."""
    with_dropout, _ = metrics(dropout_runs[1])
    without, _ = metrics(run_1proc[0])
    assert abs(with_dropout[0]["loss"] - without[0]["loss"]) > 1e-3, (with_dropout[0], without[0])
