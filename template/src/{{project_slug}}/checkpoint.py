"""Checkpoints: atomic save, keep the last K, find the latest, what a resume must restore and refuse.

A DDP checkpoint is one file `step_XXXXXXXX.pt` in output_dir/checkpoints (DeepSpeed's are folders,
see strategies/deepspeed.py, under the same rules). It is written under a temporary name, fsynced,
then renamed, and the `latest` pointer is replaced last, so a crash at any moment leaves the
previous checkpoint intact. Only global rank 0 writes (DDP replicas are equal), but the file holds
every rank's random state.

Besides model and optimizer, `run_state` records what continuing exactly needs: the step (the
learning rate and the data position follow from it: lr_at(step), micro_batch_start(step, ...)),
the data position of every rank, every rank's RNG states, the config and its fingerprint, the
fingerprint of the prepared data (a resume, eval or sample on other data is refused: check_data),
and the layout (world size, data-parallel size). No gradient scaler: training runs in bf16 or fp32.
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from . import faults
from .config import Config, ConfigError
from .data import data_fingerprint, find_data

LATEST = "latest"
_NAME = re.compile(r"step_(\d{8})\.pt")


def checkpoint_path(folder: Path, step: int) -> Path:
    return folder / f"step_{step:08d}.pt"


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """Flush every file under folder (and the folders themselves) to stable storage."""
    for root, _, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        _fsync_dir(Path(root))


def write_latest(folder: Path, name: str) -> None:
    """Point `latest` at name (a file or folder in folder): the last act of every save."""
    _atomic_write(folder / LATEST, lambda f: f.write(name.encode()), commit_hook=False)


def _atomic_write(path: Path, write, commit_hook: bool = True) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if commit_hook:
            faults.pause_before_commit(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


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


def check_compatible(state: dict, cfg: Config, world_size: int, where, can_reshard: bool) -> list[str]:
    """Refuse a checkpoint this run cannot continue exactly; returns notes on what changed."""
    if state.get("fingerprint") != cfg.model_fingerprint():
        raise ConfigError(
            f"{where} was written with a different model, global batch or parallel layout (model section, "
            "batch.global_batch_size, parallel.*); restore those settings, use a new run.output_dir, "
            "or set checkpoint.resume=false to start over"
        )
    check_data(state, Path(cfg.data.dir), where, "to train on the new data, use a new run.output_dir")
    notes = []
    saved_world = state.get("world_size", world_size)
    if saved_world != world_size:
        if not can_reshard:
            raise ConfigError(
                f"{where} was written by {saved_world} processes; this run has {world_size}. ZeRO and "
                f"pipeline checkpoints are sharded per rank: run with {saved_world} processes, or start "
                "over with a new run.output_dir"
            )
        if not cfg.checkpoint.reshard:
            raise ConfigError(
                f"{where} was written by {saved_world} processes; this run has {world_size}. Run with "
                f"{saved_world} processes to continue exactly, or set checkpoint.reshard=true to continue on "
                f"{world_size} (same data and schedule; results equal up to the order of reductions)"
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


def save(folder: Path, step: int, state: dict, keep_last: int) -> Path:
    """Write state for `step`, point `latest` at it, then delete all but the newest keep_last."""
    folder.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(folder, step)
    _atomic_write(path, lambda f: torch.save(state, f))
    write_latest(folder, path.name)
    for old in list_checkpoints(folder)[:-keep_last]:
        old.unlink(missing_ok=True)
    return path


def list_checkpoints(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if _NAME.fullmatch(p.name))


def find_latest(folder: Path, listing=list_checkpoints) -> Path | None:
    """The checkpoint `latest` names; if that is missing, the highest step `listing` finds on disk
    (files here; DeepSpeed's strategy passes its folder listing)."""
    pointer = folder / LATEST
    if pointer.is_file():
        named = folder / pointer.read_text().strip()
        if named in listing(folder):
            return named
    found = listing(folder)
    return found[-1] if found else None


def named_by_latest(folder: Path) -> Path | None:
    """What the `latest` pointer names (a DDP file or a DeepSpeed folder), or None."""
    pointer = folder / LATEST
    return folder / pointer.read_text().strip() if pointer.is_file() else None


def load(path: Path, map_location="cpu") -> dict:
    # Our own files hold optimizer state and RNG tuples, which the weights-only loader rejects.
    return torch.load(path, map_location=map_location, weights_only=False)
