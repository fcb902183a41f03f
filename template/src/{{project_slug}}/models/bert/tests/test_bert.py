"""model.arch=bert on CPU: tiny BertForMaskedLM trained under real torchrun (DDP and DeepSpeed
ZeRO-3, 2 processes, Gloo), eval, fill-mask sampling, fine-tuning from a local folder, and the
masked batches being a pure function of the sequence index.

    python -m pytest -q src/<package>/models/bert/tests/test_bert.py       # about 2 minutes on 2 cores

Every setting that matters is pinned here (BERT), so edits to config/train.yaml do not change the
tests. Measured on a 2-core CPU: the logged loss falls from 7.48 (step 5) to 6.21 (step 40), a
drop of 1.27 nats (1.20 to 1.52 over run.seed 1-4), checked with a 0.5 margin. Dropout (0.1)
draws its masks per sample, so 1, 2 and 4 processes and ZeRO-3 log the losses of one process
(measured within 1e-6; checked at 1e-5).
"""

from __future__ import annotations

import importlib.util
import json
import math
import re
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.part("bert")  # collected where the project holds it (conftest.py)

STEPS = list(range(5, 41, 5))
BERT = [
    "model.arch=bert",
    "model.size=tiny",
    "model.pretrained=",
    "model.n_kv_head=null",
    "model.sequence_len=64",
    "model.activation_checkpointing=false",
    "model.dropout=0.1",  # BERT's own; masks keyed by the sample (models/sample_dropout.py)
    "model.attention_dropout=0.1",  # BERT's recipe (the default, 0, keeps the fused kernel): the keyed path is tested
    "batch.global_batch_size=16",
    "batch.micro_batch_size=4",
    "batch.grad_accum_steps=null",
    "schedule.max_steps=40",
    "schedule.warmup_steps=5",
    "schedule.min_lr_ratio=1.0",
    "optim.lr=0.002",  # 0.005 spiked on some seeds (grad norm 20 at step 30 with seed 2)
    "optim.weight_decay=0.01",
    "optim.beta1=0.9",
    "optim.beta2=0.999",
    "optim.grad_clip=1.0",
    "logging.every_steps=5",
    "logging.eval_every_steps=0",
    "logging.eval_batches=2",
    "logging.tensorboard=false",
    "checkpoint.every_steps=0",
    "checkpoint.keep_last=2",
    "checkpoint.resume=true",
    "run.seed=1337",
    "run.device=cpu",
    "run.dtype=fp32",
    "run.compile=false",
    "run.strategy=ddp",
    "deepspeed.offload_optimizer=false",
    "deepspeed.offload_params=false",
    "parallel.tensor=1",
    "parallel.pipeline=1",
]
MARGIN = 0.5  # nats between the first and the last logged loss (measured drop: 1.27)
LAYOUT_TOL = 1e-5  # absolute, on logged losses: only the order of the reductions differs


@pytest.fixture(scope="module")
def bert_data(tmp_path_factory, cli) -> Path:
    """The demo corpus with a 2048-token WordPiece tokenizer ([PAD] [UNK] [CLS] [SEP] [MASK])."""
    data_dir = tmp_path_factory.mktemp("bert_data")
    proc = cli(
        "prepare-data",
        "--demo-corpus",
        "model.arch=bert",
        "model.pretrained=",
        f"data.dir={data_dir}",
        "data.raw=",
        "data.tokenizer=",
        "data.vocab_size=2048",
        "data.val_fraction=0.05",
        "data.shard_tokens=200000",
        "run.seed=1337",
    )
    assert "WordPiece tokenizer" in proc.stdout
    return data_dir


def config(pkg, tmp_path, data_dir, *overrides):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    return pkg.config.load_config(empty, [*BERT, f"data.dir={data_dir}", *overrides])


def launch(cli, data_dir, out, nproc, *overrides):
    return cli(
        "launch",
        "devmachine",
        "--nproc-per-node",
        nproc,
        *BERT,
        f"data.dir={data_dir}",
        f"run.output_dir={out}",
        *overrides,
    )


def read_metrics(out):
    lines = [json.loads(line) for line in (Path(out) / "metrics.jsonl").read_text().splitlines() if line]
    return [r for r in lines if "loss" in r], [r for r in lines if "val_loss" in r]


