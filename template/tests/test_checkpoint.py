"""Checkpoints: atomic save, keep_last pruning, find_latest when things went wrong, RNG state."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
import torch


def state(step: int) -> dict:
    return {"step": step, "weights": torch.full((4, 4), float(step)), "note": f"step {step}"}


def names(folder):
    return sorted(p.name for p in folder.iterdir())


def test_save_load_and_keep_last(pkg, tmp_path):
    ck = pkg.checkpoint
    folder = tmp_path / "checkpoints"
    for step in (10, 20, 30, 40, 50):
        path = ck.save(folder, step, state(step), keep_last=2)
        assert path == folder / f"step_{step:08d}.pt"
        assert ck.find_latest(folder) == path
    # Each checkpoint with its manifest (run id, size, sha256), written before the checkpoint's rename.
    assert names(folder) == [
        "latest",
        "step_00000040.pt",
        "step_00000040.pt.json",
        "step_00000050.pt",
        "step_00000050.pt.json",
    ]
    assert (folder / "latest").read_text() == "step_00000050.pt"
    manifest = json.loads((folder / "step_00000050.pt.json").read_text())
    assert manifest["step"] == 50 and manifest["files"]["step_00000050.pt"] == pkg.checkpoint_files.file_entry(path)
    loaded = ck.load(ck.find_latest(folder))
    assert loaded["step"] == 50 and loaded["note"] == "step 50"
    assert torch.equal(loaded["weights"], torch.full((4, 4), 50.0))
    assert [p.name for p in ck.list_checkpoints(folder)] == ["step_00000040.pt", "step_00000050.pt"]


def test_steps_sort_numerically(pkg, tmp_path):
    ck = pkg.checkpoint
    for step in (9, 10, 100_000):
        ck.save(tmp_path, step, state(step), keep_last=5)
    (tmp_path / "latest").unlink()
    assert ck.find_latest(tmp_path).name == "step_00100000.pt"


def test_find_latest_in_an_empty_or_missing_folder(pkg, tmp_path):
    assert pkg.checkpoint.find_latest(tmp_path) is None
    assert pkg.checkpoint.find_latest(tmp_path / "nope") is None
    assert pkg.checkpoint.list_checkpoints(tmp_path / "nope") == []


def test_leftover_temporary_file_is_ignored(pkg, tmp_path):
    ck = pkg.checkpoint
    ck.save(tmp_path, 10, state(10), keep_last=3)
    # What a crash in the middle of saving step 20 leaves behind.
    (tmp_path / ".step_00000020.pt.tmp-12345").write_bytes(b"half a zip file")
    (tmp_path / "step_00000020.pt.tmp").write_bytes(b"")
    assert ck.find_latest(tmp_path) == tmp_path / "step_00000010.pt"
    (tmp_path / "latest").unlink()
    assert ck.find_latest(tmp_path) == tmp_path / "step_00000010.pt"
    assert [p.name for p in ck.list_checkpoints(tmp_path)] == ["step_00000010.pt"]
    ck.save(tmp_path, 20, state(20), keep_last=3)  # a later save is not confused either
    assert ck.load(ck.find_latest(tmp_path))["step"] == 20


@pytest.mark.parametrize("pointer", ["step_00000099.pt", "", "garbage\n", "../elsewhere.pt"])
def test_latest_naming_a_missing_file_falls_back_to_the_newest_on_disk(pkg, tmp_path, pointer):
    ck = pkg.checkpoint
    for step in (10, 20):
        ck.save(tmp_path, step, state(step), keep_last=3)
    (tmp_path / "latest").write_text(pointer)
    assert ck.find_latest(tmp_path) == tmp_path / "step_00000020.pt"


def test_latest_wins_over_a_higher_step_on_disk(pkg, tmp_path):
    """`latest` is written last: a newer file it does not name yet (a crash between the two
    renames) is complete but the pointer is authoritative."""
    ck = pkg.checkpoint
    for step in (10, 20):
        ck.save(tmp_path, step, state(step), keep_last=3)
    (tmp_path / "latest").write_text("step_00000010.pt")
    assert ck.find_latest(tmp_path) == tmp_path / "step_00000010.pt"


class Unpicklable:
    def __reduce__(self):
        raise RuntimeError("serialisation failed half way")


def test_failed_save_never_leaves_a_half_written_file(pkg, tmp_path):
    ck = pkg.checkpoint
    ck.save(tmp_path, 10, state(10), keep_last=1)
    broken = {"big": torch.zeros(1_000_000), "bad": Unpicklable()}
    with pytest.raises(RuntimeError, match="half way"):
        ck.save(tmp_path, 20, broken, keep_last=1)
    assert names(tmp_path) == ["latest", "step_00000010.pt", "step_00000010.pt.json"]  # no step 20, no temporary file
    assert ck.find_latest(tmp_path) == tmp_path / "step_00000010.pt"
    assert ck.load(ck.find_latest(tmp_path))["step"] == 10
    # Failing to overwrite an existing step keeps the old content intact.
    with pytest.raises(RuntimeError):
        ck.save(tmp_path, 10, broken, keep_last=1)
    assert torch.equal(ck.load(tmp_path / "step_00000010.pt")["weights"], torch.full((4, 4), 10.0))


def test_interrupted_write_leaves_the_previous_file(pkg, tmp_path):
    """The writer dies after some bytes: the final name still holds the previous, whole file."""
    target = tmp_path / "step_00000010.pt"
    target.write_bytes(b"previous complete file")

    def write_half(f):
        f.write(b"x" * 100_000)
        f.flush()
        assert any(
            p.name.startswith(".step_00000010.pt.tmp") and p.stat().st_size == 100_000 for p in tmp_path.iterdir()
        )
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        pkg.checkpoint_files.atomic_write(target, write_half)
    assert target.read_bytes() == b"previous complete file"
    assert names(tmp_path) == ["step_00000010.pt"]


def test_rng_state_round_trip(pkg):
    ck = pkg.checkpoint
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    saved = ck.rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(3))
    random.random(), np.random.rand(), torch.rand(5)  # move every generator on
    ck.restore_rng(saved)
    got = (random.random(), np.random.rand(), torch.rand(3))
    assert got[0] == expected[0] and got[1] == expected[1] and torch.equal(got[2], expected[2])


def test_rng_state_survives_a_file(pkg, tmp_path):
    ck = pkg.checkpoint
    torch.manual_seed(7)
    ck.save(tmp_path, 1, {"rng": ck.rng_state()}, keep_last=1)
    expected = torch.rand(4)
    torch.manual_seed(8)
    ck.restore_rng(ck.load(ck.find_latest(tmp_path))["rng"])
    assert torch.equal(torch.rand(4), expected)


def test_each_rank_restores_its_own_random_state(pkg):
    """Checkpoints hold one state per rank; rank r takes entry r, a rank the checkpoint did not
    have (a resharded resume) starts from run.seed + rank, and an old single state still loads."""
    ck = pkg.checkpoint
    states = []
    for seed in (10, 11):
        torch.manual_seed(seed)
        states.append(ck.rng_state())
    torch.manual_seed(11)
    rank1_next = torch.rand(3)
    torch.manual_seed(99)
    ck.restore_rank_rng(states, rank=1, seed=1337)
    assert torch.equal(torch.rand(3), rank1_next)

    ck.restore_rank_rng(states, rank=2, seed=1337)
    torch.manual_seed(1337 + 2)
    expected = torch.rand(3)
    ck.restore_rank_rng(states, rank=2, seed=1337)
    assert torch.equal(torch.rand(3), expected)

    torch.manual_seed(10)
    rank0_next = torch.rand(3)
    ck.restore_rank_rng(states[0], rank=5, seed=0)  # one dict: written before per-rank states
    assert torch.equal(torch.rand(3), rank0_next)


def test_compatibility_refusals_name_the_setting_and_the_way_out(pkg, cfg_with):
    ck, ConfigError = pkg.checkpoint, pkg.config.ConfigError
    cfg = cfg_with("model.size=tiny", "batch.global_batch_size=16")
    state = {"fingerprint": cfg.model_fingerprint(), "world_size": 4, "config": cfg.to_dict()}
    assert ck.check_compatible(state, cfg, 4, "ckpt") == []

    with pytest.raises(ConfigError, match=r"written by 4 processes; this run has 2.*checkpoint.reshard=true"):
        ck.check_compatible(state, cfg, 2, "ckpt")
    resharded = cfg_with("model.size=tiny", "batch.global_batch_size=16", "checkpoint.reshard=true", "optim.lr=0.01")
    notes = ck.check_compatible(state, resharded, 2, "ckpt")
    assert notes[0] == "resharded from 4 to 2 processes (checkpoint.reshard=true)"
    assert "optim.lr" in notes[1] and "-> 0.01" in notes[1]

    with pytest.raises(ConfigError, match="different model, global batch"):
        ck.check_compatible(state, cfg_with("model.size=tiny", "batch.global_batch_size=32"), 4, "ckpt")


@pytest.mark.part("gpt3", "deepspeed")
def test_a_layout_the_strategy_re_splits_still_needs_reshard_and_the_same_model(pkg, cfg_with):
    """Other tensor and pipeline degrees: part of the fingerprint, unless the strategy re-splits the
    checkpoint (DeepSpeed's universal format); then checkpoint.reshard=true, as for another world."""
    ck, ConfigError = pkg.checkpoint, pkg.config.ConfigError
    layout = ["model.arch=gpt3", "model.size=tiny", "batch.global_batch_size=16", "run.strategy=deepspeed"]
    written = cfg_with(*layout, "parallel.tensor=2", "parallel.pipeline=1")
    state = {"fingerprint": written.model_fingerprint(), "world_size": 2, "config": written.to_dict()}
    pipelined = cfg_with(*layout, "parallel.tensor=1", "parallel.pipeline=2")
    with pytest.raises(ConfigError, match="different model, global batch or parallel layout"):
        ck.check_compatible(state, pipelined, 2, "ckpt")
    asked = r"written with parallel.tensor=2 parallel.pipeline=1; this run has parallel.tensor=1 parallel.pipeline=2\. Set checkpoint.reshard=true"
    with pytest.raises(ConfigError, match=asked):
        ck.check_compatible(state, pipelined, 2, "ckpt", layout_changed=True)
    resharded = cfg_with(*layout, "parallel.tensor=1", "parallel.pipeline=2", "checkpoint.reshard=true")
    notes = ck.check_compatible(state, resharded, 2, "ckpt", layout_changed=True)
    assert notes[0] == "layout changed from tensor 2 x pipeline 1 to tensor 1 x pipeline 2 (checkpoint.reshard=true)"
    with pytest.raises(ConfigError, match="different model"):  # the rest of the fingerprint still holds
        bigger = cfg_with(*layout, "parallel.pipeline=2", "checkpoint.reshard=true", "batch.global_batch_size=32")
        ck.check_compatible(state, bigger, 2, "ckpt", layout_changed=True)


def test_weak_scaling_refuses_another_world_and_names_the_strong_recipe_that_continues(pkg, cfg_with):
    """Under weak scaling another world size is another global batch; the refusal names the settings
    that continue the run's recipe on the new world, and those are accepted."""
    ck, batch = pkg.checkpoint, pkg.batch
    shape = ["model.size=tiny", "cluster.nodes=1", "cluster.gpus_per_node=2", "batch.micro_batch_size=4"]
    weak = cfg_with(*shape, "batch.global_batch_size=16", "batch.scaling=weak", "checkpoint.reshard=true")
    trained = batch.at_world_size(weak, 2)
    state = {"fingerprint": trained.model_fingerprint(), "world_size": 2, "config": trained.to_dict()}
    assert ck.check_compatible(state, batch.at_world_size(weak, 2), 2, "ckpt") == []
    with pytest.raises(pkg.config.ConfigError) as err:
        ck.check_compatible(state, batch.at_world_size(weak, 4), 4, "ckpt")
    message = str(err.value)
    assert "trained at global batch 16 by 2 processes; batch.scaling=weak makes it 32 on 4" in message
    assert "batch.scaling=strong batch.global_batch_size=16 checkpoint.reshard=true" in message
    strong = cfg_with(*shape, "batch.global_batch_size=16", "batch.scaling=strong", "checkpoint.reshard=true")
    notes = ck.check_compatible(state, strong, 4, "ckpt")
    assert notes[0] == "resharded from 2 to 4 processes (checkpoint.reshard=true)"


def test_metrics_of_a_dead_attempt_are_dropped_on_resume(pkg, tmp_path):
    path = tmp_path / "metrics.jsonl"
    lines = [json.dumps({"step": s, "loss": 1.0 / s}) for s in (5, 10, 15)] + ['{"step": 20, "lo']  # torn last line
    path.write_text("\n".join(lines) + "\n")
    pkg.metrics.drop_records_after(path, 10)
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [5, 10]
