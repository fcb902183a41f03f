"""model.arch=gpt3 layouts on CPU: real DeepSpeed pipeline engine and tensor-parallel layers under torchrun.

    python -m pytest -q src/<package>/models/gpt3/tests/test_gpt3.py      # about 1-2 min on two cores

Every layout seeds layer i with run.seed + i, so all of them start from the same weights and see
the same global batches: pipeline 2, tensor 2 and pipeline 2 x data 2 must reproduce the
one-process run, with dropout on (model.dropout=0.1 and model.attention_dropout=0.1, Megatron's
hidden and attention dropout: their masks are keyed by the sample, models/sample_dropout.py). Measured (fp32, Gloo): logged losses equal to ~1e-7,
gradient norms to ~3e-7; checked at 1e-5 (only the order of the reductions differs between layouts).
"""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from test_host_syncs import assert_no_syncs_between_logging_steps, count_syncs

pytestmark = pytest.mark.part("gpt3")  # collected where the project holds it (conftest.py)

TOL = 1e-5
# What torch prints when a backward passes through a collective autograd never recorded a gradient
# for (DeepSpeed's broadcast of the tied embedding, when done under grad mode: strategies/deepspeed/pipeline.py).
UNRECORDED_GRADIENT = "an autograd kernel was not registered"
COMMON = [
    "model.arch=gpt3",
    "model.dropout=0.1",
    "model.attention_dropout=0.1",
    "run.strategy=deepspeed",
    "deepspeed.zero_stage=1",
    "schedule.max_steps=10",
    "checkpoint.every_steps=5",
]
LAYOUTS = {  # name -> (processes, overrides)
    "pipeline2": (2, ["parallel.pipeline=2", "parallel.tensor=1"]),
    "tensor2": (2, ["parallel.pipeline=1", "parallel.tensor=2"]),
    "tensor2-pipeline2": (4, ["parallel.pipeline=2", "parallel.tensor=2"]),
    # ZeRO 0 in fp32: the engine neither clips nor gives a norm; the strategy clips by the whole model's
    "tensor2-pipeline2-zero0": (4, ["parallel.pipeline=2", "parallel.tensor=2", "deepspeed.zero_stage=0"]),
    # Recomputing the blocks in backward must not change a single number either.
    "pipeline2-checkpointed": (2, ["parallel.pipeline=2", "parallel.tensor=1", "model.activation_checkpointing=true"]),
}


@pytest.fixture(scope="module", autouse=True)
def _deepspeed_installed():
    if importlib.util.find_spec("deepspeed") is None:
        pytest.fail("DeepSpeed is not installed: DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed")


@pytest.fixture(scope="module")
def reference(tmp_path_factory, cli, demo_data, train):
    """One process, no pipeline engine: the plain GPT3 module under DDP's code path."""
    out = tmp_path_factory.mktemp("gpt3_one")
    train(
        cli,
        demo_data,
        out,
        1,
        "model.arch=gpt3",
        "model.dropout=0.1",
        "model.attention_dropout=0.1",
        "run.strategy=ddp",
        "parallel.pipeline=1",
        "parallel.tensor=1",
        "schedule.max_steps=10",
        "checkpoint.every_steps=5",
        "cluster.gpus_per_node=2",
    )
    return out


@pytest.fixture(scope="module")
def layout_runs(tmp_path_factory, cli, demo_data, train):
    runs = {}
    for name, (nproc, overrides) in LAYOUTS.items():
        out = tmp_path_factory.mktemp(name)
        proc = train(cli, demo_data, out, nproc, *COMMON, *overrides, "cluster.gpus_per_node=4")
        runs[name] = (out, proc.stdout + proc.stderr)
    return runs


def _assert_same(records, expected):
    assert [r["step"] for r in records] == [r["step"] for r in expected]
    for got, want in zip(records, expected):
        assert abs(got["loss"] - want["loss"]) < TOL, (got, want)
        assert abs(got["grad_norm"] - want["grad_norm"]) < TOL, (got, want)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_one_process(name, layout_runs, reference, metrics):
    out, log = layout_runs[name]
    assert "DeepSpeed pipeline engine" in log, log[-3000:]
    assert UNRECORDED_GRADIENT not in log, log[-3000:]
    train_records, val_records = metrics(out)
    ref_train, ref_val = metrics(reference)
    _assert_same(train_records, ref_train)
    assert abs(val_records[-1]["val_loss"] - ref_val[-1]["val_loss"]) < TOL