@pytest.fixture(scope="module")
def ddp_run(tmp_path_factory, cli, bert_data):
    out = tmp_path_factory.mktemp("bert_ddp")
    proc = launch(cli, bert_data, out, 2)
    return out, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def zero3_run(tmp_path_factory, cli, bert_data):
    if importlib.util.find_spec("deepspeed") is None:
        pytest.fail("DeepSpeed is not installed: DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed")
    out = tmp_path_factory.mktemp("bert_zero3")
    proc = launch(cli, bert_data, out, 2, "run.strategy=deepspeed", "deepspeed.zero_stage=3")
    return out, proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory, cli, bert_data):
    out = tmp_path_factory.mktemp("bert_fsdp")
    proc = launch(cli, bert_data, out, 2, "run.strategy=fsdp")
    return out, proc.stdout + proc.stderr


def assert_loss_falls(out, log):
    train, val = read_metrics(out)
    assert [r["step"] for r in train] == STEPS
    losses = [r["loss"] for r in train]
    assert all(math.isfinite(x) for x in losses), losses
    assert losses[0] < math.log(2048) + 0.5  # starts near uniform over the vocabulary
    assert losses[-1] < losses[0] - MARGIN, losses
    assert "2 process(es) on cpu" in log and "micro 4 x accum 2 x 2 data-parallel ranks" in log
    assert [r["step"] for r in val] == [40] and val[0]["val_ppl"] == pytest.approx(math.exp(val[0]["val_loss"]))
    assert "val_bpb" not in val[0] and "val ppl" in log  # bits per byte belongs to the causal models
    return train, val


def test_ddp_two_processes_loss_falls(ddp_run):
    out, log = ddp_run
    assert_loss_falls(out, log)
    assert "strategy ddp" in log
    assert (out / "checkpoints" / "step_00000040.pt").is_file()


def test_zero3_two_processes_loss_falls_as_without_zero(zero3_run, ddp_run):
    out, log = zero3_run
    train, _ = assert_loss_falls(out, log)
    assert "strategy deepspeed ZeRO 3" in log
    assert (out / "checkpoints" / "step_00000040").is_dir()
    # Same data, init and dropout masks: ZeRO-3 only reorders the reductions.
    for got, want in zip(train, read_metrics(ddp_run[0])[0]):
        assert abs(got["loss"] - want["loss"]) < LAYOUT_TOL, (got["step"], got["loss"], want["loss"])


def test_fsdp_shards_bert_layers_and_learns_as_ddp(fsdp_run, ddp_run):
    """FSDP2 shards each of transformers' BertLayers and then the model: the same losses as DDP's
    with dropout on (only the reductions are ordered otherwise), a folder of shards at the end."""
    out, log = fsdp_run
    train, _ = assert_loss_falls(out, log)
    assert "strategy fsdp (FSDP2)" in log
    assert (out / "checkpoints" / "step_00000040" / ".metadata").is_file()
    for got, want in zip(train, read_metrics(ddp_run[0])[0]):
        assert abs(got["loss"] - want["loss"]) < LAYOUT_TOL, (got["step"], got["loss"], want["loss"])


@pytest.fixture(scope="module")
def process_counts(tmp_path_factory, cli, bert_data):
    runs = {}
    for nproc in (1, 4):
        out = tmp_path_factory.mktemp(f"bert_{nproc}proc")
        launch(cli, bert_data, out, nproc, "cluster.gpus_per_node=4")
        runs[nproc] = out
    return runs


@pytest.mark.parametrize("nproc", [2, 4])
def test_processes_give_the_losses_of_one_with_dropout_on(nproc, process_counts, ddp_run):
    many = read_metrics(ddp_run[0] if nproc == 2 else process_counts[nproc])[0]
    one = read_metrics(process_counts[1])[0]
    assert [r["step"] for r in many] == [r["step"] for r in one] == STEPS
    for got, want in zip(many, one):
        assert abs(got["loss"] - want["loss"]) < LAYOUT_TOL, (nproc, got, want)


