"""A run that diverges loses nothing (training/divergence.py): a step whose loss or gradient norm is not
finite is not applied, weights and optimizer state alike; optim.max_skipped_steps of them in a row stop
the run with one line naming the newest checkpoint, which holds finite weights, and keep_last's rotation
never reaches the good checkpoints. Real torchrun on CPU; the non-finite gradients come from a real
divergence (rates far too high) or from TRAIN_FAULT_OVERFLOW (runtime/faults.py), which makes the
backward of a chosen step non-finite. DeepSpeed's stages: tests/test_deepspeed.py.

    python -m pytest -q tests/test_divergence.py     # about a minute on two cores
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path

import pytest
import torch
from test_muon import MUON

CKPT = "checkpoints"


def checkpoint_hashes(out: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted((out / CKPT).glob("step_*.pt"))}


def assert_equal_states(a: dict, b: dict, where: str) -> None:
    """Two nested states (state dicts, optimizer states) hold the same tensors, bit for bit."""
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_equal_states(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_equal_states(x, y, f"{where}[{i}]")


def one_error_line(proc) -> str:
    """The refusal: one `error:` line, no traceback."""
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text[-4000:]
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, text[-4000:]
    return errors[0]


def test_the_guard_leaves_out_non_finite_and_spiking_steps_and_stops_after_a_run_of_them(pkg, cfg_with):
    guard_module = pkg.module("training.divergence")
    cfg = cfg_with("optim.max_skipped_steps=2", "optim.loss_spike_factor=3")
    guard = guard_module.DivergenceGuard(cfg.optim, torch.device("cpu"), is_main=True, judges_norm=True)
    verdicts = []
    for step, (loss, norm) in enumerate([(4.0, 1.0), (3.0, 1.0), (3.1, math.nan), (2.9, 1.0), (30.0, 1.0), (2.8, 1.0)]):
        guard.observe_loss(torch.tensor(loss))
        verdicts.append(bool(guard.judge(step, torch.tensor(norm))))
        assert guard.check(lambda: None) == sum(verdicts)  # one in a row: no stop
    # a NaN gradient norm and a loss eight times the running mean (about 3.9) are left out
    assert verdicts == [False, False, True, False, True, False]
    # the running mean holds the applied steps only
    state = guard.state_dict()
    assert state["counted"] == 4 and 2.8 < state["mean"] < 4.0 and state["streak"] == 0
    for step in (6, 7):
        guard.observe_loss(torch.tensor(math.inf))
        guard.judge(step, torch.tensor(1.0))
    with pytest.raises(pkg.module("runtime.unrecoverable").SharedFailure) as stop:
        guard.check(lambda: "runs/x/checkpoints/step_00000004.pt")
    message = str(stop.value)
    assert message.startswith("the run diverged at step 7: loss inf")
    assert "2 steps in a row were not applied (optim.max_skipped_steps=2)" in message
    assert (
        "resume from the newest checkpoint, runs/x/checkpoints/step_00000004.pt, with a lower learning rate" in message
    )
    # a resume restores the guard's state: the same verdicts as the uninterrupted run
    again = guard_module.DivergenceGuard(cfg.optim, torch.device("cpu"), is_main=True, judges_norm=True)
    again.load_state_dict(state)
    assert again.state_dict() == state


@pytest.mark.parametrize("recipe", ["adamw", "muon"])
def test_a_step_with_non_finite_gradients_is_not_applied(recipe, cli, demo_data, train, metrics, tmp_path):
    """adamw: torch's AdamW (unfused on a CPU: the step's changes are put back on the device); muon: the
    package's own optimizer, which leaves the step out itself (found_inf)."""
    out = tmp_path / recipe
    extra = MUON if recipe == "muon" else []
    overrides = [*extra, "schedule.max_steps=6", "checkpoint.every_steps=1", "checkpoint.keep_last=10"]
    proc = train(cli, demo_data, out, 2, *overrides, "logging.every_steps=2", env={"TRAIN_FAULT_OVERFLOW": "3"})
    assert "fault injection: the gradients of step 3 overflow" in proc.stderr
    states = {step: torch.load(out / CKPT / f"step_{step:08d}.pt", weights_only=False) for step in (3, 4, 5)}
    # step 4 (the fourth update, index 3) left weights and optimizer state exactly as step 3 had them
    assert_equal_states(states[3]["model"], states[4]["model"], "model")
    assert_equal_states(states[3]["optimizer"]["state"], states[4]["optimizer"]["state"], "optimizer")
    assert not torch.equal(states[4]["model"]["lm_head.weight"], states[5]["model"]["lm_head.weight"])
    assert all(torch.isfinite(t).all() for t in states[5]["model"].values())
    records = {r["step"]: r for r in metrics(out)[0]}
    assert "not_applied" not in records[2] and records[4]["not_applied"] == 1 and records[6]["not_applied"] == 1
    assert "1 step not applied" in proc.stdout and "; 1 step was not applied (divergence guard)" in proc.stdout
    assert math.isnan(records[4]["grad_norm"]) or math.isinf(records[4]["grad_norm"])


def test_a_run_resumed_with_rates_that_diverge_keeps_its_finite_checkpoints_and_stops_in_one_line(
    cli, demo_data, train, metrics, tmp_path
):
    out = tmp_path / "run"
    keep = ["checkpoint.every_steps=5", "checkpoint.keep_last=2"]
    train(cli, demo_data, out, 2, *keep, "schedule.max_steps=10")
    before = checkpoint_hashes(out)
    assert sorted(before) == ["step_00000005.pt", "step_00000010.pt"]

    # the README allows new rates on resume: these blow the weights up within a few steps
    proc = train(cli, demo_data, out, 2, *keep, "schedule.max_steps=40", "optim.lr=1e12", expect=1)
    line = one_error_line(proc)
    newest = out / CKPT / "step_00000010.pt"
    assert (
        line.startswith("error: the run diverged at step ") and f"resume from the newest checkpoint, {newest}," in line
    )
    assert "3 steps in a row were not applied (optim.max_skipped_steps=3)" in line
    # nothing written from the diverged steps: every checkpoint as it was, `latest` on the last good one
    assert checkpoint_hashes(out) == before
    assert (out / CKPT / "latest").read_text() == newest.name
    assert "done:" not in proc.stdout

    # the way out the line names: the same run from that checkpoint at a sane rate
    resumed = train(cli, demo_data, out, 2, *keep, "schedule.max_steps=15")
    assert f"resumed from {newest} at step 10" in resumed.stdout
    assert all(math.isfinite(r["loss"]) and "not_applied" not in r for r in metrics(out)[0] if r["step"] > 10)


def test_a_spike_factor_that_would_skip_everything_or_runs_under_deepspeed_is_refused(cli, pkg):
    cases = [(["optim.loss_spike_factor=0.5"], "use 0 (off) or a factor above 1")]
    if pkg.optional_parts.has_deepspeed():
        cases.append(
            (
                ["optim.loss_spike_factor=3", "run.strategy=deepspeed"],
                "set optim.loss_spike_factor=0, or run.strategy=ddp",
            )
        )
    for overrides, words in cases:
        proc = cli("check", *overrides, expect=1)
        assert "Traceback" not in proc.stderr and words in proc.stdout + proc.stderr, proc.stdout + proc.stderr
