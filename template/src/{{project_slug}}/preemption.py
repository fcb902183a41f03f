"""Preemption: SIGTERM or SIGUSR1 asks the job to save at the next step boundary, then exit.

Who sends them: Kubernetes on pod deletion (SIGTERM, then SIGKILL after the grace period), Slurm
before the time limit (`--signal=USR1@N`) and on `scancel`/`scontrol requeue` (SIGTERM), TI-ONE
when a task is stopped, torchrun when it is told to stop (it forwards the signal to every rank and
kills them `cluster.stop_grace_seconds` later).

A signal may reach only some ranks, so every rank sets a local flag and the ranks agree at each
step boundary (one all-reduce of one number on a CPU group): all of them save the same step and
leave together.
Rank 0 then records output_dir/preempted.json, which the node supervisor reads to exit with
EXIT_PREEMPTED instead of torchrun's generic failure.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

EXIT_PREEMPTED = 143
"""128 + SIGTERM: what Kubernetes and Slurm show for a job stopped by a signal, and a code
training-operator's `restartPolicy: ExitCode` retries. preempted.json says a checkpoint was saved."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
MARKER = "preempted.json"


class StopRequest:
    """Catches STOP_SIGNALS in this process; `agreed()` tells every rank whether any rank got one."""

    def __init__(self):
        """Collective when a process group exists (every rank constructs it at the same point)."""
        import torch.distributed as dist

        self.signal_name: str | None = None
        # The flag travels over a CPU (Gloo) group: an all-reduce on the GPU would need .item() every
        # step, a host sync that stops the CPU from queueing the next step's kernels ahead.
        self.group = None
        if dist.is_initialized() and dist.get_backend() != "gloo":
            self.group = dist.new_group(backend="gloo")
        if threading.current_thread() is threading.main_thread():  # Ray Train runs us in a worker thread
            for sig in STOP_SIGNALS:
                signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self.signal_name = signal.Signals(signum).name

    def agreed(self) -> bool:
        """Collective: True on every rank when any rank caught a stop signal."""
        import torch  # here, not at the top: the launchers read the marker without torch
        import torch.distributed as dist

        flag = torch.tensor([1.0 if self.signal_name else 0.0])
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.group)
        return bool(flag.item())


def marker_path(output_dir: str | Path) -> Path:
    return Path(output_dir) / MARKER


def clear_marker(output_dir: str | Path) -> None:
    marker_path(output_dir).unlink(missing_ok=True)


def write_marker(output_dir: str | Path, step: int, signal_name: str | None, checkpoint: str) -> None:
    path = marker_path(output_dir)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(
        json.dumps(
            {"step": step, "signal": signal_name or "from another rank", "checkpoint": checkpoint, "time": time.time()}
        )
        + "\n"
    )
    os.replace(tmp, path)


def read_marker(output_dir: str | Path, since: float) -> dict | None:
    """The record of a preemption save that happened after `since` (a time.time() value)."""
    path = marker_path(output_dir)
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if record.get("time", 0) >= since else None
