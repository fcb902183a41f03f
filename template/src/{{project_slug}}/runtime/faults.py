"""Fault injection for the fault-tolerance tests and for rehearsing a failure on a real cluster.
Each hook reads one environment variable and does nothing when it is unset.

    TRAIN_FAULT_PAUSE_BEFORE_COMMIT=30   a checkpoint save sleeps 30 s between writing its files and
                                         renaming them into place (kill the job then: the previous
                                         checkpoint must still be the one that loads)
    TRAIN_FAULT_HANG=RANK:STEP           that global rank stops forever before optimizer step STEP,
                                         so the others wait in their next collective (DDP's buffer
                                         broadcast before the forward; try `debug-dump`)
    TRAIN_FAULT_STEP_SECONDS=0.5         every step sleeps this long (a slow job to signal or kill)
    TRAIN_FAULT_START_DELAY=RANK:SECONDS that global rank waits this long before it starts the process
                                         group, at every attempt (a restarted rank 0 that comes late:
                                         the others wait for it, or past run.start_timeout_minutes exit)
    TRAIN_FAULT_PART_SECONDS=1           prepare-data sleeps this long after each part it finishes
                                         (data/encode_parts.py: data/ sits below runtime/)
    TRAIN_FAULT_OVERFLOW=STEP[,STEP...]  the loss that optimizer step STEP (0-based) backpropagates is
                                         multiplied by inf on every rank, as an fp16 overflow makes it:
                                         under fp16 the step is skipped and counted, the weights kept
                                         (train.py's loop: data parallel and sharded strategies, not
                                         the pipeline engine)
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path


def pause_before_commit(staged: Path) -> None:
    seconds = float(os.environ.get("TRAIN_FAULT_PAUSE_BEFORE_COMMIT", "0") or 0)
    if seconds > 0:
        print(
            f"fault injection: {staged} written, pausing {seconds:g} s before the rename", file=sys.stderr, flush=True
        )
        time.sleep(seconds)


def overflow(loss, step: int, micro: int):
    """The loss to backpropagate: loss itself, or loss * inf in the first micro step of a step
    TRAIN_FAULT_OVERFLOW names (the accumulated gradients are then inf or NaN)."""
    spec = os.environ.get("TRAIN_FAULT_OVERFLOW", "")
    if spec and micro == 0 and str(step) in spec.split(","):
        print(f"fault injection: the gradients of step {step} overflow", file=sys.stderr, flush=True)
        return loss * float("inf")
    return loss


def before_step(rank: int, step: int) -> None:
    slow = float(os.environ.get("TRAIN_FAULT_STEP_SECONDS", "0") or 0)
    if slow > 0:
        time.sleep(slow)
    spec = os.environ.get("TRAIN_FAULT_HANG", "")
    if spec:
        hang_rank, _, hang_step = spec.partition(":")
        if int(hang_rank) == rank and int(hang_step or 0) == step:
            print(f"fault injection: rank {rank} hangs before step {step}", file=sys.stderr, flush=True)
            while True:
                time.sleep(3600)


def before_group_start(rank: int) -> None:
    spec = os.environ.get("TRAIN_FAULT_START_DELAY", "")
    if spec:
        late_rank, _, seconds = spec.partition(":")
        if int(late_rank) == rank:
            print(
                f"fault injection: rank {rank} starts the process group {seconds} s late", file=sys.stderr, flush=True
            )
            time.sleep(float(seconds))
