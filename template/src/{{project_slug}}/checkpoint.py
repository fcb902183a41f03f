"""Checkpoints: atomic save, keep the last K, find the latest, restore RNG states.

A checkpoint is one file `step_XXXXXXXX.pt` in output_dir/checkpoints. It is written under a
temporary name, fsynced, then renamed, and the `latest` pointer is replaced last, so a crash at any
moment leaves the previous checkpoint intact. Only global rank 0 writes (DDP replicas are equal).
"""

from __future__ import annotations

import os
import random
import re
from pathlib import Path

import numpy as np
import torch

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


def _atomic_write(path: Path, write) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save(folder: Path, step: int, state: dict, keep_last: int) -> Path:
    """Write state for `step`, point `latest` at it, then delete all but the newest keep_last."""
    folder.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(folder, step)
    _atomic_write(path, lambda f: torch.save(state, f))
    _atomic_write(folder / LATEST, lambda f: f.write(path.name.encode()))
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


def load(path: Path, map_location="cpu") -> dict:
    # Our own files hold optimizer state and RNG tuples, which the weights-only loader rejects.
    return torch.load(path, map_location=map_location, weights_only=False)
