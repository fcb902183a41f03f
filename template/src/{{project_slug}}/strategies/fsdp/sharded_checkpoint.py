"""FSDP2's checkpoints: torch.distributed.checkpoint (DCP) writes each rank's shards of the weights and
optimizer state into one folder, step_N/, with the run's state (step, config, every rank's RNG, the
data position) beside them in run_state.pt, committed by checkpoints/'s one sequence (staged, fsynced,
manifest, renamed, `latest` last, keep_last): an interrupted save leaves the previous checkpoint as it
was. DCP stores every tensor with its place in the whole, so a checkpoint loads on any number of
ranks (checkpoint.reshard=true) without a conversion, and on one process without a process group
(read_checkpoint: eval, sample, export).

    checkpoints/step_00000020/.metadata          DCP's index of the tensors and their shards
    checkpoints/step_00000020/__<rank>_0.distcp  each rank's shards
    checkpoints/step_00000020/run_state.pt       written by rank 0
    checkpoints/step_00000020/manifest.json      sizes and hashes (checkpoints/checkpoint_files.py)
"""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from ...checkpoints import checkpoint, checkpoint_files
from ...runtime import unrecoverable
from ...runtime.distributed import barrier, gather_objects, print0, share_from_main
from ...runtime.unrecoverable import raise_on_every_rank

RUN_STATE = "run_state.pt"
DCP_INDEX = ".metadata"


def is_dcp_checkpoint(folder: Path) -> bool:
    return (Path(folder) / DCP_INDEX).is_file()


def save(strategy, ckpt_dir: Path, step: int, extra: dict) -> None:
    """Collective: every rank writes its shards into checkpoints/.staging/step_N, fsyncs them and hashes
    its share of the files; rank 0 writes the run state and commits the folder."""
    run = strategy.run
    tag = f"step_{step:08d}"
    staged = ckpt_dir / checkpoint_files.STAGING / tag
    own = [Path(strategy.cfg.run.output_dir)]

    def no_room(reason: str) -> str:
        return str(checkpoint_files.save_failed(reason, ckpt_dir, tag, _checkpoint_bytes(strategy, ckpt_dir)))

    failed = None
    if run.is_main:  # the run state first, while the other ranks wait: nobody lists a half-written file
        shutil.rmtree(staged, ignore_errors=True)  # left by a save that crashed
        failed = _failure(staged, own, no_room, lambda: _write_run_state(staged, {"step": step, **extra}))
    failed = share_from_main(failed)  # no folder to write into: no rank starts the shards
    if failed is None:
        failed = _failure(staged, own, no_room, lambda: dcp.save(_states(strategy), checkpoint_id=str(staged)))
        failed = failed or _failure(staged, own, no_room, lambda: checkpoint_files.fsync_tree(staged))
        failed = next(filter(None, gather_objects(failed)), None)
    if failed:
        if run.is_main:
            shutil.rmtree(staged, ignore_errors=True)  # frees what the partial save took
        raise_on_every_rank(failed, run.is_main, key="run.output_dir")
    shares = checkpoint.hash_shares(staged)
    if run.is_main:
        keep = strategy.cfg.checkpoint.keep_last
        final = checkpoint.commit_folder(staged, ckpt_dir, step, shares, keep, strategy.run_id)
        print0(f"saved {final}")
    barrier()


def _write_run_state(staged: Path, state: dict) -> None:
    staged.mkdir(parents=True)
    # Not the commit (commit_folder's rename is): no pause of the fault injection here.
    checkpoint_files.atomic_write(staged / RUN_STATE, lambda f: torch.save(state, f), commit_hook=False)


