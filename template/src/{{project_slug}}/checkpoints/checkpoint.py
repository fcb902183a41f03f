"""Checkpoints: atomic save, keep the last K, find the newest intact one, what a resume must restore and refuse.

A DDP checkpoint is one file `step_XXXXXXXX.pt` in output_dir/checkpoints (a sharded
strategy's are folders, under the same rules: commit_folder). It is written under a temporary name, fsynced,
its manifest (run id, size, sha256: checkpoint_files.py) written, then renamed, and the `latest`
pointer is replaced last, so a crash at any moment leaves the previous checkpoint intact. A resume
verifies the checkpoint against its manifest and passes over a damaged one, naming it, to the
newest intact one. Only global rank 0 writes (DDP replicas are equal), but the file holds every
rank's random state. A save that finds no room raises SaveFailed: one line, the previous
checkpoint kept.

Besides model and optimizer, `run_state` records what continuing exactly needs: the step (the
learning rate and the data position follow from it: schedule.at(step), micro_batch_start(step, ...)),
the data position of every rank, every rank's RNG states, the config and its fingerprint, the
fingerprint of the prepared data (a resume, eval or sample on other data is refused: check_data),
and the layout (world size, data-parallel size). Under fp16 the DDP file also holds the loss
scaler's state and the count of skipped steps (strategies/ddp.py); an engine saves its own.
"""

from __future__ import annotations

import dataclasses
import os
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from ..data.tokens import data_fingerprint, find_data
from ..runtime import faults
from ..runtime.distributed import gather_objects, print0, share_from_main
from ..runtime.unrecoverable import raise_on_every_rank
from ..settings.config import Config, ConfigError
from . import checkpoint_files as files
from .checkpoint_files import atomic_write as _atomic_write

list_checkpoints = files.list_files
named_by_latest = files.named_by_latest  # what the `latest` pointer names (a DDP file or a sharded strategy's folder)


def checkpoint_path(folder: Path, step: int) -> Path:
    return folder / f"step_{step:08d}.pt"


def write_latest(folder: Path, name: str) -> None:
    """Point `latest` at name (a file or folder in folder): the last act of every save."""
    _atomic_write(folder / files.LATEST, lambda f: f.write(name.encode()), commit_hook=False)


def rng_state() -> dict:
    """This process's generators; on CUDA only its own device's (one GPU per rank)."""
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def restore_rng(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        if isinstance(cuda, (list, tuple)):  # checkpoints that held every visible device's state
            cuda = cuda[torch.cuda.current_device()]
        torch.cuda.set_rng_state(cuda)


def every_rank_rng() -> list[dict]:
    """Collective: the RNG states of all ranks, in rank order, on every rank."""
    mine = rng_state()
    if not dist.is_initialized():
        return [mine]
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, mine)
    return states


def restore_rank_rng(saved, rank: int, seed: int) -> None:
    """Restore this rank's generators from a checkpoint's list (one entry per rank). A rank the
    checkpoint did not have (a resharded resume) starts from seed + rank instead."""
    if isinstance(saved, dict):  # written before checkpoints held every rank's state
        restore_rng(saved)
    elif rank < len(saved):
        restore_rng(saved[rank])
    else:
        random.seed(seed + rank)
        np.random.seed(seed + rank)
        torch.manual_seed(seed + rank)


def run_state(
    cfg: Config,
    step: int,
    world_size: int,
    data_parallel_size: int,
    data_positions: list[int],
    trained_on: str | None = None,
) -> dict:
    """Everything besides weights and optimizer that a resume checks or restores (collective).
    trained_on: the fingerprint of the data the run opened at its start (a prepare-data --force
    while it trains does not change what it reads)."""
    return {
        "rng": every_rank_rng(),
        "config": cfg.to_dict(),
        "fingerprint": cfg.model_fingerprint(),
        "data_fingerprint": trained_on,
        "world_size": world_size,
        "data_parallel_size": data_parallel_size,
        "samples_seen": step * cfg.batch.global_batch_size,
        "data_positions": data_positions,
    }


