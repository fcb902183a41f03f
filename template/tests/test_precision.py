"""Precision (precision.py): run.dtype resolved per GPU, plan and check on a V100, and fp16 with
loss scaling under DDP on CPU, where torch has fp16 autocast and a GradScaler too (run.dtype=fp16 is
honoured on a CPU). An overflow is injected with TRAIN_FAULT_OVERFLOW (faults.py): it multiplies a
step's loss by inf, as a loss scale too large for fp16 would make its gradients.

    python -m pytest -q tests/test_precision.py      # about a minute: three short CPU runs
"""

from __future__ import annotations

import json
import os
import signal

import pytest
import torch
from conftest import TRAIN_OVERRIDES
from test_faults import SLOW, launch_args, rank_pids, same_numbers, wait_for

FP16 = "run.dtype=fp16"
OVERFLOW_AT = "3"  # 0-based index of the step whose gradients overflow: the 4th step
SCALED = ("loss_scale", "skipped")


# --- resolution --------------------------------------------------------------------------------------


def test_auto_picks_bf16_fp16_or_fp32_by_device(pkg):
    resolve = pkg.precision.resolve
    assert resolve("auto", on_gpu=True, gpu_has_bf16=True, gpu_name="NVIDIA H100") == "bf16"
    assert resolve("auto", on_gpu=True, gpu_has_bf16=False, gpu_name="Tesla V100") == "fp16"
    assert resolve("auto", on_gpu=False, gpu_has_bf16=False, gpu_name="cpu") == "fp32"
    for asked in ("fp16", "fp32"):
        assert resolve(asked, on_gpu=True, gpu_has_bf16=False, gpu_name="Tesla V100") == asked
    assert resolve("fp16", on_gpu=False, gpu_has_bf16=False, gpu_name="cpu") == "fp16"  # the tests' path
    assert resolve("bf16", on_gpu=False, gpu_has_bf16=False, gpu_name="cpu") == "bf16"  # emulated, as before
    with pytest.raises(pkg.config.ConfigError) as refused:
        resolve("bf16", on_gpu=True, gpu_has_bf16=False, gpu_name="Tesla V100-SXM2-16GB (compute capability 7.0)")
    message = str(refused.value)
    assert "\n" not in message and refused.value.key == "run.dtype"
    assert "Tesla V100-SXM2-16GB (compute capability 7.0) has no bf16" in message
    assert "run.dtype=fp16" in message and "run.dtype=auto" in message


def test_autocast_follows_the_resolved_precision_on_cpu(pkg):
    dist, cpu = pkg.distributed, torch.device("cpu")
    x = torch.randn(4, 4)
    for dtype, expected in (("auto", torch.float32), ("fp32", torch.float32), ("fp16", torch.float16)):
        precision = dist.resolve_precision(cpu, dtype)
        assert precision == ("fp32" if dtype == "auto" else dtype)
        with dist.autocast_context(cpu, precision):
            assert (x @ x).dtype == expected, dtype


def test_the_gpu_table_says_which_gpus_have_bf16(pkg):
    gpus = pkg.gpus
    v100, memory = gpus.find_answer("v100-16gb")
    assert memory == 16 and not v100.has_bf16 and v100.peaks == {"fp16": 125e12}
    assert v100.peak("fp16") == v100.peak("fp32") == v100.peak() == 125e12
    a100, _ = gpus.find_answer("a100-80gb")
    assert a100.has_bf16 and a100.peak("bf16") == a100.peak("fp16") == 312e12
    # Every GPU a project can be generated for, except the V100, has bf16.
    lacking = {answer for gpu in gpus.GPUS for answer in gpu.answers if not gpu.has_bf16}
    assert lacking == {"v100-16gb", "v100-32gb"}
    assert gpus.peak_for_device_name("Tesla V100-SXM2-32GB", "fp16") == 125e12


# --- plan and check on a V100 ------------------------------------------------------------------------


@pytest.fixture
def v100(tmp_path):
    """plan/check arguments: the dataclass defaults (1 x 8 GPUs) with a small model on V100 32GB, then extra."""
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    return lambda *extra: [
        "--config",
        empty,
        "cluster.gpu_type=v100-32gb",
        "model.size=tiny",
        "model.sequence_len=256",
        *extra,
    ]