def test_data_parallel_ranks_draw_different_masks_for_their_samples(pkg, tmp_path, bert_data):
    """The same tokens as the first sample of rank 0 (sequence 0) and of rank 1 (sequence 4): the
    dropout masks differ, so the losses do; the same sequence again gives the same loss."""
    dropout = pkg.module("models.sample_dropout")
    cfg = config(pkg, tmp_path, bert_data)
    torch.manual_seed(0)
    model = pkg.models.build_model(cfg, 2048).train()
    x, y = pkg.module("data.splits").open_split(cfg, bert_data, "val").batch(0, 1)

    def loss(first: int) -> torch.Tensor:
        with dropout.samples(dropout.sample_keys(1337, 0, first, 1)):
            return model(x, y, loss_reduction="none")

    assert not torch.allclose(loss(0), loss(4))
    assert torch.equal(loss(0), loss(0))
    kinds = {type(m).__name__ for m in model.modules() if isinstance(m, torch.nn.Dropout)}
    assert kinds == {"KeyedDropout", "Dropout"}  # Dropout: attention's, whose p the keyed attention reads
    assert model.mlm.config._attn_implementation == pkg.module("models.bert.model").KEYED_ATTENTION


@pytest.mark.parametrize("run", ["ddp_run", "zero3_run", "fsdp_run"])
def test_eval_reports_masked_lm_loss_perplexity_and_accuracy(run, request, cli, bert_data):
    """eval consolidates the checkpoint (a DDP file, ZeRO-3 shards through zero_to_fp32, FSDP2's shards) into one
    process and scores the same validation predictions as training's last evaluation."""
    out, _ = request.getfixturevalue(run)
    proc = cli("eval", *BERT, f"data.dir={bert_data}", f"run.output_dir={out}")
    result = json.loads((out / "eval.json").read_text())
    assert result["step"] == 40 and result["val_tokens"] > 0 and "val_bpb" not in result
    assert result["val_ppl"] == pytest.approx(math.exp(result["val_loss"]), rel=1e-12)
    assert re.search(r"step 40 \| val loss \d+\.\d{4} \| val ppl \d+\.\d{4} \|", proc.stdout), proc.stdout
    trained = read_metrics(out)[1][-1]
    assert abs(result["val_loss"] - trained["val_loss"]) < 1e-5, (result, trained)
    # masked-token accuracy: the share of predicted positions whose top prediction is the label
    assert 0 < result["val_accuracy"] < 1 and result["val_accuracy"] == pytest.approx(trained["val_accuracy"], abs=1e-6)
    assert re.search(r"val accuracy \d\.\d{4}", proc.stdout), proc.stdout


