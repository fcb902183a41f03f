"""How the model is spread over the ranks: `run.strategy` picks DDP (ddp.py) or a strategy folder
(strategies/<name>/, in projects made with it), whose plan (memory.py) names the classes it builds.

    <package> train run.strategy=ddp

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


def build_strategy(run, vocab_size: int, resume: bool = False):
    """The model, built and wrapped by the strategy the Run names (run.strategy, run.pipeline_engine):
    a base.Strategy, which counts num_params and flops_per_token of the whole model itself (sharded
    weights and pipelines leave only a part on each rank). resume: whether this run continues its
    newest checkpoint (a strategy may settle how to load it before it is built)."""
    import importlib

    from ..settings.config import ConfigError
    from .memory import strategy_plan

    cfg = run.cfg
    plan = strategy_plan(cfg)
    if run.pipeline_engine:
        if not plan.runs_layouts:
            problem = plan.layout_problems(cfg)[0]
            raise ConfigError(str(problem), key=problem.fix_key)
        built = plan.builds_layouts  # builds its own stage of the model
    else:
        built = plan.builds
    module, _, name = built.partition(":")
    strategy = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    if run.pipeline_engine:
        return strategy(run, vocab_size, resume)
    model = run.family.build(cfg, vocab_size).to(run.device)
    if cfg.run.fp8 != "off":
        from .fp8 import to_float8  # imports torchao only when asked for

        to_float8(model, run)
    return strategy(run, model, resume)