def check_compatible(state: dict, cfg: Config, world_size: int, where, layout_changed: bool = False) -> list[str]:
    """Refuse a checkpoint this run cannot continue exactly; returns notes on what changed. Another
    number of processes continues only under checkpoint.reshard=true (DDP loads its replicas on any
    data-parallel size, a sharded strategy through a format of any size it converts to).
    layout_changed: the strategy re-splits this checkpoint for other tensor and pipeline degrees
    (also under checkpoint.reshard=true); the rest of the fingerprint must still match."""
    saved_world, trained_batch = state.get("world_size", world_size), state.get("config", {}).get("batch", {})
    saved_global = trained_batch.get("global_batch_size", cfg.batch.global_batch_size)
    if cfg.batch.scaling == "weak" and saved_world != world_size and saved_global != cfg.batch.global_batch_size:
        raise ConfigError(
            f"{where} was trained at global batch {saved_global} by {saved_world} processes; batch.scaling=weak "
            f"makes it {cfg.batch.global_batch_size} on {world_size}: run with {saved_world} processes, or keep the "
            f"recipe on {world_size} with batch.scaling=strong batch.global_batch_size={saved_global} checkpoint.reshard=true",
            key="batch.scaling",
        )
    saved_parallel = state.get("config", {}).get("parallel", {})
    as_saved = cfg
    if layout_changed:
        kept = {k: saved_parallel.get(k, getattr(cfg.parallel, k)) for k in ("tensor", "pipeline")}
        as_saved = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, **kept))
    if state.get("fingerprint") != as_saved.model_fingerprint():
        raise ConfigError(
            f"{where} was written with a different model, global batch or parallel layout (model section, "
            "batch.global_batch_size, parallel.*); restore those settings, or start a new run in a folder "
            f"of its own: run.output_dir={files.unused_sibling(Path(cfg.run.output_dir))}"
        )
    check_data(state, Path(cfg.data.dir), where, "to train on the new data, use a new run.output_dir")
    notes = []
    if layout_changed and not cfg.checkpoint.reshard:
        raise ConfigError(
            f"{where} was written with parallel.tensor={saved_parallel.get('tensor', 1)} "
            f"parallel.pipeline={saved_parallel.get('pipeline', 1)}; this run has parallel.tensor={cfg.parallel.tensor} "
            f"parallel.pipeline={cfg.parallel.pipeline}. Set checkpoint.reshard=true to continue on the new layout "
            "(results equal up to the order of reductions), or restore those degrees",
            key="checkpoint.reshard",
        )
    if layout_changed:
        notes.append(
            f"layout changed from tensor {saved_parallel.get('tensor', 1)} x pipeline {saved_parallel.get('pipeline', 1)} "
            f"to tensor {cfg.parallel.tensor} x pipeline {cfg.parallel.pipeline} (checkpoint.reshard=true)"
        )
    if saved_world != world_size:
        if not cfg.checkpoint.reshard:
            raise ConfigError(
                f"{where} was written by {saved_world} processes; this run has {world_size}. Run with "
                f"{saved_world} processes to continue exactly, or set checkpoint.reshard=true to continue on "
                f"{world_size} (same data and schedule; results equal up to the order of reductions)",
                key="checkpoint.reshard",
            )
        notes.append(f"resharded from {saved_world} to {world_size} processes (checkpoint.reshard=true)")
    changed = _changed_settings(state.get("config", {}), cfg.to_dict())
    if changed:
        notes.append("settings changed since the checkpoint: " + ", ".join(changed))
    return notes


def check_data(state: dict, data_dir: Path, where, otherwise: str) -> None:
    """Refuse a checkpoint trained on other data than data_dir holds now: its token ids would mean
    other tokens. Checkpoints written before they recorded their data pass unchecked."""
    trained_on = state.get("data_fingerprint")
    if trained_on is None:
        return
    current = data_fingerprint(data_dir)
    if trained_on == current:
        return
    trained_dir = Path(state.get("config", {}).get("data", {}).get("dir") or data_dir)
    kept = find_data(trained_on, list(dict.fromkeys([data_dir, trained_dir])))
    fix = f"run with data.dir={kept}, which holds it" if kept else "set data.dir to a folder holding that data"
    raise ConfigError(
        f"{where} was trained on data with fingerprint {trained_on} (data.dir={trained_dir}), but data.dir={data_dir} "
        f"now holds fingerprint {current} (prepared again since?); {fix}, or {otherwise}"
    )


def _changed_settings(old: dict, new: dict, prefix: str = "") -> list[str]:
    changes = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            changes += _changed_settings(a, b, f"{prefix}{key}.")
        elif key in old and key in new and a != b:
            changes.append(f"{prefix}{key} {a!r} -> {b!r}")
    return changes


