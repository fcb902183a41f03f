"""Process-level distributed setup: reads RANK, LOCAL_RANK, WORLD_SIZE (set by torchrun),
picks the device and backend (NCCL on CUDA, Gloo on CPU) and offers small collective helpers.

The training code only sees this module; it never learns which platform started it.
"""

from __future__ import annotations

import os
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .config import ConfigError


@dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def pick_device(preference: str, local_rank: int) -> torch.device:
    if preference == "cpu" or (preference == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("run.device=cuda but no CUDA device is visible; use run.device=auto or cpu")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def autocast_context(device: torch.device, dtype: str):
    """bf16 autocast on CUDA by default; fp32 on CPU, where bf16 is slow and only emulated."""
    use_bf16 = dtype == "bf16" or (dtype == "auto" and device.type == "cuda")
    return torch.autocast(device.type, dtype=torch.bfloat16) if use_bf16 else nullcontext()


def init_distributed(device_preference: str = "auto") -> DistInfo:
    """Join the process group when launched with several processes; no-op for one process."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = pick_device(device_preference, local_rank)
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        # device_id lets NCCL bind the communicator to this GPU eagerly (fewer surprises at the first collective).
        dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None)
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


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


def print0(*args, **kwargs) -> None:
    """Print on global rank 0 only."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(*args, **kwargs, flush=True)
