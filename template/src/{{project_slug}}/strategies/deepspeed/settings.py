"""DeepSpeed's section of config/train.yaml (`deepspeed:`), read with run.strategy=deepspeed; batch,
optimizer and clipping come from the shared sections. settings/config.py adds SECTION to the Config of
a project made with DeepSpeed. No torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...settings.sharding import Sharding
from ...settings.stored_files import ConfigError

NAME = "deepspeed"
STRATEGY = "deepspeed"  # the run.strategy this section configures


@dataclass
class DeepSpeedConfig:
    zero_stage: int = 1
    """ZeRO stage with run.strategy=deepspeed: 0 plain data parallel, 1 shards optimizer state,
    2 also gradients, 3 also parameters."""
    offload_optimizer: bool = False
    """Keep optimizer state in CPU memory (ZeRO 1-3): less GPU memory, slower steps."""
    offload_params: bool = False
    """Keep parameters in CPU memory (ZeRO 3 only)."""


SECTION = DeepSpeedConfig
CHOICES = {"deepspeed.zero_stage": (0, 1, 2, 3)}


def check(section: DeepSpeedConfig) -> None:
    """Settings of this section that contradict each other: ConfigError naming the key."""
    if section.offload_params and section.zero_stage != 3:
        raise ConfigError(
            f"deepspeed.offload_params=true needs deepspeed.zero_stage=3 (got {section.zero_stage})",
            key="deepspeed.offload_params",
        )
    if section.offload_optimizer and section.zero_stage == 0:
        raise ConfigError(
            "deepspeed.offload_optimizer=true needs deepspeed.zero_stage 1, 2 or 3 (got 0)",
            key="deepspeed.offload_optimizer",
        )


def sharding(section: DeepSpeedConfig) -> Sharding:
    """ZeRO's stage is the sharding stage; offload only where the stage allows it."""
    stage = section.zero_stage
    return Sharding(stage, section.offload_optimizer and stage > 0, section.offload_params and stage == 3)