def test_sample_fills_the_mask(ddp_run, cli, bert_data):
    out, _ = ddp_run
    proc = cli(
        "sample",
        "--prompt",
        "Return the [MASK] of the list.",
        "--top-k",
        "3",
        *BERT,
        f"data.dir={bert_data}",
        f"run.output_dir={out}",
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[MASK] 1: ")]
    assert len(lines) == 1, proc.stdout
    guesses = [part.rsplit(" ", 1) for part in lines[0].removeprefix("[MASK] 1: ").split(" | ")]
    probs = [float(p) for _, p in guesses]
    assert len(guesses) == 3 and probs == sorted(probs, reverse=True) and 0 < sum(probs) <= 1.0001
    filled = [line for line in proc.stdout.splitlines() if line.strip()][-1]
    # The prompt, lower-cased by the tokenizer, with the best guess in place of [MASK] ends the output.
    assert filled.startswith("return the") and filled.endswith("of the list.") and "[MASK]" not in filled


def test_sample_refuses_a_prompt_longer_than_the_context(ddp_run, cli, bert_data):
    """BERT reads a prompt whole: past model.sequence_len (64 here) there is no window to slide."""
    out, _ = ddp_run
    prompt = "Return the [MASK] of the list. " + "The list holds values. " * 30
    proc = cli("sample", "--prompt", prompt, *BERT, f"data.dir={bert_data}", f"run.output_dir={out}", expect=1)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: --prompt is "), proc.stderr
    assert "at most 64 (model.sequence_len)" in lines[0] and "shorten the prompt" in lines[0]
    assert "Traceback" not in proc.stdout + proc.stderr


def test_model_contract(pkg, tmp_path, bert_data):
    """forward(ids, labels, 'mean'|'none') against transformers' own loss; counts and FLOPs."""
    cfg = config(pkg, tmp_path, bert_data)
    torch.manual_seed(0)
    model = pkg.models.build_model(cfg, 2048).eval()
    data = pkg.module("data.splits").open_split(cfg, bert_data, "val")
    x, y = data.batch(0, 4)
    predicted = int((y != -100).sum())
    with torch.no_grad():
        mean, per_position = model(x, y), model(x, y, loss_reduction="none")
        reference = model.mlm(input_ids=x, labels=y).loss
        logits = model(x)
    assert per_position.shape == (predicted,) and logits.shape == (4, 64, 2048)
    assert torch.allclose(mean, reference, atol=1e-6) and torch.allclose(per_position.mean(), mean, atol=1e-6)
    no_labels = torch.full_like(y, -100)
    assert model(x, no_labels).item() == 0.0  # nothing to predict: 0, not NaN
    c = model.mlm.config
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size) == (2, 64, 2, 256)
    # The decoder is tied to the word embeddings and counted once.
    assert model.mlm.cls.predictions.decoder.weight is model.mlm.bert.embeddings.word_embeddings.weight
    h, v = 64, 2048
    tables = v * h + 512 * h + 2 * h  # word, position, token type
    layer = 4 * (h * h + h) + (h * 4 * h + 4 * h) + (4 * h * h + h) + 2 * (2 * h)  # attention, MLP, 2 LayerNorms
    head = (h * h + h) + 2 * h + v  # transform, its LayerNorm, the decoder's bias
    assert model.num_params() == tables + 2 * h + 2 * layer + head == 270_400
    attention = 12 * 2 * 2 * 32 * 64  # layers x heads x head_dim x sequence_len
    assert model.flops_per_token() == int(6 * (model.num_params() - tables) + 6 * 0.15 * v * h + attention)


