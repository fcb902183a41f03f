"""How far a data-parallel strategy shards the model states over the data ranks (Config.sharding reads it
from the config once; the Run holds it, plan and check ask it of any config). No torch.

Stage 0 keeps a full replica on every rank (DDP), 1 shards the optimizer state, 2 the gradients too,
3 the weights too; the optimizer (from stage 1) and the weights (stage 3) may live in host memory.
A strategy folder with a config section says its sharding there (strategies/<name>/settings.py:
STRATEGY, sharding(section)).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Sharding:
    stage: int = 0
    offload_optimizer: bool = False  # stage 1 on
    offload_params: bool = False  # stage 3
