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

Under the pipeline engine (gpt3 with parallel.pipeline or .tensor > 1, ZeRO-1) the tensor and
pipeline degrees may change too: the conversion joins every weight's tensor-parallel shards and the
load splits them for the new degrees, given what pipeline_layout_info records in every checkpoint
(which weights the stages share, which are split along which dimension); checkpoints written before
it was recorded keep their shape. ZeRO 0 there keeps a file per layer and tensor rank, which only
the same degrees read (layout_change_refusal); so does a change between the pipeline engine and
the plain strategy (tensor x pipeline = 1), whose weights are named otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
from pathlib import Path

from ...checkpoints import checkpoint_files
from ...runtime.distributed import barrier, print0, share_from_main
from ...runtime.unrecoverable import raise_on_every_rank
from ...settings.stored_files import warn

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
    damage = conversion_problem(target) if is_main and target.exists() else None
    if damage:
        warn(f"the universal conversion {target} is damaged ({damage}); it is made again")
        shutil.rmtree(target, ignore_errors=True)
        with contextlib.suppress(OSError):  # a file where the folder should be
            target.unlink()
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
    # The record of what the conversion holds (sizes and sha256), written last: a folder without it,
    # or whose files differ from it, is not trusted (conversion_problem).
    files = {
        str(p.relative_to(staging)): checkpoint_files.file_entry(p) for p in sorted(staging.rglob("*")) if p.is_file()
    }
    source = checkpoint_files.read_manifest(folder) or {}
    checkpoint_files.write_manifest(
        checkpoint_files.manifest_path(staging), source.get("run_id"), checkpoint_files.step_of(folder), files
    )
    checkpoint_files.fsync_tree(staging)
    os.replace(staging, target)
    shutil.rmtree(staging.parent, ignore_errors=True)
    # Conversions of checkpoints other than this one are of no further use.
    for other in target.parent.iterdir():
        if other.is_dir() and other != target:
            shutil.rmtree(other, ignore_errors=True)


def conversion_problem(target: Path) -> str | None:
    """What makes a universal conversion on disk untrustworthy (emptied, cut short, copied in part,
    made before conversions kept a record), or None. Sizes only: a conversion holds the fp32 weights
    and both Adam moments, too much to hash at every resume; its files were hashed when it was made."""
    if not target.is_dir():
        return "a file, not a folder"
    if checkpoint_files.read_manifest(target) is None:
        return f"no {checkpoint_files.MANIFEST}: an interrupted or an older conversion"
    return checkpoint_files.problem(target, contents=False)


def remove_conversion(folder: Path) -> None:
    """Drop the universal form of a checkpoint being rotated out."""
    shutil.rmtree(converted_path(folder), ignore_errors=True)


def _saved_processes(folder: Path) -> str:
    ranks = len(list(folder.glob("*optim_states.pt")))
    return str(ranks) if ranks else "same number of"


def saved_degrees(saved: dict) -> tuple[int, int]:
    """(tensor, pipeline) degrees a checkpoint was written with."""
    parallel = saved.get("config", {}).get("parallel", {})
    return int(parallel.get("tensor", 1)), int(parallel.get("pipeline", 1))


def layout_change_refusal(saved: dict, tensor: int, pipeline: int, world_size: int, where) -> str:
    """The one line refusing a checkpoint written with other tensor or pipeline degrees than a run
    that cannot re-split it, naming the shapes that can continue it."""
    was = saved_degrees(saved)
    per_replica = was[0] * was[1]
    saved_world = saved.get("world_size", per_replica)
    return (
        f"{where} was written with parallel.tensor={was[0]} parallel.pipeline={was[1]} ({saved_world} processes); "
        f"this run has parallel.tensor={tensor} parallel.pipeline={pipeline} ({world_size} processes). Only the "
        "pipeline engine's ZeRO-1 checkpoints (tensor x pipeline > 1 before and after) change those degrees: "
        f"run with parallel.tensor={was[0]} parallel.pipeline={was[1]} on any multiple of {per_replica} processes "
        "(checkpoint.reshard=true when the number changes), or start a new run in a folder of its own"
    )


def pipeline_layout_info(pipeline) -> dict:
    """What DeepSpeed's conversion reads of the pipeline engine's layers (the module's
    universal_checkpoint_info, which DeepSpeed saves in every checkpoint); the layer names are the
    family's (PipelineLayers: gpt3's ln1/ln2, proj/fc2 in the comments below)."""
    from deepspeed.checkpoint import constants

    norms, rows = "|".join(pipeline.block_norms), "|".join(pipeline.row_parallel)
    return {
        constants.UNIVERSAL_CHECKPOINT_VERSION_KEY: constants.UNIVERSAL_CHECKPOINT_VERSION_VALUE,
        # The tied embedding sits on the first stage and again on the last, for the head. Only its
        # `wte` is kept equal between the two (DeepSpeed all-reduces the tied weight's gradient); the
        # last stage's unused `wpe` drifts under weight decay. The first stage's copy is the model's,
        # and without this the conversion keeps whichever stage it reads last.
        constants.PIPELINE_REPLICATED_PARAMETER_PATTERNS: [r"tied_modules\."],
        # Tensor parallelism (strategies/deepspeed/tensor_parallel.py): the conversion joins each weight's shards
        # and the load splits them again for the new degree. Whole on every tensor rank: embeddings,
        # layer norms, the final norm (the last layer's index), the row-parallel layers' biases.
        # Split by input features (row parallel): proj and fc2. Everything else (qkv, fc) by output
        # features, DeepSpeed's default, along dimension 0: contiguous rows of qkv are whole heads.
        constants.TP_REPLICATED_PARAMETER_PATTERNS: [
            r"tied_modules\.",
            rf"\d+\.({norms})\.",
            rf"\d+\.({rows})\.bias$",
            r"\d+\.(weight|bias)$",
        ],
        constants.PARAMETER_WITH_ROW_PARALLELISM_PATTERNS: [rf"\d+\.({rows})\.weight$"],
    }


def records_pipeline_layout(saved: dict) -> bool:
    from deepspeed.checkpoint import constants

    info = saved.get(constants.UNIVERSAL_CHECKPOINT_INFO) or {}
    return bool(info.get(constants.PIPELINE_REPLICATED_PARAMETER_PATTERNS))


def pipeline_refusal(folder: Path, saved: dict, world_size: int) -> str:
    """Why a pipeline-engine checkpoint that does not record its shared weights keeps its data-parallel size."""
    saved_world = saved.get("world_size", "its")
    return (
        f"{folder} holds ZeRO-1 optimizer shards of the DeepSpeed pipeline engine, written by {saved_world} "
        f"processes, without the record of the weights its stages share (checkpoints of this project's "
        f"earlier template versions); this run has {world_size}. Continue it on {saved_world} processes; its "
        "next checkpoint records them and can then change size. Or start a new run in a folder of its own "
        f"(run.output_dir={checkpoint_files.unused_sibling(folder.parent.parent)})"
    )
