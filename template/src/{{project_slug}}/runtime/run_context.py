"""What a run is on this process, resolved from the config once at its start (resolve_run): family,
precision, device, world and parallel sizes, batch arithmetic, the strategy and how far it shards and
whether the pipeline engine runs it. The modules below the start read the Run and never derive those
again (torchtitan's ParallelDims plays this part there).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.family import Family, family
from ..settings.batch import data_parallel_split
from ..settings.config import Config
from ..settings.sharding import Sharding
from .distributed import DistInfo, resolve_precision


@dataclass(frozen=True)
class Run:
    """What a run is on this process: its config (as resolved for this world: at_world_size, derived
    steps), the model family, where it runs, the precision it computes in, the parallel sizes and
    the batch arithmetic (global = micro x grad_accum x data_parallel_size). Built by resolve_run once;
    it has DistInfo's fields, so it goes wherever a DistInfo does."""

    cfg: Config
    family: Family
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    precision: str  # 'bf16', 'fp16' or 'fp32': run.dtype on this device
    tensor_parallel_size: int
    pipeline_parallel_size: int
    data_parallel_size: int
    global_batch_size: int
    micro_batch_size: int
    grad_accum: int | None  # micro steps per optimizer step; None in a process that does not train
    strategy: str  # run.strategy: 'ddp' or a strategy folder's name
    sharding: Sharding  # how far the strategy shards weights, gradients and optimizer state; stage 0 under DDP
    pipeline_engine: bool  # a tensor or pipeline layout of a family that has them: the pipeline engine runs it

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_run(cfg: Config, info: DistInfo, training: bool = False) -> Run:
    """The Run of cfg on this process; ConfigError where the device refuses run.dtype (bf16 on a GPU
    without it: one line from every rank) or, training, where the global batch does not split over its
    ranks (settings/batch.py, the arithmetic plan and check use). grad_accum is None unless training:
    eval and sample take no optimizer steps."""
    data_parallel, grad_accum = data_parallel_split(cfg, info.world_size, training)
    fam = family(cfg.model.arch)
    return Run(
        cfg=cfg,
        family=fam,
        rank=info.rank,
        local_rank=info.local_rank,
        world_size=info.world_size,
        device=info.device,
        precision=resolve_precision(info.device, cfg.run.dtype),
        tensor_parallel_size=cfg.parallel.tensor,
        pipeline_parallel_size=cfg.parallel.pipeline,
        data_parallel_size=data_parallel,
        global_batch_size=cfg.batch.global_batch_size,
        micro_batch_size=cfg.batch.micro_batch_size,
        grad_accum=grad_accum,
        strategy=cfg.run.strategy,
        sharding=cfg.sharding(),
        pipeline_engine=bool(fam.layouts) and (cfg.parallel.tensor, cfg.parallel.pipeline) != (1, 1),
    )