def test_fp8_leaves_the_decoder_the_descriptor_names_in_bf16(pkg, tmp_path, bert_data):
    """run.fp8 converts every linear layer of the sizes fp8 takes but the head the family names
    (output_head: the masked-LM decoder, whose logits feed the loss)."""
    cfg = config(pkg, tmp_path, bert_data, "run.fp8=tensorwise", "run.dtype=bf16", "run.compile=false")
    run = pkg.run_context.resolve_run(cfg, pkg.distributed.one_process(torch.device("cpu")))
    model = pkg.module("strategies.fp8").to_float8(pkg.models.build_model(cfg, 2048), run)
    kinds = {name: type(m).__name__ for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert kinds.pop("mlm.cls.predictions.decoder") == "Linear"
    assert kinds and set(kinds.values()) == {"Float8Linear"}, kinds


def test_masked_batches_are_a_pure_function_of_the_index(pkg, tmp_path, bert_data):
    cfg = config(pkg, tmp_path, bert_data)
    specials = {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "[MASK]": 4}
    open_split = pkg.module("data.splits").open_split  # the family's batches: MaskedTokenData
    rng_before = torch.get_rng_state()
    first, second = (open_split(cfg, bert_data, "train") for _ in range(2))
    assert first.specials == specials
    x, y = first.batch(24, 16)
    assert torch.equal(torch.get_rng_state(), rng_before)  # masking leaves training's RNG stream alone
    x2, y2 = second.batch(24, 16)
    assert torch.equal(x, x2) and torch.equal(y, y2)  # two opens (a resumed run) read the same batch
    for i in range(16):  # row i depends on its index only, not on the batch it is read in
        xi, yi = second.batch(24 + i, 1)
        assert torch.equal(xi[0], x[i]) and torch.equal(yi[0], y[i])
    # Every world size reads the same sequences at a step (data.micro_batch_start) and so the same masks.
    start, step, g, m = pkg.tokens.micro_batch_start, 3, 16, 4
    one = [first.batch(start(step, micro, 0, g, m, 4), m) for micro in range(4)]
    two = [second.batch(start(step, micro, rank, g, m, 2), m) for rank in range(2) for micro in range(2)]
    for a, b in zip(one, two):
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    # The masking itself: [CLS] ... [SEP], 10 of 64 positions predicted in every row (80% [MASK], 10%
    # random, 10% kept), specials never (test_bert_input.py beside it checks the recipe on rows made for it).
    xs, ys = first.batch(0, 200)
    original = torch.stack([torch.from_numpy(first.tokens(i)) for i in range(200)])
    assert (original[:, 0] == 2).all() and (original[:, -1] == 3).all()
    picked = ys != -100
    assert torch.equal(ys[picked], original[picked])
    assert not picked[original <= 4].any()
    k = pkg.module("models.bert.data").predictions_per_sequence(64)
    assert k == 10 and torch.equal(picked.sum(1), (original > 4).sum(1).clamp(max=k))
    as_mask = (xs[picked] == 4).float().mean().item()
    kept = (xs[picked] == original[picked]).float().mean().item()
    assert 0.76 < as_mask < 0.84 and 0.07 < kept < 0.13, (as_mask, kept)
    assert torch.equal(xs[~picked], original[~picked])
    # A second epoch masks the same window anew; validation masks do not depend on run.seed.
    again = first.batch(5 + first.num_sequences, 1)
    assert torch.equal(torch.from_numpy(first.tokens(5 + first.num_sequences)), original[5])
    assert not torch.equal(again[1][0], ys[5])
    other_seed = config(pkg, tmp_path, bert_data, "run.seed=7")
    val_a = open_split(cfg, bert_data, "val").batch(0, 4)
    val_b = open_split(other_seed, bert_data, "val").batch(0, 4)
    assert torch.equal(val_a[1], val_b[1])
    assert not torch.equal(open_split(other_seed, bert_data, "train").batch(0, 4)[1], ys[:4])


@pytest.fixture(scope="module")
def local_model(tmp_path_factory, bert_data):
    """A folder as on an air-gapped cluster: config.json + model.safetensors (save_pretrained) and
    the tokenizer as vocab.txt + tokenizer_config.json, nothing else."""
    from tokenizers import Tokenizer
    from transformers import BertConfig, BertForMaskedLM

    folder = tmp_path_factory.mktemp("local_bert")
    tok = Tokenizer.from_file(str(bert_data / "tokenizer.json"))
    vocab = sorted(tok.get_vocab().items(), key=lambda item: item[1])
    assert [i for _, i in vocab] == list(range(len(vocab)))
    (folder / "vocab.txt").write_text("".join(f"{token}\n" for token, _ in vocab))
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True}))
    torch.manual_seed(3)
    # No dropout, so the first training forward is the saved model's loss exactly; a wide init puts
    # that loss far from any fresh initialisation's ln(2048).
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=128,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        initializer_range=0.2,
    )
    BertForMaskedLM(config).save_pretrained(folder)
    assert (folder / "config.json").is_file() and (folder / "model.safetensors").is_file()
    return folder


def test_prepare_data_takes_the_tokenizer_of_model_pretrained(local_model, bert_data, cli, tmp_path):
    """vocab.txt read through transformers' BertTokenizerFast encodes like the WordPiece tokenizer
    it was written from."""
    from tokenizers import Tokenizer

    data_dir = tmp_path / "data"
    (data_dir / "raw").mkdir(parents=True)
    lines = (bert_data / "raw" / "stdlib_docstrings.jsonl").read_text().splitlines()[:300]
    (data_dir / "raw" / "docs.jsonl").write_text("\n".join(lines) + "\n")
    proc = cli(
        "prepare-data",
        "model.arch=bert",
        f"model.pretrained={local_model}",
        f"data.dir={data_dir}",
        "data.raw=",
        "data.tokenizer=",
        "data.val_fraction=0.1",
    )
    assert f"using the tokenizer of model.pretrained {local_model}" in proc.stdout
    ours = Tokenizer.from_file(str(data_dir / "tokenizer.json"))
    trained = Tokenizer.from_file(str(bert_data / "tokenizer.json"))
    text = "Return the Sorted LIST of [MASK] items, naive cafe."
    assert ours.encode(text, add_special_tokens=False).ids == trained.encode(text, add_special_tokens=False).ids
    assert json.loads((data_dir / "meta.json").read_text())["vocab_size"] == 2048


