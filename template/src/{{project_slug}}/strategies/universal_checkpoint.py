"""A DeepSpeed checkpoint continued on another data-parallel size, through DeepSpeed's universal format.

    <package> train checkpoint.reshard=true      # on the new number of processes, in the same run.output_dir

ZeRO 1-3 shard the optimizer state (ZeRO-3 the weights too) over the data-parallel ranks that
wrote a checkpoint, so a shard fits only the world it came from. DeepSpeed's ds_to_universal
rewrites such a checkpoint as one file per parameter and state (fp32 weights, Adam's moments,
its step), which any data-parallel size can slice again; the engine reads that format when its
config has checkpoint.load_universal, so the choice is made before the engine is built.
Rank 0 converts the newest checkpoint once into checkpoints/universal/<step>/ (written under a
staging name and renamed, so an interrupted conversion is done again, never half used), beside
the original, which stays what `latest` names; eval, sample and export keep reading the original.
A later resume on the same new shape finds the conversion done; the save that rotates the
original out removes its conversion too. ZeRO 0 needs none of this: every rank holds the whole
optimizer state, and DeepSpeed loads it on any data-parallel size.

Only the data-parallel degree may change: the tensor and pipeline degrees split each layer's
weights over files that our layers' names alone do not tell DeepSpeed how to join (see
layout_change_refusal). Under the pipeline engine (gpt3 with parallel.pipeline or .tensor > 1) a
ZeRO-1 checkpoint keeps its data-parallel size too: DeepSpeed's conversion of it does not load back
to the saved weights (pipeline_refusal).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
from pathlib import Path

from ..runtime import checkpoint_files
from ..runtime.distributed import barrier, print0, share_from_main
from ..runtime.unrecoverable import raise_on_every_rank

FOLDER = "universal"  # under checkpoints/
LOG = "conversion.log"  # DeepSpeed's progress lines, kept beside the conversion
STAGING = ".staging"  # a conversion under way (DeepSpeed also writes its latest_universal there)


def is_partitioned(folder: Path) -> bool:
    """Whether the optimizer state in a checkpoint folder is split over its data-parallel ranks
    (ZeRO 1-3, and DeepSpeed's bf16 optimizer under ZeRO 0)."""
    return any(Path(folder).glob("*optim_states.pt"))


def converted_path(folder: Path) -> Path:
    return folder.parent / FOLDER / folder.name


def convert_once(folder: Path, is_main: bool) -> Path:
    """Collective: the universal form of checkpoint `folder`, made by rank 0 if it is not there yet.
    Every rank returns the converted folder, or every rank raises with rank 0's one line."""
    target = converted_path(folder)
    problem = None
    if is_main and not target.is_dir():
        print0(
            f"converting {folder} to DeepSpeed's universal checkpoint format (data-parallel size changed): "
            f"{target}; DeepSpeed's log: {target / LOG}"
        )
        try:
            _convert(folder, target)
        except Exception as exc:  # DeepSpeed raises assertions and bare RuntimeErrors alike
            problem = (
                f"could not convert {folder} to DeepSpeed's universal format ({type(exc).__name__}: {exc}); "
                f"run with the {_saved_processes(folder)} processes that wrote it, or start a new run in a folder "
                f"of its own (run.output_dir={checkpoint_files.unused_sibling(folder.parent.parent)})"
            )
    problem = share_from_main(problem)
    if problem:
        raise_on_every_rank(problem, is_main, key="checkpoint.reshard")
    barrier()
    return target


def _convert(folder: Path, target: Path) -> None:
    # Imported here: it pulls DeepSpeed's checkpoint tools, needed only on this path.
    from deepspeed.checkpoint import ds_to_universal

    staging = target.parent / STAGING / target.name
    shutil.rmtree(staging.parent, ignore_errors=True)  # a conversion that was interrupted
    staging.mkdir(parents=True)
    args = argparse.Namespace(
        input_folder=str(folder),
        output_folder=str(staging),
        num_extract_workers=1,  # in this process: no pool of workers that each import torch
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        # Our modules record no universal-checkpoint metadata: without tensor parallelism there is
        # nothing to record beyond the format's version, which this adds.
        inject_missing_state=True,
    )
    log = staging.parent / LOG
    with open(log, "w") as out, contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        ds_to_universal.main(args)
    os.replace(log, staging / LOG)
    checkpoint_files.fsync_tree(staging)
    os.replace(staging, target)
    shutil.rmtree(staging.parent, ignore_errors=True)
    # Conversions of checkpoints other than this one are of no further use.
    for other in target.parent.iterdir():
        if other.is_dir() and other != target:
            shutil.rmtree(other, ignore_errors=True)


def remove_conversion(folder: Path) -> None:
    """Drop the universal form of a checkpoint being rotated out."""
    shutil.rmtree(converted_path(folder), ignore_errors=True)


def _saved_processes(folder: Path) -> str:
    ranks = len(list(folder.glob("*optim_states.pt")))
    return str(ranks) if ranks else "same number of"


def layout_change_refusal(saved: dict, tensor: int, pipeline: int, world_size: int, where) -> str | None:
    """The one line refusing a checkpoint written with other tensor or pipeline degrees, naming the
    shapes that can continue it; None when those degrees are the same."""
    parallel = saved.get("config", {}).get("parallel", {})
    was = (int(parallel.get("tensor", 1)), int(parallel.get("pipeline", 1)))
    if was == (tensor, pipeline):
        return None
    per_replica = was[0] * was[1]
    saved_world = saved.get("world_size", per_replica)
    return (
        f"{where} was written with parallel.tensor={was[0]} parallel.pipeline={was[1]} ({saved_world} processes); "
        f"this run has parallel.tensor={tensor} parallel.pipeline={pipeline} ({world_size} processes). A checkpoint "
        f"continues with the tensor and pipeline degrees it was written with: run with parallel.tensor={was[0]} "
        f"parallel.pipeline={was[1]} on any multiple of {per_replica} processes (checkpoint.reshard=true when the "
        "number changes), or start a new run in a folder of its own"
    )


def pipeline_refusal(folder: Path, saved: dict, world_size: int) -> str:
    """Why a pipeline-engine checkpoint with sharded optimizer state cannot change its data-parallel size."""
    saved_world = saved.get("world_size", "its")
    return (
        f"{folder} holds ZeRO-1 optimizer shards of the DeepSpeed pipeline engine, written by {saved_world} "
        f"processes; this run has {world_size}, and DeepSpeed's universal conversion does not restore such a "
        f"checkpoint exactly. Continue it on {saved_world} processes, or start a new run in a folder of its own "
        f"(run.output_dir={checkpoint_files.unused_sibling(folder.parent.parent)})"
    )