def test_fsdp_trains_gpt3_as_one_process(tmp_path, cli, demo_data, train, reference, metrics):
    """gpt3 without a tensor or pipeline layout under FSDP2 (two processes): each block sharded, the
    tied embedding and head in the model's own unit; the one-process run, dropout on."""
    out = tmp_path / "fsdp"
    proc = train(
        cli,
        demo_data,
        out,
        2,
        *[o for o in COMMON if not o.startswith(("run.strategy", "deepspeed."))],
        "run.strategy=fsdp",
        "parallel.pipeline=1",
        "parallel.tensor=1",
        "cluster.gpus_per_node=2",
    )
    assert "FSDP2" in proc.stdout, proc.stdout[-3000:]
    train_records, val_records = metrics(out)
    ref_train, ref_val = metrics(reference)
    _assert_same(train_records, ref_train)
    assert abs(val_records[-1]["val_loss"] - ref_val[-1]["val_loss"]) < TOL


def test_tensor_parallel_shards_the_matrices(layout_runs, pkg):
    """Each tensor rank saved half of every block matrix; the embedding is whole on both."""
    out, _ = layout_runs["tensor2"]
    ckpt = out / "checkpoints" / "step_00000010"
    rank0 = torch.load(ckpt / "layer_01-model_00-model_states.pt", map_location="cpu", weights_only=False)
    rank1 = torch.load(ckpt / "layer_01-model_01-model_states.pt", map_location="cpu", weights_only=False)
    width = rank0["ln1.weight"].numel()
    assert rank0["qkv.weight"].shape == (3 * width // 2, width)
    assert rank0["fc2.weight"].shape == (width, 2 * width)  # row parallel: half of the 4h inputs
    assert not torch.equal(rank0["qkv.weight"], rank1["qkv.weight"])
    embed0 = torch.load(ckpt / "layer_00-model_00-model_states.pt", map_location="cpu", weights_only=False)
    embed1 = torch.load(ckpt / "layer_00-model_01-model_states.pt", map_location="cpu", weights_only=False)
    assert torch.equal(embed0["wte.weight"], embed1["wte.weight"])


def test_pipeline_resume_continues_exactly(tmp_path, cli, demo_data, train, layout_runs, metrics):
    """Steps 6-10 from the pipeline's step-5 checkpoint equal the uninterrupted run's."""
    out, _ = layout_runs["pipeline2"]
    resumed = tmp_path / "resumed"
    (resumed / "checkpoints").mkdir(parents=True)
    import shutil

    shutil.copytree(out / "checkpoints" / "step_00000005", resumed / "checkpoints" / "step_00000005")
    (resumed / "checkpoints" / "latest").write_text("step_00000005")
    proc = train(cli, demo_data, resumed, 2, *COMMON, *LAYOUTS["pipeline2"][1], "cluster.gpus_per_node=2")
    assert "resumed from" in proc.stdout + proc.stderr
    assert UNRECORDED_GRADIENT not in proc.stdout + proc.stderr  # loading broadcasts the tied embedding again
    got, _ = metrics(resumed)
    want = [r for r in metrics(out)[0] if r["step"] > 5]
    _assert_same(got, want)


def _from_step_5(layout: str, layout_runs, tmp_path):
    """A run folder holding only the step-5 checkpoint of one of layout_runs."""
    import shutil

    out = tmp_path / "resumed"
    shutil.copytree(layout_runs[layout][0] / "checkpoints" / "step_00000005", out / "checkpoints" / "step_00000005")
    (out / "checkpoints" / "latest").write_text("step_00000005")
    return out


# Resizing the pipeline engine's ZeRO-1 runs through DeepSpeed's universal format: another data-parallel
# size, tensor shards joined (2 -> 1) and split (1 -> 2); steps 6-10 must still be the one-process run's.
RESHAPES = {  # name -> (checkpoint of, processes, layout after)
    "pipeline2-to-data2": ("pipeline2", 4, "pipeline2"),
    "tensor2-pipeline2-to-pipeline2": ("tensor2-pipeline2", 2, "pipeline2"),
    "pipeline2-to-tensor2-pipeline2": ("pipeline2", 4, "tensor2-pipeline2"),
}


@pytest.mark.parametrize("name", list(RESHAPES))
def test_a_pipeline_checkpoint_continues_on_another_layout(
    name, tmp_path, cli, demo_data, train, layout_runs, reference, metrics
):
    source, processes, after = RESHAPES[name]
    out = _from_step_5(source, layout_runs, tmp_path)
    proc = train(
        cli,
        demo_data,
        out,
        processes,
        *COMMON,
        *LAYOUTS[after][1],
        "checkpoint.reshard=true",
        "cluster.gpus_per_node=4",
    )
    log = proc.stdout + proc.stderr
    assert f"converting {out / 'checkpoints' / 'step_00000005'} to DeepSpeed's universal checkpoint format" in log
    assert "resumed from" in log and UNRECORDED_GRADIENT not in log
    got, _ = metrics(out)
    _assert_same(got, [r for r in metrics(reference)[0] if r["step"] > 5])


def test_a_layout_change_that_cannot_be_split_again_is_refused_naming_what_continues_it(
    tmp_path, cli, demo_data, train, layout_runs
):
    """Refused before the engine loads anything: the pipeline engine's checkpoint for the plain strategy
    (tensor x pipeline = 1, other weight names), and one that does not record its shared weights."""
    out = _from_step_5("tensor2", layout_runs, tmp_path)
    plain = ["parallel.pipeline=1", "parallel.tensor=1", "checkpoint.reshard=true", "cluster.gpus_per_node=1"]
    refused = train(cli, demo_data, out, 1, *COMMON, *plain, expect=None)
    assert refused.returncode != 0
    assert "written with parallel.tensor=2 parallel.pipeline=1 (2 processes)" in refused.stderr, refused.stderr[-2000:]
    assert "run with parallel.tensor=2 parallel.pipeline=1 on any multiple of 2 processes" in refused.stderr
    for states in (out / "checkpoints" / "step_00000005").glob("mp_rank_*_model_states.pt"):
        saved = torch.load(states, map_location="cpu", weights_only=False)
        del saved["universal_checkpoint_info"]  # as the template's earlier versions wrote them
        torch.save(saved, states)
    (out / "checkpoints" / "step_00000005" / "manifest.json").unlink()  # its hashes no longer hold
    wider = [*COMMON, *LAYOUTS["pipeline2"][1], "checkpoint.reshard=true", "cluster.gpus_per_node=4"]
    old = train(cli, demo_data, out, 4, *wider, expect=None)
    assert old.returncode != 0
    assert "without the record of the weights its stages share" in old.stderr, old.stderr[-2000:]
    assert not (out / "checkpoints" / "universal").exists() and not (out / "checkpoints" / "step_00000010").exists()


def test_pipeline_reads_nothing_from_the_device_between_logging_steps(cli, demo_data, tmp_path):
    """test_host_syncs.py's count on the pipeline engine. DeepSpeed's own reads on every step are those
    of ZeRO 1 (test_host_syncs_deepspeed.py); on its first step the last stage also reads the shapes
    the first one sends it."""
    overrides = [*COMMON, *LAYOUTS["pipeline2"][1], "cluster.gpus_per_node=2"]
    theirs = assert_no_syncs_between_logging_steps(count_syncs(cli, demo_data, tmp_path, 2, *overrides), 2, "deepspeed")
    assert theirs == {rank: [{"_local_scalar_dense deepspeed/runtime/utils.py": 3}] * 4 for rank in (0, 1)}, theirs


def test_layout_rules(cfg_with, pkg):
    """The rules refuse layouts the engines cannot run, naming the field."""
    base = [
        "model.arch=gpt3",
        "model.size=tiny",
        "batch.global_batch_size=16",
        "batch.micro_batch_size=2",
        "run.strategy=deepspeed",
        "deepspeed.zero_stage=1",
        "cluster.gpus_per_node=8",
        "cluster.nodes=1",
    ]
    cases = {
        ("parallel.tensor=3",): "attention heads",  # tiny has 4 heads
        ("parallel.pipeline=3",): "layers",  # and 4 layers
        ("parallel.pipeline=2", "deepspeed.zero_stage=2"): "deepspeed.zero_stage=2",
        ("parallel.tensor=2", "run.strategy=ddp"): "run.strategy=deepspeed",
        ("parallel.tensor=16",): "exceeds cluster.gpus_per_node",
        ("parallel.pipeline=2", "eval.tasks_every_steps=10"): "eval --tasks core` on a checkpoint",
        ("parallel.tensor=2", "run.fp8=rowwise", "cluster.gpu_type=h100-80gb"): "no fp8 path",
    }
    for extra, needle in cases.items():
        problems = pkg.rules.check_config(cfg_with(*base, *extra))
        assert any(needle in p for p in problems), (extra, problems)
    assert pkg.rules.check_config(cfg_with(*base, "parallel.tensor=2", "parallel.pipeline=2")) == []
    fp8_pipeline = ("parallel.pipeline=2", "run.fp8=rowwise", "run.dtype=bf16", "cluster.gpu_type=h100-80gb")
    assert pkg.rules.check_config(cfg_with(*base, *fp8_pipeline)) == []


@pytest.mark.parametrize("name", ["tensor2", "pipeline2"])
def test_eval_consolidates_layout_checkpoints(name, cli, demo_data, layout_runs, metrics):
    """`eval` in one process joins the per-layer, per-tensor-rank files into one model: its
    validation loss is the one training measured on the same batches."""
    out, _ = layout_runs[name]
    proc = cli(
        "eval",
        "model.sequence_len=64",
        "batch.micro_batch_size=4",
        "logging.eval_batches=2",
        f"data.dir={demo_data}",
        f"run.output_dir={out}",
        "run.device=cpu",
    )
    result = json.loads((out / "eval.json").read_text())
    assert result["checkpoint"].endswith("step_00000010"), proc.stdout
    assert abs(result["val_loss"] - metrics(out)[1][-1]["val_loss"]) < TOL


def test_tensor_ranks_draw_one_mask_for_replicated_activations_and_their_own_for_split_ones(pkg):
    """Attention probabilities are split by heads over the tensor ranks: each rank's heads get the
    masks one process draws for those heads (so the ranks differ); the block's outputs, replicated
    on every tensor rank, get one mask whatever the rank."""
    gpt3 = pkg.module("models.gpt3.model")
    dropout = pkg.module("models.sample_dropout")
    config = gpt3.GPT3Config(vocab_size=64, sequence_len=8, n_layer=1, n_embd=32, n_head=4, dropout=0.5)
    probs = torch.ones(2, 4, 8, 8)
    hidden = torch.ones(2, 8, 32)
    with dropout.samples(dropout.sample_keys(1337, 0, 0, 2)):
        whole = dropout.keyed_dropout(probs, 0.5, 1, True, (1, 0, 4))
        shards = [dropout.keyed_dropout(probs[:, 2 * r : 2 * r + 2], 0.5, 1, True, (1, 2 * r, 4)) for r in (0, 1)]
        replicated = [dropout.keyed_dropout(hidden, 0.5, 2, True) for _ in (0, 1)]
    assert torch.equal(torch.cat(shards, dim=1), whole)
    assert not torch.equal(shards[0], shards[1])
    assert torch.equal(replicated[0], replicated[1])
    block = gpt3.Block(config, 0)
    assert (block.n_head, block.head_offset) == (4, 0)  # strategies/deepspeed/tensor_parallel.py sets a shard's offset


@pytest.fixture(scope="module")
def reference_export(reference, demo_data, export):
    return export(demo_data, reference, "model.arch=gpt3", "model.sequence_len=64")


def test_gpt3_export_is_gpt2_with_our_logits_and_greedy_tokens(
    reference_export, reference, demo_data, cli, pkg, cfg_with
):
    from test_export import assert_greedy_like_sample, assert_same_logits, ours_and_theirs

    overrides = [
        "model.arch=gpt3",
        "model.size=tiny",
        "model.sequence_len=64",
        "parallel.tensor=1",
        "parallel.pipeline=1",
        f"data.dir={demo_data}",
        f"run.output_dir={reference}",
        "run.device=cpu",
        "run.dtype=fp32",
    ]
    model, hf, cfg = ours_and_theirs(pkg, cfg_with, overrides, reference_export)
    assert type(hf).__name__ == "GPT2LMHeadModel"
    assert hf.num_parameters() == model.num_params()
    assert_same_logits(model, hf, hf.config.vocab_size, cfg.model.sequence_len)
    assert_greedy_like_sample(cli, hf, reference_export, overrides)


@pytest.mark.parametrize("name", ["tensor2-pipeline2", "pipeline2"])
def test_layout_checkpoints_export_the_weights_of_one_process(name, layout_runs, reference_export, demo_data, export):
    """Files per layer and per tensor rank export the tensors the one-process run trained."""
    out, _ = layout_runs[name]
    exported = export(demo_data, out, "model.arch=gpt3", "model.sequence_len=64", checkpoint="step_00000010")
    export.assert_same_tensors(exported, reference_export, atol=TOL)