def test_plan_on_a_v100_uses_fp16_and_its_peak(pkg, cli, v100, tmp_path):
    auto = json.loads(cli("plan", "--json", "--mfu", "0.5", *v100()).stdout)
    assert auto["precision"] == "fp16" and auto["peak_flops"] == 125e12 and auto["fits"]
    cfg = pkg.config.load_config(tmp_path / "empty.yaml", ["cluster.gpu_type=v100-32gb", "model.size=tiny"])
    shape = pkg.family.model_shape("tiny", None, cfg.model.arch)
    flops = auto["tokens"] * pkg.estimates.flops_per_token(shape, cfg.data.vocab_size, 256, cfg.model.arch)
    assert auto["time"][0]["hours"] == pytest.approx(flops / (cfg.cluster.gpus_per_node * 125e12 * 0.5) / 3600)
    table = cli("plan", *v100()).stdout
    assert "of the 125 TFLOP/s dense fp16 peak per GPU" in table
    # fp16 takes the bytes bf16 takes: the same memory figures as on an A100 with bf16.
    a100 = json.loads(cli("plan", "--json", *v100("cluster.gpu_type=a100-40gb")).stdout)
    assert a100["precision"] == "bf16" and a100["peak_flops"] == 312e12
    assert a100["memory"]["weights"] == auto["memory"]["weights"]
    assert a100["memory"]["activations"] == auto["memory"]["activations"]
    assert "in fp16 (`plan` for the details)" in cli("check", *v100()).stdout


