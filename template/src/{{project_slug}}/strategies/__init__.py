"""How the model is spread over the ranks: `run.strategy` picks DDP or DeepSpeed ZeRO (deepspeed/, in
projects made with it).

    <package> train run.strategy=deepspeed deepspeed.zero_stage=2

A strategy owns what differs between the two: wrapping the model, building the optimizer,
backward and the optimizer step (accumulation, clipping), setting the learning rate, and the
checkpoint format: writing it, resuming from it, and reading it back for eval and sample
(read_checkpoint, which trained_model.py picks by what is on disk). train.py keeps the loop, the
data stream, logging and evaluation. What each strategy keeps on a GPU and allows, for plan and
check without torch: memory.py. run: runtime.run_context.Run, what the run is on this process,
resolved once at its start; the strategies read its family, precision and sizes (this package
imports no torch until a strategy is built).
"""

from __future__ import annotations

from ..settings import optional_parts


def build_strategy(run, vocab_size: int, resume: bool = False):
    """The model, built and wrapped by the strategy the Run names (run.strategy, run.pipeline_engine):
    a base.Strategy, which counts num_params and flops_per_token of the whole model itself (ZeRO-3 and
    pipelines leave only a part on each rank). resume: whether this run continues its newest
    checkpoint (DeepSpeed settles how to load it before its engine is built)."""
    cfg = run.cfg
    if run.pipeline_engine:
        pipeline = optional_parts.deepspeed(
            "pipeline",
            f"parallel.tensor={run.tensor_parallel_size} parallel.pipeline={run.pipeline_parallel_size}",
            "parallel.pipeline",
        )
        return pipeline.PipelineStrategy(run, vocab_size, resume)  # builds its own stage of the model
    model = run.family.build(cfg, vocab_size).to(run.device)
    if cfg.run.fp8 != "off":
        from .fp8 import to_float8  # imports torchao only when asked for

        to_float8(model, run)
    if run.strategy == "deepspeed":
        return optional_parts.deepspeed("engine").DeepSpeedStrategy(run, model, resume)
    from .ddp import DDPStrategy

    return DDPStrategy(run, model)