def test_fine_tune_starts_from_the_local_weights(local_model, pkg, cli, bert_data, tmp_path):
    from transformers import BertForMaskedLM

    out = tmp_path / "run"
    proc = cli(
        "train",
        *BERT,
        f"model.pretrained={local_model}",
        "model.dropout=null",  # the folder's config.json: no dropout, so training's loss is eval's
        "schedule.max_steps=2",
        "schedule.warmup_steps=1",
        "logging.every_steps=1",
        f"data.dir={bert_data}",
        f"run.output_dir={out}",
    )
    reference = BertForMaskedLM.from_pretrained(local_model).eval()
    assert f"{sum(p.numel() for p in reference.parameters()):,} parameters" in proc.stdout
    # The loss of the saved model on step 0's four micro batches (one process: accumulation 4).
    cfg = config(pkg, tmp_path, bert_data, f"model.pretrained={local_model}")
    data = pkg.module("data.splits").open_split(cfg, bert_data, "train")
    with torch.no_grad():
        losses = [
            reference(input_ids=x, labels=y).loss.item()
            for x, y in (data.batch(pkg.tokens.micro_batch_start(0, micro, 0, 16, 4, 4), 4) for micro in range(4))
        ]
    train, _ = read_metrics(out)
    assert [r["step"] for r in train] == [1, 2]
    expected = sum(losses) / 4
    # Not what a fresh initialisation would give (measured 0.50-0.55 away; the corpus follows the
    # installed docstrings). The equality below is the real check.
    assert abs(expected - math.log(2048)) > 0.2
    assert abs(train[0]["loss"] - expected) < 1e-5, (train[0]["loss"], expected)


def test_missing_or_mismatched_pretrained_is_a_one_line_error(cli, bert_data, tmp_path):
    from transformers import BertConfig, BertForMaskedLM

    missing = tmp_path / "nowhere"
    proc = cli(
        "train",
        *BERT,
        f"model.pretrained={missing}",
        f"data.dir={bert_data}",
        f"run.output_dir={tmp_path / 'a'}",
        expect=1,
    )
    assert proc.stderr.startswith("error: model.pretrained=") and str(missing) in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    small = tmp_path / "small"
    BertForMaskedLM(
        BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=1, intermediate_size=32)
    ).save_pretrained(small)
    proc = cli(
        "train",
        *BERT,
        f"model.pretrained={small}",
        f"data.dir={bert_data}",
        f"run.output_dir={tmp_path / 'b'}",
        expect=1,
    )
    assert "vocab_size 100" in proc.stderr and "2048" in proc.stderr and "model.pretrained" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    (small / "model.safetensors").unlink()
    (tmp_path / "c" / "raw").mkdir(parents=True)
    (tmp_path / "c" / "raw" / "a.txt").write_text("Some text to tokenize.")
    proc = cli(
        "prepare-data",
        "model.arch=bert",
        f"model.pretrained={small}",
        f"data.dir={tmp_path / 'c'}",
        "data.raw=",
        "data.tokenizer=",
        expect=1,
        timeout=60,
    )
    assert proc.stderr.startswith("error: model.pretrained=") and "no weights" in proc.stderr


@pytest.mark.parametrize("run", ["ddp_run", "zero3_run", "fsdp_run"])
def test_export_is_bert_for_masked_lm_with_our_logits(run, request, bert_data, export, cli, pkg, cfg_with):
    """DDP's file, ZeRO-3's and FSDP2's shards export a plain BertForMaskedLM (transformers' own attention)
    whose logits are ours, with the WordPiece tokenizer and its [MASK]."""
    from test_export import assert_same_logits, ours_and_theirs
    from transformers import AutoTokenizer

    out, _ = request.getfixturevalue(run)
    folder = export(bert_data, out, *BERT)
    overrides = [*BERT, f"data.dir={bert_data}", f"run.output_dir={out}", "run.device=cpu", "run.dtype=fp32"]
    model, hf, cfg = ours_and_theirs(pkg, cfg_with, overrides, folder)
    assert type(hf).__name__ == "BertForMaskedLM"
    assert_same_logits(model, hf, hf.config.vocab_size, cfg.model.sequence_len)
    tok = AutoTokenizer.from_pretrained(str(folder))
    ids = tok("the [MASK] reads")["input_ids"]
    assert ids[0] == tok.cls_token_id and ids[-1] == tok.sep_token_id and tok.mask_token_id in ids
