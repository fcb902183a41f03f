"""How the model is spread over the ranks: `run.strategy` picks DDP or DeepSpeed ZeRO.

    <package> train run.strategy=deepspeed deepspeed.zero_stage=2

A strategy owns what differs between the two: wrapping the model, building the optimizer,
backward and the optimizer step (accumulation, clipping), setting the learning rate, and the
checkpoint format: writing it, resuming from it, and reading it back for eval and sample
(read_checkpoint, which trained_model.py picks by what is on disk). train.py keeps the loop, the
data stream, logging and evaluation. What each strategy keeps on a GPU and allows, for plan and
check without torch: memory.py. info: runtime.distributed.DistInfo (this package imports no torch
until a strategy is built).
"""

from __future__ import annotations

from ..settings.config import Config
from .memory import on_deepspeed, uses_pipeline_engine


def build_strategy(cfg: Config, info, vocab_size: int, accum: int, resume: bool = False):
    """The model, built and wrapped by the strategy for cfg.run.strategy (and parallel.* for gpt3).
    The strategy has num_params and flops_per_token of the whole model (ZeRO-3 and pipelines
    leave only a part on each rank). resume: whether this run continues its newest checkpoint
    (DeepSpeed settles how to load it before its engine is built)."""
    from ..models import build_model

    if uses_pipeline_engine(cfg):
        from .pipeline import PipelineStrategy  # builds its own stage of the model

        return PipelineStrategy(cfg, info, vocab_size, accum, resume)
    model = build_model(cfg, vocab_size).to(info.device)
    num_params, flops_per_token = model.num_params(), model.flops_per_token()
    if cfg.run.fp8 != "off":
        from .fp8 import to_float8  # imports torchao only when asked for

        to_float8(model, cfg, info.device)
    if on_deepspeed(cfg):
        from .deepspeed import DeepSpeedStrategy  # imports deepspeed only when asked for

        strategy = DeepSpeedStrategy(cfg, info, model, accum, resume)
    else:
        from .ddp import DDPStrategy

        strategy = DDPStrategy(cfg, info, model, accum)
    strategy.num_params, strategy.flops_per_token = num_params, flops_per_token
    return strategy