def save(folder: Path, step: int, state: dict, keep_last: int, run_id: str | None = None) -> Path:
    """Write state for `step` with its manifest, point `latest` at it, then delete all but the
    newest keep_last of this run's checkpoints (another run's are left alone)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(folder, step)
    writer = None

    def write(f) -> None:
        nonlocal writer
        writer = files.HashingWriter(f)
        torch.save(state, writer)

    def write_manifest() -> None:
        files.write_manifest(files.manifest_path(path), run_id, step, {path.name: writer.entry()})

    try:
        _atomic_write(path, write, before_rename=write_manifest)
    except (OSError, RuntimeError) as exc:  # the partial file is gone by now
        needed = state_bytes(state)
        reason = files.room_reason(exc, folder, needed, writer.error if writer else None)
        if reason is None:
            raise
        raise files.save_failed(reason, folder, path.name, needed) from None
    write_latest(folder, path.name)
    for old in files.own(list_checkpoints(folder), run_id)[:-keep_last]:
        old.unlink(missing_ok=True)
        files.manifest_path(old).unlink(missing_ok=True)
    return path


def commit_folder(
    staged: Path, folder: Path, step: int, shares: dict, keep_last: int, run_id: str | None, on_prune=None
) -> Path:
    """A sharded checkpoint every rank has written and fsynced into `staged` (a folder under
    checkpoints/.staging/), committed as save() commits a file: its manifest (`shares`, the files'
    sizes and hashes), renamed into place (an older attempt's folder of the same step replaced), made
    durable, `latest` pointed at it, and all but the newest keep_last of this run's folders removed
    (on_prune(old) for what a strategy keeps beside each). Rank 0 only; the ranks wait after it."""
    files.write_manifest(staged / files.MANIFEST, run_id, step, shares)
    faults.pause_before_commit(staged)
    final = folder / staged.name
    if final.exists():  # the same step saved by an attempt that died before `latest` moved
        shutil.rmtree(final)
    os.replace(staged, final)
    files.fsync_tree(final)
    write_latest(folder, final.name)
    for old in files.own(files.list_folders(folder), run_id)[:-keep_last]:
        shutil.rmtree(old, ignore_errors=True)
        if on_prune:
            on_prune(old)
    return final


def written_by_another_strategy(ckpt_dir: Path, kind: str, writer: str, strategy: str) -> ConfigError:
    """The refusal for a run that finds in checkpoints/ only checkpoints of another strategy's format
    (kind: "files" or "folders"; writer: who writes those)."""
    return ConfigError(
        f"{ckpt_dir} holds checkpoint {kind}, which {writer} writes, but run.strategy={strategy}; continue that "
        "run with the run.strategy it was trained with, or start a new one in a folder of its own: "
        f"run.output_dir={files.unused_sibling(ckpt_dir.parent)}"
    )


def hash_shares(folder: Path) -> dict:
    """Collective: size and sha256 of every file in a staged folder (commit_folder's `shares`), each
    rank hashing its share. The names are the union of every rank's listing (a shared file system may
    show a node its own files before the others')."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    seen = gather_objects(sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()))
    names = sorted(set().union(*seen))
    mine = {name: files.file_entry(folder / name) for name in names[rank::world]}
    return {name: entry for share in gather_objects(mine) for name, entry in share.items()}


def state_bytes(state) -> int:
    """About the size torch.save gives state: the bytes of its tensors."""
    if isinstance(state, torch.Tensor):
        return state.untyped_storage().nbytes()
    if isinstance(state, dict):
        return sum(state_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(state_bytes(v) for v in state)
    return 64


def find_latest(folder: Path, listing=list_checkpoints) -> Path | None:
    """The checkpoint `latest` names; if that is missing, the highest step `listing` finds on disk
    (files here; a strategy that saves folders passes its folder listing). Not verified: see newest_intact."""
    found = files.candidates(folder, listing)
    return found[0] if found else None


def newest_intact(folder: Path, listing=list_checkpoints) -> Path | None:
    """Collective: the newest checkpoint that matches its manifest, skipping damaged ones with one
    line each; the ranks verify a checkpoint's files together. ConfigError when every one is damaged."""
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
    damaged = []
    for path in share_from_main(files.candidates(folder, listing)):  # rank 0's listing for all
        wrong = next(filter(None, gather_objects(files.problem(path, part=(rank, world)))), None)
        if wrong is None:
            return path
        print0(f"skipping damaged checkpoint {path}: {wrong}", file=sys.stderr)
        damaged.append(path.name)
    if damaged:
        raise_on_every_rank(
            f"every checkpoint in {folder} is damaged ({', '.join(damaged)}): nothing to resume from. Move them "
            f"out of {folder} to start this run over, or start a new run in a folder of its own "
            f"(run.output_dir={files.unused_sibling(folder.parent)})",
            rank == 0,
            key="run.output_dir",
        )
    return None


def load(path: Path, map_location="cpu") -> dict:
    # Our own files hold optimizer state and RNG tuples, which the weights-only loader rejects.
    return torch.load(path, map_location=map_location, weights_only=False)
