"""run.strategy=fsdp (FSDP2) keeps DDP's guarantees: two processes sharding the gpt recipe (Muon on
the blocks' matrices, every model piece on) learn as one DDP process does; the checkpoint of step 10,
a folder of torch.distributed.checkpoint shards, continues on one and on four processes
(checkpoint.reshard=true) as the uninterrupted run, and a crash while it is saved leaves the previous
one to continue from; eval and export read it in one process.

    python -m pytest -q tests/test_fsdp.py      # about two minutes on two cores
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import subprocess_env
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


COMPILED_BLOCKS = """
import importlib, json, sys
import torch, torch.distributed as dist
from torch._dynamo.utils import counters
from torch.distributed.device_mesh import init_device_mesh

package, out = sys.argv[1], sys.argv[2]
gpt = importlib.import_module(f"{package}.models.gpt.model")
fsdp = importlib.import_module(f"{package}.strategies.fsdp.strategy")
dist.init_process_group("gloo")
from torch.distributed.fsdp import FSDPModule
x = torch.randint(0, 1024, (2, 32), generator=torch.Generator().manual_seed(1))
results = {}
for compile_blocks in (False, True):
    torch.manual_seed(0)
    model = gpt.GPT(gpt.GPTConfig(vocab_size=1024, sequence_len=32, n_layer=4, n_embd=64, n_head=2, n_kv_head=2))
    model.init_weights()
    fsdp.shard_model(model, init_device_mesh("cpu", (2,)), False, False, True, compile_blocks)
    loss = model(x, torch.roll(x, -1, 1))
    loss.backward()
    results[compile_blocks] = (loss.item(), [p.grad.to_local() for p in model.parameters()])
grads = max((a - b).abs().max().item() for a, b in zip(results[False][1], results[True][1]))
if dist.get_rank() == 0:
    found = {"losses": [results[False][0], results[True][0]], "grads": grads,
             "graphs": counters["stats"]["unique_graphs"], "breaks": sum(counters["graph_break"].values()),
             "units": [isinstance(m, FSDPModule) for m in (model.wte, model.lm_head, *model.blocks)]}
    open(out, "w").write(json.dumps(found))
dist.destroy_process_group()
"""


def test_blocks_compile_on_their_own_under_fsdp(cli, pkg, tmp_path):
    """What run.compile does under FSDP2 on a GPU, run here with Inductor on the CPU (2 processes):
    each block compiled before it is sharded gives the eager loss and gradients, without a graph
    break; four blocks take two graphs (the first block's, then one for every other: dynamo makes the
    layer number a variable after its first recompile), not one per block. The token embedding,
    larger than a block, is a unit of its own."""
    script, out = tmp_path / "compiled_blocks.py", tmp_path / "found.json"
    script.write_text(COMPILED_BLOCKS)
    run = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone"]
    proc = subprocess.run([*run, str(script), pkg.name, str(out)], capture_output=True, text=True, timeout=600,
                          cwd=cli.root, env=subprocess_env())  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = json.loads(out.read_text())
    eager, compiled = found["losses"]
    assert abs(eager - compiled) < 1e-6 and found["grads"] < 1e-6, found
    assert found["breaks"] == 0 and found["graphs"] == 2, found
    # Its own units: every block and the token embedding (larger than a block); the head is the model's.
    assert found["units"] == [True, False, True, True, True, True], found