def test_bf16_on_a_v100_is_refused_with_the_fix(cli, v100):
    plan = cli("plan", *v100("run.dtype=bf16"), expect=1)
    assert "verdict: refused by the rules: run.dtype=bf16 but the V100 of cluster.gpu_type=v100-32gb has no bf16" in (
        plan.stdout
    )
    assert "set run.dtype=fp16 (loss-scaled) or run.dtype=auto" in plan.stdout
    check = cli("check", *v100("run.dtype=bf16"), expect=1)
    problems = [line for line in check.stderr.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and "V100 of cluster.gpu_type=v100-32gb has no bf16" in problems[0]
    assert "run.dtype=fp16" in problems[0] and "Traceback" not in check.stderr
    cli("check", *v100("run.dtype=fp16"))  # what the fix says passes


@pytest.mark.part("deepspeed")
def test_fp16_at_zero_stage_0_is_refused_where_it_would_run(cli, v100):
    """DeepSpeed scales no loss at ZeRO 0 under fp16: refused for a V100 (auto) and for run.dtype=fp16."""
    ds = ["run.strategy=deepspeed", "deepspeed.zero_stage=0"]
    plan = cli("plan", *v100(*ds), expect=1)
    assert (
        "run.dtype=auto trains in fp16 on the V100 of cluster.gpu_type=v100-32gb (no bf16)" in plan.stdout
        and "use deepspeed.zero_stage=1" in plan.stdout
    )
    quiet = cli("check", "--quiet", *v100(*ds), expect=1).stderr  # copier's task: `auto` judged for the V100
    assert quiet.startswith("refused: run.dtype=auto trains in fp16 on the V100") and len(quiet.splitlines()) == 1
    assert json.loads(cli("plan", "--json", *v100(*ds, "cluster.gpu_type=h100-80gb")).stdout)["fits"]
    check = cli("check", *v100(*ds, "cluster.gpu_type=h100-80gb", FP16), expect=1)
    assert "run.dtype=fp16 with deepspeed.zero_stage=0: DeepSpeed's fp16 without ZeRO" in check.stderr
    cli("check", *v100("run.strategy=deepspeed", "deepspeed.zero_stage=1"))


# --- fp16 under DDP on CPU -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def run_fp16(once, cli, demo_data):
    """The 30 steps of run_2proc in fp16 with 2 processes; step 4's gradients overflow."""

    def train_in_fp16(out):
        proc = cli(*launch_args(demo_data, out, 2, FP16), env={"TRAIN_FAULT_OVERFLOW": OVERFLOW_AT})
        return proc.stdout + proc.stderr

    return once("run_fp16", train_in_fp16)


def test_two_processes_train_in_fp16_and_log_the_loss_scale(run_fp16, run_2proc, metrics):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, log = run_fp16
    train, val = metrics(out)
    assert "2 process(es) on cpu" in log and "| precision fp16" in log
    assert [r["step"] for r in train] == [5, 10, 15, 20, 25, 30]
    assert train[-1]["loss"] < train[0]["loss"] - 0.3, [r["loss"] for r in train]
    # One skipped step (the injected overflow) halved the first scale, 2**16; no growth within 30 steps.
    assert [(r["loss_scale"], r["skipped"]) for r in train] == [(2.0**15, 1)] * 6
    assert "step      5/30 | loss" in log and "loss scale 32768, 1 skipped" in log
    # fp16 is not fp32, and one step fewer was taken: the fp32 run's final loss, give or take (measured 0.006).
    reference = {r["step"]: r["loss"] for r in metrics(run_2proc[0])[0]}
    assert abs(train[-1]["loss"] - reference[30]) < 0.05 and train[0]["loss"] != reference[5]
    assert val[-1]["val_loss"] > 0
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    assert [e.value for e in acc.Scalars("loss_scale")] == [2.0**15] * 6
    assert [e.value for e in acc.Scalars("skipped")] == [1] * 6


def test_an_overflow_is_skipped_and_counted_and_leaves_the_weights(cli, demo_data, tmp_path):
    """Checkpoints after steps 1, 2 and 3; step 2's gradients overflow: its checkpoint holds the
    weights and optimizer state of step 1, the halved scale and the count; step 3 updates again."""
    out = tmp_path / "run"
    args = [
        *TRAIN_OVERRIDES,
        FP16,
        f"data.dir={demo_data}",
        f"run.output_dir={out}",
        "schedule.max_steps=3",
        "schedule.warmup_steps=1",
    ]
    every_step = ["checkpoint.every_steps=1", "logging.every_steps=1"]
    proc = cli("train", *args, *every_step, env={"TRAIN_FAULT_OVERFLOW": "1"})
    assert "fault injection: the gradients of step 1 overflow" in proc.stderr
    one, two, three = (torch.load(out / "checkpoints" / f"step_0000000{s}.pt", weights_only=False) for s in (1, 2, 3))
    assert [c["grad_scaler"]["scale"] for c in (one, two, three)] == [2.0**16, 2.0**15, 2.0**15]
    assert [c["skipped_steps"] for c in (one, two, three)] == [0, 1, 1]
    for name, tensor in one["model"].items():
        assert torch.equal(two["model"][name], tensor), name
    assert any(not torch.equal(three["model"][n], t) for n, t in two["model"].items())
    first, second = one["optimizer"]["state"], two["optimizer"]["state"]
    assert first.keys() == second.keys() and first
    for key, state in first.items():
        assert torch.equal(second[key]["step"], state["step"]) and torch.equal(second[key]["exp_avg"], state["exp_avg"])
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in records if "loss" in r]
    assert [(r["step"], r["skipped"], r["loss_scale"]) for r in train] == [
        (1, 0, 2.0**16),
        (2, 1, 2.0**15),
        (3, 1, 2.0**15),
    ]
    assert not torch.isfinite(torch.tensor(train[1]["grad_norm"]))  # the norm tells which step overflowed


def test_a_killed_fp16_rank_resumes_bit_for_bit(cli, demo_data, run_fp16, metrics, tmp_path):
    """As test_faults' kill test, in fp16 with the overflow before the checkpoint of step 10: the
    resumed ranks continue at scale 2**15 with one skipped step (the scaler's state from the
    checkpoint), and every logged number equals the uninterrupted run's."""
    out, log = tmp_path / "run", tmp_path / "log"
    env = {**SLOW, "TRAIN_FAULT_OVERFLOW": OVERFLOW_AT}
    proc = cli.start(*launch_args(demo_data, out, 2, FP16), log=log, env=env)
    try:
        wait_for(
            lambda: (out / "checkpoints" / "step_00000010.pt").exists() and len(rank_pids(out)) == 2,
            "checkpoint of step 10",
            proc,
            log,
        )
        os.kill(rank_pids(out)[1], signal.SIGKILL)
        assert proc.wait(timeout=240) == 0, log.read_text()[-4000:]
    finally:
        cli.stop(proc)
    assert "resumed from" in log.read_text()
    got, want = metrics(out)[0], metrics(run_fp16[0])[0]
    assert [r["step"] for r in got] == [r["step"] for r in want]
    assert same_numbers(got) == same_numbers(want)
    assert [{k: r[k] for k in SCALED} for r in got] == [{k: r[k] for k in SCALED} for r in want]
