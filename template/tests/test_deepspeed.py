"""run.strategy=deepspeed on CPU: real DeepSpeed (ZeRO 0-3, offload) under real torchrun with Gloo.

    python -m pytest -q tests/test_deepspeed.py     # about 60 s; the first DeepSpeed run on a
                                                    # machine compiles a shared-memory op (~1 min more)

The ZeRO runs train the first 10 of the 30 steps of the shared DDP runs (conftest run_2proc,
run_1proc): with min_lr_ratio=1.0 the schedule does not depend on max_steps, so every logged loss
must match DDP's at the same step. fp32 on CPU; only the reduction order differs (reduce-scatter of
flat buffers instead of DDP's bucketed all-reduce). Measured: logged losses equal to the last bit at
steps 5, 10 and 15, gradient norms within 1.2e-6; checked at 1e-5 to leave room for other CPUs.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

STAGES = (0, 1, 2, 3)
# name -> overrides of each 2-process run; "offload" is ZeRO 3 with optimizer state and weights on the host.
RUNS = {**{f"zero{stage}": [f"deepspeed.zero_stage={stage}"] for stage in STAGES},
        "offload": ["deepspeed.zero_stage=3", "deepspeed.offload_optimizer=true", "deepspeed.offload_params=true"]}
TOL = 1e-5  # absolute, on losses of ~7.6 nats


@pytest.fixture(scope="module", autouse=True)
def _deepspeed_installed():
    if importlib.util.find_spec("deepspeed") is None:
        pytest.fail("DeepSpeed is not installed: DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed")


@pytest.fixture(scope="module")
def zero_runs(tmp_path_factory, cli, demo_data, train):
    """Steps 1-10 with 2 processes for each of RUNS (checkpoint at 10); ZeRO 3 then resumes to 15."""
    runs = {}
    for name, overrides in RUNS.items():
        out = tmp_path_factory.mktemp(name)
        proc = train(cli, demo_data, out, 2, "run.strategy=deepspeed", *overrides, "schedule.max_steps=10")
        runs[name] = (out, proc.stdout + proc.stderr)
    out = runs["zero3"][0]
    resumed = train(cli, demo_data, out, 2, "run.strategy=deepspeed", "deepspeed.zero_stage=3", "schedule.max_steps=15")
    return runs, resumed.stdout + resumed.stderr


def _losses(records, upto):
    return {r["step"]: r for r in records if r["step"] <= upto}


def test_zero_stages_match_ddp_and_one_process(zero_runs, run_2proc, run_1proc, metrics):
    runs, _ = zero_runs
    ddp2, ddp1 = _losses(metrics(run_2proc[0])[0], 10), _losses(metrics(run_1proc[0])[0], 10)
    assert "offload optimizer+params to cpu" in runs["offload"][1]
    for stage in RUNS:
        out, log = runs[stage]
        assert f"strategy deepspeed ZeRO {stage[-1] if stage != 'offload' else 3}" in log
        assert "micro 4 x accum 2 x 2 ranks" in log
        train, val = metrics(out)
        got = _losses(train, 10)
        assert sorted(got) == [5, 10], (stage, sorted(got))
        for step, r in got.items():
            for ref in (ddp2[step], ddp1[step]):
                assert abs(r["loss"] - ref["loss"]) < TOL, (stage, step, r["loss"], ref["loss"])
                assert abs(r["grad_norm"] - ref["grad_norm"]) < TOL * max(1.0, ref["grad_norm"]), (stage, step)
                assert r["lr"] == pytest.approx(ref["lr"], rel=1e-12)
        assert val[0]["step"] == 10 and val[0]["val_loss"] > 0  # eval runs on the engine's module


def test_deepspeed_config_is_derived_from_train_yaml(zero_runs):
    runs, _ = zero_runs
    for stage in STAGES:
        ds = json.loads((runs[f"zero{stage}"][0] / "deepspeed_config.json").read_text())
        assert ds["train_micro_batch_size_per_gpu"] == 4 and ds["gradient_accumulation_steps"] == 2
        assert ds["train_batch_size"] == 4 * 2 * 2 == 16  # micro x accum x world = global_batch_size
        assert ds["zero_optimization"]["stage"] == stage
        assert ds["gradient_clipping"] == 1.0 and ds["bf16"]["enabled"] is False  # fp32 on CPU
        assert ds["optimizer"]["params"]["torch_adam"] is True and "scheduler" not in ds


def test_zero3_resume_continues_at_the_saved_step(zero_runs, run_2proc, metrics):
    runs, log = zero_runs
    out = runs["zero3"][0]
    assert f"resumed from {out / 'checkpoints' / 'step_00000010'} at step 10" in log
    assert "steps 10->15" in log
    ckpts = sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step_"))
    assert ckpts == ["step_00000010", "step_00000015"]
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_00000015"
    train, _ = metrics(out)
    assert [r["step"] for r in train] == [5, 10, 15]  # appended after the first run's records
    ddp = {r["step"]: r for r in metrics(run_2proc[0])[0]}
    assert abs(train[-1]["loss"] - ddp[15]["loss"]) < TOL, (train[-1]["loss"], ddp[15]["loss"])


def test_keep_last_prunes_deepspeed_folders(tmp_path, pkg):
    """The pruning and `latest` logic of the DeepSpeed strategy on plain folders (no training)."""
    ds = pkg.module("strategies.deepspeed")
    folder = tmp_path / "checkpoints"
    for step in (5, 10, 15):
        (folder / f"step_{step:08d}").mkdir(parents=True)
    (folder / "step_00000007.pt").write_text("a DDP file is not a DeepSpeed checkpoint")
    assert ds.find_latest(folder) == folder / "step_00000015"  # no `latest` file: the highest step
    (folder / "latest").write_text("step_00000010")
    assert ds.find_latest(folder) == folder / "step_00000010"


def test_inconsistent_batch_is_refused_naming_the_fields(cli, demo_data, tmp_path, train_overrides):
    proc = cli("train", *train_overrides, "run.strategy=deepspeed", "batch.grad_accum_steps=3",
               f"data.dir={demo_data}", f"run.output_dir={tmp_path}", expect=None)
    assert proc.returncode != 0
    err = proc.stdout + proc.stderr
    assert "batch.global_batch_size=16" in err and "grad_accum_steps 3" in err and "Traceback" not in err
    assert not (tmp_path / "deepspeed_config.json").exists()


def test_offload_and_stage_settings(pkg, tmp_path):
    cfg_mod, ds = pkg.config, pkg.module("strategies.deepspeed")
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    cfg = cfg_mod.load_config(empty, ["run.strategy=deepspeed", "deepspeed.zero_stage=3", "deepspeed.offload_optimizer=true",
                                      "deepspeed.offload_params=true", "batch.global_batch_size=64", "batch.micro_batch_size=2"])
    import torch

    d = ds.deepspeed_config(cfg, accum=4, world_size=8, device=torch.device("cpu"))
    assert d["train_batch_size"] == 2 * 4 * 8 == cfg.batch.global_batch_size
    assert d["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    assert d["zero_optimization"]["offload_param"]["device"] == "cpu"
    for bad, words in ((["deepspeed.zero_stage=4"], "deepspeed.zero_stage=4"),
                       (["deepspeed.offload_params=true", "deepspeed.zero_stage=2"], "deepspeed.offload_params"),
                       (["run.strategy=fsdp"], "run.strategy")):
        with pytest.raises(cfg_mod.ConfigError, match=words):
            cfg_mod.load_config(empty, bad)
