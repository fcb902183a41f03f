"""What DeepSpeed keeps on a GPU and what it allows, without torch (strategies/memory.py finds PLAN; its config section is settings.py):
ZeRO stage 0-3 shards the optimizer state (1), the gradients too (2), the weights too (3) over the
data-parallel ranks; the optimizer offloaded to the host from stage 1, the weights at stage 3. Tensor
and pipeline layouts run on its pipeline engine (pipeline.py): ZeRO 0-1, modules in 16 bits.
"""

from __future__ import annotations

from ...settings.config import Config, ConfigError, Problem, changed
from ...settings.precision import fp8_problem
from ...settings.sharding import Sharding
from ..memory import StrategyPlan


def fp16_zero0_refusal(dtype: str, gpu_name: str) -> str:
    """DeepSpeed (0.19) scales no loss under fp16 without ZeRO, yet divides the gradients by the scale:
    updates 65536 times too small (deepspeedai/DeepSpeed#8393)."""
    how = "run.dtype=fp16" if dtype == "fp16" else f"run.dtype={dtype} trains in fp16 on the {gpu_name} (no bf16)"
    return (
        f"{how} with deepspeed.zero_stage=0: DeepSpeed's fp16 without ZeRO does not scale the loss, so its "
        "updates come out 65536 times too small; use deepspeed.zero_stage=1, or run.strategy=ddp (the same "
        "data parallelism with torch's GradScaler)"
    )


