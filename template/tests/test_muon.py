"""nanochat's recipe (optim.optimizer=muon with every model piece on, rows of whole documents) keeps the family's guarantees:
one process and two give the same losses and weights (the orthogonalisation is spread over the two),
a run stopped at a checkpoint continues exactly, Muon's state and schedules included, and the
trained model exports with its own modeling code (transformers has no class for the pieces).

    python -m pytest -q tests/test_muon.py
"""

from __future__ import annotations

import re
import shutil

import pytest
import torch
from conftest import NANOCHAT_PIECES
from test_export import assert_greedy_like_sample, assert_same_logits, ours_and_theirs

MUON = [
    "optim.optimizer=muon",
    "schedule.decay=warmdown",
    "schedule.min_lr_ratio=0.05",
    "optim.weight_decay=0.28",
    "optim.grad_clip=0",
    "data.rows=documents",
    *NANOCHAT_PIECES,
    "schedule.max_steps=20",
    "checkpoint.every_steps=10",
    # a batch at which the derived rates move the tiny model (the reference is 2^19 tokens a step)
    "batch.global_batch_size=64",
    "batch.micro_batch_size=8",
]


@pytest.fixture(scope="module")
def muon_runs(once, cli, demo_data, train):
    def run(nproc: int):
        return lambda out: train(cli, demo_data, out, nproc, *MUON).stdout

    return {nproc: once(f"muon_{nproc}proc", run(nproc)) for nproc in (1, 2)}


def test_one_process_and_two_learn_alike_under_muon(muon_runs, metrics):
    (one_dir, one_log), (two_dir, two_log) = muon_runs[1], muon_runs[2]
    assert "peak lrs matrix" in one_log and "embedding" in two_log
    one, _ = metrics(one_dir)
    two, _ = metrics(two_dir)
    assert len(one) == len(two) > 1 and one[-1]["loss"] < one[0]["loss"]
    for a, b in zip(one, two):
        assert abs(a["loss"] - b["loss"]) < 1e-4, (a["step"], a["loss"], b["loss"])
        assert a["lr"] == b["lr"]
    w1 = torch.load(one_dir / "checkpoints" / "step_00000020.pt", weights_only=False)
    w2 = torch.load(two_dir / "checkpoints" / "step_00000020.pt", weights_only=False)
    # Adam's eps of 1e-10 on the tables turns reduction-order noise in a rare token's gradient into
    # steps of the table's lr: the weights agree to 1e-3 where the losses agree to 1e-4.
    for name in w1["model"]:
        assert torch.allclose(w1["model"][name], w2["model"][name], atol=1e-3), name
    assert "value_embeds.1.weight" in w1["model"] and "resid_lambdas" in w1["model"]


def test_plan_shows_the_rates_the_run_derives(muon_runs, cli, demo_data, train_overrides):
    """plan's optimizer line and the run's first line name the same peak rate for every role."""
    run_line = re.search(r"peak lrs [^|\n]*", muon_runs[1][1]).group(0).strip().rstrip(",")
    plan = cli("plan", *train_overrides, *MUON, f"data.dir={demo_data}").stdout
    assert f"optimizer: Muon on the blocks' matrices, AdamW on the rest | {run_line} |" in plan, (run_line, plan)
    assert run_line.count(",") == 6  # every role of the pieces: matrix, the tables, the head and 3 scalar kinds


def test_a_muon_run_resumes_exactly(muon_runs, cli, demo_data, train, metrics, tmp_path):
    """The 2-process run's checkpoint of step 10, continued: Muon's momentum and second moment, and the
    step's schedules, are restored, so the losses are the uninterrupted run's, bit for bit."""
    out = tmp_path / "run"
    (out / "checkpoints").mkdir(parents=True)
    source = muon_runs[2][0] / "checkpoints"
    for name in ("step_00000010.pt", "step_00000010.pt.json"):
        shutil.copy2(source / name, out / "checkpoints" / name)
    (out / "checkpoints" / "latest").write_text("step_00000010.pt")
    proc = train(cli, demo_data, out, 2, *MUON)
    assert "steps 10->20" in proc.stdout
    continued, _ = metrics(out)
    uninterrupted, _ = metrics(muon_runs[2][0])
    after = [r for r in uninterrupted if r["step"] > 10]
    assert [r["step"] for r in continued] == [r["step"] for r in after]
    for got, want in zip(continued, after):
        assert got["loss"] == want["loss"], (got["step"], got["loss"], want["loss"])


def test_a_model_with_every_piece_exports_with_its_modeling_code(
    muon_runs, demo_data, export, cli, pkg, cfg_with, train_overrides, monkeypatch
):
    """The folder carries the network's code: transformers loads it offline with trust_remote_code,
    its logits equal ours and its greedy tokens are those `sample` prints."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    run = muon_runs[1][0]
    overrides = [*train_overrides, *MUON, f"data.dir={demo_data}", f"run.output_dir={run}", "run.device=cpu"]
    folder = export(demo_data, run, *train_overrides, *MUON)
    assert {"model.py", "pieces.py", "lm_loss.py", "loss_chunks.py", "sample_dropout.py", "export.py"} <= {
        p.name for p in folder.iterdir()
    }
    model, hf, cfg = ours_and_theirs(pkg, cfg_with, [*overrides, "run.dtype=fp32"], folder, trust_remote_code=True)
    assert type(hf).__name__ == "GPTForCausalLM" and hf.num_parameters() == model.num_params()
    assert_same_logits(model, hf, model.config.vocab_size, cfg.model.sequence_len)
    assert_greedy_like_sample(cli, hf, folder, overrides)
    ids = torch.randint(5, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(1))
    ended = torch.ones_like(ids)
    ended[1, 8:] = 0  # the second row padded at its end, as lm-eval pads for scoring
    with torch.no_grad():
        assert torch.allclose(hf(ids, attention_mask=ended).logits[1, :8], model(ids[1:, :8])[0], atol=1e-4)
        with pytest.raises(ValueError, match="padded at the end only"):
            hf(ids, attention_mask=ended.flip(1))


def test_orthogonalize_equalises_rows_and_sets_the_norm(pkg):
    """Muon's orthogonalisation: singular values near 1 for tall and wide stacks, the Frobenius norm
    of an exactly semi-orthogonal matrix (Muon+), and rows scaled before going in change nothing
    (MuonEq equalises them first)."""
    orthogonalize = pkg.module("strategies.optimizer").orthogonalize
    for shape in ((3, 48, 16), (3, 16, 48)):
        g = torch.randn(shape, generator=torch.Generator().manual_seed(0))
        out = orthogonalize(g)
        singular = torch.linalg.svdvals(out)
        assert singular.min() > 0.5 and singular.max() < 1.5, singular
        norms = out.norm(dim=(-2, -1))
        assert torch.allclose(norms, torch.full_like(norms, min(shape[1:]) ** 0.5), rtol=1e-5), norms
        rows_scaled = g * torch.linspace(0.1, 10.0, shape[1]).view(1, -1, 1)
        assert torch.allclose(orthogonalize(rows_scaled), out, atol=1e-4)
