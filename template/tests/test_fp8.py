"""run.fp8 (strategies/fp8.py): the linear layers multiply in fp8 through torchao's float8 training.
On the CPU its matmuls are emulated (the same casts and scales, fp32 arithmetic), so a real
two-process run here checks what a GPU run would do to the numbers: it trains like bf16, keeps the
output head in bf16, and writes a checkpoint a plain model loads. The GPU rules (compute capability
8.9, bf16, compiled) are checked as `check`, `plan` and a rank would state them."""

from __future__ import annotations

import json
import os

import pytest
import torch
from conftest import TRAIN_OVERRIDES, launch_training

FP8_RUN = ["run.dtype=bf16", "schedule.max_steps=12", "logging.every_steps=4", "checkpoint.every_steps=0"]


@pytest.fixture(scope="module")
def bf16_run(cli, demo_data, once):
    return once("bf16_run", lambda out: launch_training(cli, demo_data, out, 2, *FP8_RUN, "run.fp8=off").stdout)[0]


def final_model(pkg, out) -> dict:
    """The weights of the run's last checkpoint (a DDP file or an FSDP2 folder)."""
    trained = pkg.trained_model
    return trained.read_checkpoint(trained.find_checkpoint(out / "checkpoints"))["model"]


@pytest.mark.parametrize(
    "recipe, nproc, strategy", [("tensorwise", 2, "ddp"), ("rowwise", 1, "ddp"), ("tensorwise", 2, "fsdp")]
)
def test_fp8_trains_like_bf16_and_saves_a_plain_models_checkpoint(
    cli, demo_data, tmp_path, metrics, bf16_run, recipe, nproc, strategy, pkg
):
    proc = launch_training(cli, demo_data, tmp_path, nproc, *FP8_RUN, f"run.fp8={recipe}", f"run.strategy={strategy}")
    assert f"precision bf16 + fp8 {recipe} matmuls (torchao) emulated on the CPU" in proc.stdout
    assert "torchao" not in proc.stderr  # its import-time noise (CUDA extensions a CPU torch lacks) stays quiet
    fp8, _ = metrics(tmp_path)
    bf16, _ = metrics(bf16_run)
    assert [r["step"] for r in fp8] == [r["step"] for r in bf16] == [4, 8, 12]
    for ours, reference in zip(fp8, bf16):
        # fp8's 3 mantissa bits move the loss a little; a broken scale or cast moves it a lot.
        assert ours["loss"] == pytest.approx(reference["loss"], rel=0.01), (ours, reference)
        assert ours["loss"] != reference["loss"]  # the matmuls really were fp8
    assert fp8[-1]["loss"] < fp8[0]["loss"]
    state, plain = final_model(pkg, tmp_path), final_model(pkg, bf16_run)
    assert {k: v.shape for k, v in state.items()} == {k: v.shape for k, v in plain.items()}