def _failure(staged: Path, own: list[Path], no_room, write) -> str | None:
    """None when write() went through; the one line when the disk had no room (no_room(reason)) or
    the path cannot be written, so that every rank still reaches the collectives and all stop
    together; anything else is raised. DCP reports a rank's error on every rank, wrapped
    (CheckpointException): the first rank's is judged."""
    try:
        write()
    except (OSError, RuntimeError, CheckpointException) as exc:
        cause = next(iter(exc.failures.values()), exc) if isinstance(exc, CheckpointException) else exc
        cause = getattr(cause, "exception", cause)  # DCP keeps each rank's error beside its traceback
        reason = checkpoint_files.room_reason(cause, staged, 0) if isinstance(cause, BaseException) else None
        if reason is not None:
            return no_room(reason)
        problem = unrecoverable.unusable_path(cause, own)
        if problem is None:
            raise
        return str(problem)
    return None


def _checkpoint_bytes(strategy, ckpt_dir: Path) -> int:
    """About the size of a checkpoint: the last one's, or (none yet) fp32 weights and AdamW's two moments."""
    previous = checkpoint.find_latest(ckpt_dir, listing=checkpoint_files.list_folders)
    return checkpoint_files.size_on_disk(previous) if previous else 12 * strategy.num_params


def resume(strategy, ckpt_dir: Path, allowed: bool) -> int:
    """Collective: load the newest intact checkpoint folder into the sharded model and optimizer, on
    any number of ranks where checkpoint.reshard allows it; the step it holds, or 0."""
    run = strategy.run
    latest = checkpoint.newest_intact(ckpt_dir, listing=checkpoint_files.list_folders) if allowed else None
    strategy.run_id = (checkpoint_files.run_id_of(latest) if latest else None) or checkpoint_files.new_run_id()
    if latest is None:
        if allowed and checkpoint_files.list_files(ckpt_dir):
            raise checkpoint.written_by_another_strategy(ckpt_dir, "files", "run.strategy=ddp", "fsdp")
        return 0
    if not is_dcp_checkpoint(latest):
        raise checkpoint.written_by_another_strategy(ckpt_dir, "folders", "run.strategy=deepspeed", "fsdp")
    state = torch.load(latest / RUN_STATE, map_location="cpu", weights_only=False)
    notes = checkpoint.check_compatible(state, strategy.cfg, run.world_size, latest)
    states = _states(strategy)
    dcp.load(states, checkpoint_id=str(latest))
    set_model_state_dict(strategy.module, states["model"])
    # Muon keeps a group's state with its first matrix: the others have none of their own. dcp.load
    # above already refused a checkpoint without a tensor the optimizer's state holds.
    loose = StateDictOptions(strict=False)
    set_optimizer_state_dict(strategy.module, strategy.optimizer, states["optimizer"], options=loose)
    checkpoint.restore_rank_rng(state["rng"], run.rank, strategy.cfg.run.seed)
    strategy.resumed_state = {"divergence": state.get("divergence")}
    print0(f"resumed from {latest} at step {state['step']}" + "".join(f"; {n}" for n in notes))
    return state["step"]


def _states(strategy) -> dict:
    """The sharded model's and optimizer's state dicts, keyed as the unwrapped model names them."""
    return {
        "model": get_model_state_dict(strategy.module),
        "optimizer": get_optimizer_state_dict(strategy.module, strategy.optimizer),
    }


def run_state(folder: Path) -> dict:
    """The run state of a checkpoint folder (step, config, data fingerprint), read before its shards."""
    return torch.load(Path(folder) / RUN_STATE, map_location="cpu", weights_only=False)


def read_checkpoint(folder: Path) -> dict:
    """A checkpoint folder as one process's dict: "model" the whole model's state dict, beside the run
    state. The shards are read into whole tensors of the shapes DCP's index records, without a
    process group."""
    folder = Path(folder)
    index = dcp.FileSystemReader(str(folder)).read_metadata()
    model = {}
    for key, meta in index.state_dict_metadata.items():
        section, _, name = key.partition(".")
        if section == "model" and hasattr(meta, "size"):
            model[name] = torch.empty(meta.size, dtype=meta.properties.dtype)
    with warnings.catch_warnings():  # DCP says it assumes one process: that is the point here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load({"model": model}, checkpoint_id=str(folder), no_dist=True)
    return {**run_state(folder), "model": model}
