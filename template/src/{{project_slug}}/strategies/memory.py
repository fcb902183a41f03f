"""What each strategy keeps on a GPU and what it allows, without torch: plan, fit and check ask here,
the strategies' modules (ddp.py, deepspeed.py, pipeline.py) do what it describes.

    ddp         stage 0 only: every rank holds the weights, gradients and optimizer state (16 bytes a
                parameter: fp32 weights and grads under autocast, Adam's two moments)
    deepspeed   ZeRO stage 0-3 shards the optimizer state (1), the gradients too (2), the weights too
                (3) over the data-parallel ranks; the optimizer offloaded to the host from stage 1, the
                weights at stage 3. Tensor and pipeline layouts run on its pipeline engine: ZeRO 0-1.

    zero_stage(cfg)                          # 0 for ddp
    model_states(psi, stage, nd)             # bytes per GPU: weights, grads, optimizer (+ host)
    at_stage(cfg, 2)                         # the config on ZeRO-2 (fit's candidates)
    problems(cfg, precision)                 # what the strategy refuses for this layout and precision
"""

from __future__ import annotations

from ..models.family import Family, family
from ..settings.config import Config, Problem, changed
from ..settings.precision import fp16_zero0_refusal

DDP, DEEPSPEED = "ddp", "deepspeed"
STAGES = (0, 1, 2, 3)


def on_deepspeed(cfg: Config) -> bool:
    return cfg.run.strategy == DEEPSPEED


def zero_stage(cfg: Config) -> int:
    """ZeRO stage of the config: 0 for DDP."""
    return cfg.deepspeed.zero_stage if on_deepspeed(cfg) else 0


def uses_pipeline_engine(cfg: Config, fam: Family | None = None) -> bool:
    """A tensor or pipeline layout of a family that has them: DeepSpeed's pipeline engine runs it.
    fam: the run's family (Run.family); plan and check, asking of any config, leave it to cfg's."""
    return (fam or family(cfg.model.arch)).layouts and (cfg.parallel.tensor, cfg.parallel.pipeline) != (1, 1)


def precision_mode(cfg: Config) -> str:
    """'bf16' where modules run in 16 bits without autocast (the pipeline engine; fp16 takes the same
    bytes), else 'autocast' (train.py's loop: DDP with fp32 weights, ZeRO with 16-bit weights)."""
    return "bf16" if uses_pipeline_engine(cfg) and on_deepspeed(cfg) else "autocast"


def model_states(
    psi: int, stage: int, nd: int, offload_optimizer: bool = False, offload_params: bool = False, muon_params: int = 0
) -> dict[str, float]:
    """Bytes per GPU of weights, grads and optimizer (ZeRO paper, mixed-precision Adam: 2 + 2 + 12
    bytes a parameter, the stage's part divided over nd ranks), and bytes on the host. Muon keeps
    one buffer a matrix where Adam keeps two: 8 bytes for each of its `muon_params` (DDP only)."""
    weights = 2 * psi / nd if stage == 3 else 2 * psi
    grads = 2 * psi / nd if stage >= 2 else 2 * psi
    optimizer = (12 * psi - 4 * muon_params) / nd if stage >= 1 else 12 * psi - 4 * muon_params
    host = 0.0
    if offload_optimizer:
        host += optimizer
        optimizer = 0.0
    if offload_params:
        host += weights
        weights = 0.0
    return {"weights": weights, "grads": grads, "optimizer": optimizer, "host": host}


def at_stage(cfg: Config, stage: int, offload_optimizer: bool = False, offload_params: bool = False) -> Config:
    """The config on ZeRO `stage` (a ddp config at stage 0 stays ddp; any other runs DeepSpeed)."""
    strategy = DDP if stage == 0 and not on_deepspeed(cfg) else DEEPSPEED
    return changed(
        cfg,
        **{
            "run.strategy": strategy,
            "deepspeed.zero_stage": stage if strategy == DEEPSPEED else cfg.deepspeed.zero_stage,
            "deepspeed.offload_optimizer": offload_optimizer,
            "deepspeed.offload_params": offload_params,
        },
    )


def for_pipeline_engine(cfg: Config) -> Config:
    """The config moved onto the pipeline engine: DeepSpeed at ZeRO 0 or 1, offload kept where allowed."""
    stage = min(zero_stage(cfg), 1)
    new = at_stage(cfg, stage, cfg.deepspeed.offload_optimizer and stage > 0)
    return new if on_deepspeed(new) else changed(new, **{"run.strategy": DEEPSPEED, "deepspeed.zero_stage": 0})


def describe(cfg: Config) -> str:
    """The strategy in words: "DDP (ZeRO stage 0)", "DeepSpeed ZeRO stage 2 + optimizer offload"."""
    if not on_deepspeed(cfg):
        return "DDP (ZeRO stage 0)"
    ds = cfg.deepspeed
    extras = [x for x, on in (("optimizer offload", ds.offload_optimizer), ("param offload", ds.offload_params)) if on]
    return f"DeepSpeed ZeRO stage {ds.zero_stage}" + (" + " + ", ".join(extras) if extras else "")


def layout_problems(cfg: Config) -> list[Problem]:
    """A tensor or pipeline layout needs DeepSpeed's pipeline engine, which shards only optimizer state."""
    tp, pp = cfg.parallel.tensor, cfg.parallel.pipeline
    degrees = ("parallel.tensor", "parallel.pipeline")
    if not on_deepspeed(cfg):
        return [
            Problem(
                f"parallel.tensor={tp}/parallel.pipeline={pp} run on DeepSpeed's pipeline engine and "
                f"tensor-parallel layers; set run.strategy={DEEPSPEED}",
                "run.strategy",
                *degrees,
            )
        ]
    if cfg.deepspeed.zero_stage > 1:
        return [
            Problem(
                f"deepspeed.zero_stage={cfg.deepspeed.zero_stage} with parallel.tensor={tp}, "
                f"parallel.pipeline={pp}: these layouts run on DeepSpeed's pipeline engine, which "
                "shards only optimizer state; use deepspeed.zero_stage=1 (or 0)",
                "deepspeed.zero_stage",
                *degrees,
            )
        ]
    return []


def precision_problems(cfg: Config, precision: str, gpu_name: str) -> list[Problem]:
    """fp16 needs a loss scaler: DeepSpeed's comes with ZeRO 1-3, not with stage 0."""
    if precision == "fp16" and on_deepspeed(cfg) and cfg.deepspeed.zero_stage == 0:
        refusal = fp16_zero0_refusal(cfg.run.dtype, gpu_name)
        return [Problem(refusal, "deepspeed.zero_stage", "run.dtype", "cluster.gpu_type")]
    return []