def test_fp8_leaves_the_head_and_odd_sizes_in_bf16(pkg, cfg_with):
    from importlib import import_module

    fp8 = import_module(f"{pkg.name}.strategies.fp8")
    models = import_module(f"{pkg.name}.models")
    dist = pkg.distributed
    cfg = cfg_with("model.arch=gpt", "model.size=tiny", "run.fp8=tensorwise", "run.dtype=bf16", "run.compile=false")
    run = pkg.run_context.resolve_run(cfg, dist.one_process(torch.device("cpu")))
    model = fp8.to_float8(models.build_model(cfg, 512), run)
    kinds = {name: type(m).__name__ for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    assert kinds.pop("lm_head") == "Linear"
    assert kinds and set(kinds.values()) == {"Float8Linear"}, kinds


@pytest.mark.parametrize(
    "settings, words",
    [
        (["cluster.gpu_type=a100-80gb"], ["run.fp8=tensorwise", "A100", "no fp8 matmuls", "run.fp8=off"]),
        (["cluster.gpu_type=h100-80gb", "run.dtype=fp16"], ["run.fp8=tensorwise", "fp16", "run.dtype=bf16"]),
    ],
)
def test_check_refuses_fp8_where_the_gpu_or_precision_cannot(cli, settings, words):
    proc = cli("check", "run.fp8=tensorwise", *settings, expect=1)
    assert all(w in proc.stderr for w in words), proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_rank_refuses_fp8_uncompiled_or_on_an_older_gpu(pkg):
    """The ranks' own judgement of their device (strategies/fp8.require_fp8 -> precision.fp8_problem)."""
    from importlib import import_module

    problem = import_module(f"{pkg.name}.settings.precision").fp8_problem
    a100 = "NVIDIA A100-SXM4-80GB (compute capability 8.0)"
    args = {"on_gpu": True, "gpu_name": a100}
    assert "A100" in problem("rowwise", "bf16", gpu_has_fp8=False, compiled=True, **args)
    assert "run.compile=true" in problem("rowwise", "bf16", gpu_has_fp8=True, compiled=False, **args)
    assert problem("rowwise", "bf16", gpu_has_fp8=True, compiled=True, **args) is None
    assert problem("off", "fp16", gpu_has_fp8=False, compiled=False, **args) is None


def test_plan_counts_fp8s_speedup(cli, empty_config):
    base = ["plan", "--config", empty_config, "--tokens", "1e10", "cluster.gpu_type=h100-80gb"]
    plain, fp8 = (json.loads(cli(*base, "--json", f"run.fp8={v}").stdout) for v in ("off", "tensorwise"))
    assert plain["time"][0]["hours"] / fp8["time"][0]["hours"] == pytest.approx(1.15)
    assert "1.15x faster with fp8 tensorwise matmuls" in cli(*base, "run.fp8=tensorwise").stdout


def test_fp8_where_torchao_cannot_be_imported_is_one_line_and_no_restart(cli, demo_data, tmp_path):
    """A torchao without torchao.float8 (one from before float8 training, or one another torch broke)
    first on the path: every rank would fail at its import and torchrun restart them into it; instead
    the job ends at its first attempt in one line naming the package and the fixes, nothing saved."""
    site = tmp_path / "site"
    (site / "torchao").mkdir(parents=True)
    (site / "torchao" / "__init__.py").write_text("")
    out = tmp_path / "run"
    args = ["launch", "devmachine", "--nproc-per-node", 2, *TRAIN_OVERRIDES, f"data.dir={demo_data}"]
    args += [f"run.output_dir={out}", *FP8_RUN, "run.fp8=tensorwise", "cluster.max_restarts=3"]
    proc = cli(*args, env={"PYTHONPATH": os.pathsep.join([str(cli.root / "src"), str(site)])}, expect=1)
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    for words in ("run.fp8=tensorwise needs the torchao package", "torchao.float8", "pip install", "run.fp8=off"):
        assert words in lines[0], lines[0]
    assert {p.name for p in (out / "logs").rglob("attempt_*")} == {"attempt_0"}
    assert not (out / "checkpoints").exists() and not (out / "metrics.jsonl").exists()


def test_fsdp_in_bf16_learns_as_ddp_in_bf16(cli, demo_data, tmp_path, metrics, bf16_run):
    """FSDP2 under bf16 gathers the blocks' weights in bf16 and keeps the embeddings, head and scalars
    in fp32 beside the loop's autocast: DDP's numbers but for the blocks' gradients, bf16 until their
    fp32 reduction (measured: within 2.1e-5 of the loss over 12 steps; with the embeddings and
    the residual stream in bf16 too, up to 9.6e-5)."""
    launch_training(cli, demo_data, tmp_path, 2, *FP8_RUN, "run.fp8=off", "run.strategy=fsdp")
    fsdp, _ = metrics(tmp_path)
    ddp, _ = metrics(bf16_run)
    assert [r["step"] for r in fsdp] == [r["step"] for r in ddp] == [4, 8, 12]
    for ours, reference in zip(fsdp, ddp):
        assert abs(ours["loss"] - reference["loss"]) < 6e-5, (ours, reference)