class DeepSpeedPlan(StrategyPlan):
    name = "deepspeed"
    label = "DeepSpeed"
    stages = (0, 1, 2, 3)
    runs_layouts = True
    runs_muon = False  # its optimizer steps flat shards
    builds = "deepspeed.engine:DeepSpeedStrategy"
    builds_layouts = "deepspeed.pipeline:PipelineStrategy"
    plan_arguments = (
        (
            ("--zero-stage",),
            dict(
                type=int, choices=range(4), help="0 = DDP; default: the config's (run.strategy, deepspeed.zero_stage)"
            ),
        ),
        (
            ("--offload-optimizer",),
            dict(action="store_true", default=None, help="optimizer states in host memory (DeepSpeed)"),
        ),
        (("--offload-params",), dict(action="store_true", default=None, help="weights in host memory (ZeRO-3)")),
    )

    def at(self, cfg: Config, sharding: Sharding) -> Config:
        return changed(
            cfg,
            **{
                "run.strategy": self.name,
                "deepspeed.zero_stage": sharding.stage,
                "deepspeed.offload_optimizer": sharding.offload_optimizer,
                "deepspeed.offload_params": sharding.offload_params,
            },
        )

    def settings(self, old: Config, new: Config) -> tuple[list[str], list[str]]:
        keys, answers = super().settings(old, new)
        ds_old, ds_new = old.deepspeed, new.deepspeed
        keys.append(f"deepspeed.zero_stage={ds_new.zero_stage}")
        for name in ("offload_optimizer", "offload_params"):
            if getattr(ds_new, name) != getattr(ds_old, name):
                keys.append(f"deepspeed.{name}={str(getattr(ds_new, name)).lower()}")
        return keys, [*answers, f"zero_stage={ds_new.zero_stage}"]

    def describe(self, cfg: Config) -> str:
        ds = cfg.deepspeed
        extras = [
            x for x, on in (("optimizer offload", ds.offload_optimizer), ("param offload", ds.offload_params)) if on
        ]
        return f"DeepSpeed ZeRO stage {ds.zero_stage}" + (" + " + ", ".join(extras) if extras else "")

    def describe_sharding(self, sharding: Sharding) -> str:
        return (
            f"ZeRO stage {sharding.stage}"
            + (" with the optimizer offloaded to CPU" if sharding.offload_optimizer else "")
            + (" and the parameters offloaded" if sharding.offload_params else "")
        )

    def precision_mode(self, cfg: Config) -> str:
        from ..memory import uses_pipeline_engine

        return "bf16" if uses_pipeline_engine(cfg) else "autocast"

    def for_layouts(self, cfg: Config) -> Config:
        """At ZeRO 0 or 1, offload kept where allowed."""
        stage = min(cfg.sharding().stage, 1)
        return self.at(cfg, Sharding(stage, cfg.deepspeed.offload_optimizer and stage > 0))

    def layout_problems(self, cfg: Config) -> list[Problem]:
        """The pipeline engine shards only optimizer state."""
        if cfg.deepspeed.zero_stage <= 1:
            return []
        tp, pp = cfg.parallel.tensor, cfg.parallel.pipeline
        return [
            Problem(
                f"deepspeed.zero_stage={cfg.deepspeed.zero_stage} with parallel.tensor={tp}, "
                f"parallel.pipeline={pp}: these layouts run on DeepSpeed's pipeline engine, which "
                "shards only optimizer state; use deepspeed.zero_stage=1 (or 0)",
                "deepspeed.zero_stage",
                "parallel.tensor",
                "parallel.pipeline",
            )
        ]

    def precision_problems(self, cfg: Config, precision: str, gpu_name: str) -> list[Problem]:
        if precision == "fp16" and cfg.deepspeed.zero_stage == 0:
            refusal = fp16_zero0_refusal(cfg.run.dtype, gpu_name)
            return [Problem(refusal, "deepspeed.zero_stage", "run.dtype", "cluster.gpu_type")]
        return []

    def fp8_problems(self, cfg: Config) -> list[Problem]:
        if cfg.deepspeed.zero_stage == 3:  # ZeRO-3 runs eager (engine.py zero_compiled)
            eager = fp8_problem(
                cfg.run.fp8,
                "bf16",
                on_gpu=True,
                gpu_has_fp8=True,
                gpu_name="GPU",
                compiled=False,
                eager_reason="ZeRO-3 runs eager: use deepspeed.zero_stage 1 or 2",
            )
            return [Problem(eager, "run.fp8", "run.dtype", "cluster.gpu_type")]
        if cfg.parallel.tensor == 1:
            return []
        refusal = (
            f"run.fp8={cfg.run.fp8} with parallel.tensor={cfg.parallel.tensor}: the tensor-parallel shards "
            "(DeepSpeed's LinearLayer and LinearAllreduce) have no fp8 path, so the blocks would stay in bf16; "
            "use parallel.tensor=1 (pipeline and data parallelism take fp8), or run.fp8=off"
        )
        return [Problem(refusal, "run.fp8", "parallel.tensor")]

    def setting_problems(self, cfg: Config) -> list[Problem]:
        factor = cfg.optim.loss_spike_factor
        if not factor or not factor > 1 or factor == float("inf"):
            return []  # a factor of 1 or less is the shared rule's (planning/rules.py)
        return [
            Problem(
                f"optim.loss_spike_factor={factor:g}: under DeepSpeed the engine applies each update before a "
                "verdict could leave a spiking step out (it leaves out steps with non-finite gradients "
                "itself); set optim.loss_spike_factor=0, or run.strategy=ddp",
                "optim.loss_spike_factor",
                "run.strategy",
            )
        ]

    def with_plan_flags(self, cfg: Config, args) -> Config:
        """--zero-stage sets the stage (offload off unless its flags say); the offload flags alone add
        to the config's stage."""
        from ..memory import at_stage

        stage, offload_opt, offload_params = args.zero_stage, args.offload_optimizer, args.offload_params
        if stage is None and offload_opt is None and offload_params is None:
            return cfg
        if stage is None:
            now = cfg.sharding()
            stage, offload_opt, offload_params = (
                now.stage,
                offload_opt or now.offload_optimizer,
                offload_params or now.offload_params,
            )
        if offload_params and stage != 3:
            raise ConfigError("--offload-params needs --zero-stage 3 (DeepSpeed offloads parameters only in stage 3)")
        if offload_opt and stage == 0:
            raise ConfigError("--offload-optimizer needs --zero-stage 1, 2 or 3 (DDP keeps the optimizer on the GPU)")
        return at_stage(cfg, stage, bool(offload_opt), bool(offload_params))


PLAN = DeepSpeedPlan()
