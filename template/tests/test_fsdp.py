"""run.strategy=fsdp (FSDP2) keeps DDP's guarantees: two processes sharding the gpt recipe (Muon on
the blocks' matrices, every model piece on) learn as one DDP process does; the checkpoint of step 10,
a folder of torch.distributed.checkpoint shards, continues on one and on four processes
(checkpoint.reshard=true) as the uninterrupted run, and a crash while it is saved leaves the previous
one to continue from; eval and export read it in one process.

    python -m pytest -q tests/test_fsdp.py      # about two minutes on two cores
"""

from __future__ import annotations

import os
import shutil
import signal
import time

import pytest
import torch
from test_muon import MUON

FSDP = ["run.strategy=fsdp"]
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def runs(once, cli, demo_data, train):
    """The recipe on one DDP process (test_muon's run) and on two FSDP processes, which also recompute
    each block in backward (activation checkpointing: the same numbers)."""

    def run(nproc: int, *extra: str):
        return lambda out: train(cli, demo_data, out, nproc, *MUON, *extra).stdout

    return {
        "ddp": once("muon_1proc", run(1)),
        "fsdp": once("fsdp_muon_2proc", run(2, *FSDP, "model.activation_checkpointing=true")),
    }


def losses(metrics, run_dir) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in metrics(run_dir)[0]}


def test_two_fsdp_processes_learn_as_one_ddp_process(runs, metrics, pkg):
    (ddp_dir, _), (fsdp_dir, fsdp_log) = runs["ddp"], runs["fsdp"]
    assert "strategy fsdp (FSDP2)" in fsdp_log and "peak lrs matrix" in fsdp_log
    ddp, fsdp = losses(metrics, ddp_dir), losses(metrics, fsdp_dir)
    assert sorted(ddp) == sorted(fsdp) and len(ddp) > 1
    for step in ddp:
        assert abs(ddp[step] - fsdp[step]) < TOLERANCE, (step, ddp[step], fsdp[step])
    # One process reads the folder of shards whole; the weights agree as test_muon's do (Adam's eps
    # on the tables turns reduction-order noise of a rare token into steps of the table's lr).
    folder = fsdp_dir / "checkpoints" / "step_00000020"
    assert (folder / ".metadata").is_file() and (folder / "manifest.json").is_file()
    sharded = pkg.trained_model.read_checkpoint(folder)
    whole = pkg.trained_model.read_checkpoint(ddp_dir / "checkpoints" / "step_00000020.pt")
    assert sharded["step"] == 20 and sorted(sharded["model"]) == sorted(whole["model"])
    for name, tensor in whole["model"].items():
        assert torch.allclose(sharded["model"][name], tensor, atol=1e-3), name


@pytest.mark.parametrize("nproc", [1, 4])
def test_an_fsdp_checkpoint_continues_on_another_number_of_processes(
    runs, cli, demo_data, train, metrics, tmp_path, nproc
):
    source, _ = runs["fsdp"]
    out = tmp_path / "run"
    shutil.copytree(source / "checkpoints" / "step_00000010", out / "checkpoints" / "step_00000010")
    (out / "checkpoints" / "latest").write_text("step_00000010")
    proc = train(cli, demo_data, out, nproc, *MUON, *FSDP, "checkpoint.reshard=true")
    assert f"resharded from 2 to {nproc} processes" in proc.stdout and "steps 10->20" in proc.stdout
    continued, uninterrupted = losses(metrics, out), losses(metrics, source)
    assert sorted(continued) == [s for s in sorted(uninterrupted) if s > 10]
    for step, loss in continued.items():
        assert abs(loss - uninterrupted[step]) < TOLERANCE, (step, loss, uninterrupted[step])


def test_eval_and_export_read_an_fsdp_checkpoint(runs, cli, demo_data, export, pkg):
    run_dir, _ = runs["fsdp"]
    proc = cli("eval", f"data.dir={demo_data}", f"run.output_dir={run_dir}", "run.device=cpu")
    assert "step 20 | val loss" in proc.stdout and "step_00000020" in proc.stdout
    assert "torch.distributed is disabled" not in proc.stderr
    exported = export.tensors(export(demo_data, run_dir))  # the pieces' modeling code: names under gpt.
    state = pkg.trained_model.read_checkpoint(run_dir / "checkpoints" / "step_00000020")["model"]
    assert sorted(exported) == sorted(f"gpt.{name}" for name in state)
    for name, tensor in state.items():
        assert torch.equal(exported[f"gpt.{name}"], tensor), name


def test_a_crash_during_an_fsdp_save_leaves_the_previous_checkpoint(
    runs, cli, demo_data, train_overrides, metrics, tmp_path
):
    """Every rank has written its shards into checkpoints/.staging/step_00000020 when the job dies,
    before rank 0 renames the folder into place: step 10 stays the checkpoint that loads, and the
    same command continues from it to the uninterrupted run's loss."""
    source, _ = runs["fsdp"]
    out = tmp_path / "run"
    ckpt = out / "checkpoints"
    shutil.copytree(source / "checkpoints" / "step_00000010", ckpt / "step_00000010")
    (ckpt / "latest").write_text("step_00000010")
    args = ["launch", "devmachine", "--nproc-per-node", "2", *train_overrides, *MUON, *FSDP]
    args += [f"data.dir={demo_data}", f"run.output_dir={out}"]
    log = tmp_path / "log"
    proc = cli.start(*args, log=log, env={"TRAIN_FAULT_PAUSE_BEFORE_COMMIT": "600"})
    try:
        deadline = time.monotonic() + 300
        while "pausing" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-4000:]
            time.sleep(0.2)
        staged = ckpt / ".staging" / "step_00000020"
        assert {".metadata", "run_state.pt", "__0_0.distcp", "__1_0.distcp"} <= {p.name for p in staged.iterdir()}
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        cli.stop(proc)
    assert not (ckpt / "step_00000020").exists() and (ckpt / "latest").read_text() == "step_00000010"

    again = cli(*args)
    assert f"resumed from {ckpt / 'step_00000010'} at step 10" in again.stdout
    assert (ckpt / "latest").read_text() == "step_00000020" and not any((ckpt / ".staging").iterdir())
    assert abs(losses(metrics, out)[20] - losses(metrics, source)[20]) < TOLERANCE


def test_one_fsdp_process_started_without_torchrun_trains_as_ddp(
    cli, demo_data, train_overrides, run_1proc, metrics, tmp_path
):
    """`train` in a plain process (no torchrun, no process group): FSDP2 starts a group of one in memory
    and learns as the one-process DDP run does."""
    out = tmp_path / "run"
    cli("train", *train_overrides, *FSDP, "schedule.max_steps=10", f"data.dir={demo_data}", f"run.output_dir={out}")
    alone, ddp = losses(metrics, out), losses(metrics, run_1proc[0])
    assert sorted(alone) == [5, 10]
    for step, loss in alone.items():
        assert abs(loss - ddp[step]) < TOLERANCE, (step, loss, ddp[step])
