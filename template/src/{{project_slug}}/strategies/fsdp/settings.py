"""FSDP2's section of config/train.yaml (`fsdp:`), read with run.strategy=fsdp; batch, optimizer
and clipping come from the shared sections. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...settings.sharding import Sharding

NAME = "fsdp"
STRATEGY = "fsdp"  # the run.strategy this section configures


@dataclass
class FSDPConfig:
    reshard_after_forward: bool = True
    """Free each block's gathered weights after its forward and gather them again for its backward
    (the least memory); false keeps them from forward to backward: one all-gather a step less per
    block, at the memory of the whole unsharded model."""
    offload: bool = False
    """Keep the sharded weights, gradients and optimizer state in CPU memory (the optimizer steps
    on the CPU): the least GPU memory, much slower steps."""


SECTION = FSDPConfig
CHOICES: dict = {}


def check(section: FSDPConfig) -> None:
    """Nothing in this section contradicts itself."""


def sharding(section: FSDPConfig) -> Sharding:
    """Weights, gradients and optimizer state sharded (stage 3); offload moves all of them to the host."""
    return Sharding(3, section.offload, section.offload)
