"""Process-level distributed setup: reads RANK, LOCAL_RANK, WORLD_SIZE (set by torchrun),
picks the device and backend (NCCL on CUDA, Gloo on CPU) and offers small collective helpers.

The training code only sees this module; it never learns which platform started it. What a run is
on this process, resolved once at its start, is run_context.py's Run.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from ..settings import precision
from ..settings.config import ConfigError, debug_requested
from ..settings.topology import process_ranks
from . import process_exit


@dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def one_process(device: torch.device) -> DistInfo:
    """A process that joins no group (sample, tests)."""
    return DistInfo(rank=0, local_rank=0, world_size=1, device=device)


def pick_device(preference: str, local_rank: int) -> torch.device:
    if preference == "cpu" or (preference == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("run.device=cuda but no CUDA device is visible; use run.device=auto or cpu")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def gpu_capability(device: torch.device) -> tuple[tuple[int, int], str]:
    """(compute capability, the GPU's name with it for a message); ((0, 0), 'cpu') off a GPU. What a
    GPU computes in is judged by its capability: torch.cuda.is_bf16_supported() also counts a V100's
    slow emulation."""
    if device.type != "cuda":
        return (0, 0), device.type
    major, minor = torch.cuda.get_device_capability(device)
    return (major, minor), f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor})"


def resolve_precision(device: torch.device, dtype: str) -> str:
    """'bf16', 'fp16' or 'fp32': run.dtype on this device (precision.resolve); bf16 from capability 8.0."""
    capability, name = gpu_capability(device)
    return precision.resolve(dtype, device.type == "cuda", capability >= (8, 0), name)


def autocast_context(device: torch.device, precision: str):
    """Autocast to a resolved precision (Run.precision): bf16 or fp16, none for fp32 (on a CPU
    run.dtype=auto resolves to fp32, where bf16 is slow and only emulated)."""
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return torch.autocast(device.type, dtype=half) if half else nullcontext()


def collective_timeout(cfg) -> timedelta:
    """How long a collective waits before the group aborts (and, with TORCH_NCCL_DUMP_ON_TIMEOUT,
    dumps its flight recorder): shorter under debug so a hang shows itself in minutes."""
    minutes = cfg.run.debug_timeout_minutes if debug_requested(cfg) else cfg.run.collective_timeout_minutes
    return timedelta(minutes=minutes)


def init_distributed(device_preference: str = "auto", timeout: timedelta | None = None) -> DistInfo:
    """Join the process group when launched with several processes; no-op for one process."""
    rank, local_rank, world_size = process_ranks(os.environ)
    if world_size > 1:
        # Libraries that read the variables themselves (DeepSpeed: LOCAL_RANK picks its device and is
        # checked against OMPI_COMM_WORLD_LOCAL_RANK) see the ranks mpirun or srun gave this process.
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size))
    device = pick_device(device_preference, local_rank)
    if dist.is_initialized():  # Ray Train sets up the group before calling the training function
        rank, world_size = dist.get_rank(), dist.get_world_size()
    elif world_size > 1:
        backend = "nccl" if device.type == "cuda" else "gloo"
        # Rendezvous at MASTER_ADDR:MASTER_PORT. device_id lets NCCL bind this GPU eagerly.
        dist.init_process_group(
            backend=backend,
            rank=rank,
            world_size=world_size,
            timeout=timeout,
            device_id=device if device.type == "cuda" else None,
        )
        process_exit.joined_group()
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


def finish() -> None:
    """After a successful run: every rank finishes its outstanding collectives before any rank
    closes its sockets (a Gloo peer torn down mid-operation aborts the other process with
    "terminate called without an active exception"). Not on the error path: a failed rank must
    not wait for peers that may be stuck in a collective it will never join."""
    if dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_mean(t: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= dist.get_world_size()
    return t


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def share_from_main(value):
    """Collective: global rank 0's value (any picklable object) on every rank."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(value) -> list:
    """Collective: every rank's value, in rank order, on every rank."""
    if not dist.is_initialized():
        return [value]
    found = [None] * dist.get_world_size()
    dist.all_gather_object(found, value)
    return found


def print0(*args, **kwargs) -> None:
    """Print on global rank 0 only."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*args, **kwargs, flush=True)
