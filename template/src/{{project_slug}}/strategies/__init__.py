"""How the model is spread over the ranks: `run.strategy` picks DDP or DeepSpeed ZeRO.

    <package> train run.strategy=deepspeed deepspeed.zero_stage=2

A strategy owns what differs between the two: wrapping the model, building the optimizer,
backward and the optimizer step (accumulation, clipping), setting the learning rate, and the
checkpoint format. train.py keeps the loop, the data stream, logging and evaluation.
"""

from __future__ import annotations

from ..config import Config
from ..distributed import DistInfo


def build_strategy(cfg: Config, info: DistInfo, model, accum: int):
    """The strategy object for cfg.run.strategy; `model` is the unwrapped module on its device."""
    if cfg.run.strategy == "deepspeed":
        from .deepspeed import DeepSpeedStrategy  # imports deepspeed only when asked for

        return DeepSpeedStrategy(cfg, info, model, accum)
    from .ddp import DDPStrategy

    return DDPStrategy(cfg, info, model, accum)


def param_groups(model, weight_decay: float) -> list[dict]:
    """AdamW groups: weight decay shrinks matrices toward zero; on the embedding table it only hurts rare tokens."""
    def decays(name, p):
        return p.dim() >= 2 and not name.startswith("wte")

    named = list(model.named_parameters())
    return [
        {"params": [p for n, p in named if decays(n, p)], "weight_decay": weight_decay},
        {"params": [p for n, p in named if not decays(n, p)], "weight_decay": 0.0},
    ]
