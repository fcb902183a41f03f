"""What each strategy keeps on a GPU and what it allows, without torch: plan, fit and check ask here;
the strategies' modules do what it describes.

A data-parallel strategy shards the model states over the data ranks in stages (settings/sharding.py):
0 keeps a full replica on every rank (16 bytes a parameter under mixed-precision Adam), 1 shards the
optimizer state, 2 the gradients too, 3 the weights too. DDP is stage 0 (StrategyPlan below). A strategy folder that shards
further brings its own plan (strategies/<name>/plan.py: PLAN, a StrategyPlan), found here.

    cfg.sharding()                           # settings/sharding.py's Sharding: stage 0 for ddp
    model_states(psi, sharding, nd)          # bytes per GPU: weights, grads, optimizer (+ host)
    at_stage(cfg, 2)                         # the config at stage 2 on a strategy that has it (fit's candidates)
    strategy_plan(cfg).problems(cfg, ...)    # what the strategy refuses for this layout and precision
"""

from __future__ import annotations

import functools
import importlib
from pathlib import Path

from ..models.family import Family, family
from ..settings.config import Config, Problem, changed
from ..settings.sharding import Sharding


class StrategyPlan:
    """What plan, fit and check know of one strategy; this class is DDP's (stage 0, no layouts)."""

    name = "ddp"
    label = "DDP"
    stages: tuple[int, ...] = (0,)
    runs_layouts = False  # runs a family's tensor and pipeline layouts
    runs_muon = True  # steps optim.optimizer=muon (each matrix whole for its orthogonalisation)
    muon_state_sharded = True  # Muon's momentum split over the data ranks (DDP: a replica anyway)
    gathers_fp8 = False  # gathers run.fp8=tensorwise weights already in fp8 (sharded weights, on GPUs)
    builds = "ddp:DDPStrategy"  # module (under strategies/) and class of its base.Strategy
    builds_layouts: str | None = None  # the same for tensor and pipeline layouts, where it runs them
    plan_arguments: tuple[tuple[tuple[str, ...], dict], ...] = ()  # `plan`'s own flags of this strategy

    def at(self, cfg: Config, sharding: Sharding) -> Config:
        """cfg on this strategy with `sharding` (a stage in self.stages)."""
        return changed(cfg, **{"run.strategy": self.name})

    def settings(self, old: Config, new: Config) -> tuple[list[str], list[str]]:
        """The config keys that take old to new's sharding, and the copier answers that write them."""
        if new.run.strategy == old.run.strategy:
            return [], []
        return [f"run.strategy={self.name}"], [f"strategy={self.name}"]

    def describe(self, cfg: Config) -> str:
        return f"{self.label} (a full replica on every rank)"

    def describe_sharding(self, sharding: Sharding) -> str:
        return f"sharding stage {sharding.stage}"

    def precision_mode(self, cfg: Config) -> str:
        """'bf16' where modules run in 16 bits without autocast, else 'autocast' (train.py's loop)."""
        return "autocast"

    def gathered_bytes(self, cfg: Config, shape: dict, vocab_size: int, precision: str) -> float:
        """Bytes per GPU of sharded weights gathered whole (and their unsharded gradients) at the peak
        of a step, beyond model_states' sharded parts; a strategy that keeps a replica gathers none."""
        return 0.0

    def for_layouts(self, cfg: Config) -> Config:
        """cfg moved onto this strategy to run a tensor or pipeline layout (runs_layouts only)."""
        raise NotImplementedError

    def layout_problems(self, cfg: Config) -> list[Problem]:
        """What this strategy refuses of a tensor or pipeline layout."""
        runners = [p.name for p in strategy_plans().values() if p.runs_layouts]
        tp, pp = cfg.parallel.tensor, cfg.parallel.pipeline
        fix = f"set run.strategy={' or '.join(runners)}" if runners else "set both to 1"
        return [
            Problem(
                f"parallel.tensor={tp}/parallel.pipeline={pp}: run.strategy={self.name} runs no tensor or pipeline "
                f"layout; {fix}",
                "run.strategy",
                "parallel.tensor",
                "parallel.pipeline",
            )
        ]

    def precision_problems(self, cfg: Config, precision: str, gpu_name: str) -> list[Problem]:
        """What this strategy refuses for the precision on the GPU."""
        return []

    def fp8_problems(self, cfg: Config) -> list[Problem]:
        """What this strategy refuses of run.fp8 (an eager model, its layers) where the shared fp8 rule allows it."""
        return []

    def setting_problems(self, cfg: Config) -> list[Problem]:
        """What this strategy refuses of the settings it reads (its own section, the optimizer's)."""
        return []

    def with_plan_flags(self, cfg: Config, args) -> Config:
        """cfg with this strategy's `plan` flags (plan_arguments) applied, as parsed into args."""
        return cfg


DDP = StrategyPlan()


@functools.cache
def strategy_plans() -> dict[str, StrategyPlan]:
    """Every strategy the project holds: DDP, and each strategy folder's plan.py PLAN."""
    plans = {DDP.name: DDP}
    package = __package__
    for path in sorted(Path(__file__).resolve().parent.glob("*/plan.py")):
        plan = importlib.import_module(f"{package}.{path.parent.name}.plan").PLAN
        plans[plan.name] = plan
    return plans


def strategy_plan(cfg: Config) -> StrategyPlan:
    """The plan of run.strategy (DDP's where the project lacks it: the rules refuse that setting)."""
    return strategy_plans().get(cfg.run.strategy, DDP)


def uses_pipeline_engine(cfg: Config, fam: Family | None = None) -> bool:
    """A tensor or pipeline layout of a family that has them: a strategy that runs layouts runs it.
    fam: the run's family (Run.family); plan and check, asking of any config, leave it to cfg's."""
    return (fam or family(cfg.model.arch)).layouts and (cfg.parallel.tensor, cfg.parallel.pipeline) != (1, 1)


def precision_mode(cfg: Config) -> str:
    return strategy_plan(cfg).precision_mode(cfg)


def model_states(
    psi: int, sharded: Sharding, nd: int, muon_params: int = 0, muon_whole: bool = False
) -> dict[str, float]:
    """Bytes per GPU of weights, grads and optimizer (mixed-precision Adam: 2 + 2 + 12 bytes a
    parameter, the stage's part divided over nd ranks), and bytes on the host. Muon keeps one buffer a
    matrix where Adam keeps two: 8 bytes for each of its `muon_params`. muon_whole: that buffer is
    whole on every rank (a strategy that gathers each matrix for Muon: plan.muon_state_sharded)."""
    stage = sharded.stage
    weights = 2 * psi / nd if stage == 3 else 2 * psi
    grads = 2 * psi / nd if stage >= 2 else 2 * psi
    whole = 4 * muon_params if muon_whole and stage >= 1 else 0
    optimizer = (12 * psi - 4 * muon_params - whole) / nd + whole if stage >= 1 else 12 * psi - 4 * muon_params
    host = 0.0
    if sharded.offload_optimizer and stage >= 1:
        host += optimizer
        optimizer = 0.0
    if sharded.offload_params and stage == 3:
        host += weights
        weights = 0.0
    return {"weights": weights, "grads": grads, "optimizer": optimizer, "host": host}


def at_stage(cfg: Config, stage: int, offload_optimizer: bool = False, offload_params: bool = False) -> Config | None:
    """The config at sharding `stage`: on its own strategy where that has the stage, else on the first
    strategy the project holds that has it; None where none has."""
    own = strategy_plan(cfg)
    plans = [own, *strategy_plans().values()]
    plan = next((p for p in plans if stage in p.stages), None)
    return plan and plan.at(cfg, Sharding(stage, offload_optimizer, offload_params))


def for_pipeline_engine(cfg: Config) -> Config | None:
    """The config moved onto a strategy that runs layouts (None where the project holds none)."""
    own = strategy_plan(cfg)
    plan = next((p for p in (own, *strategy_plans().values()) if p.runs_layouts), None)
    return plan and plan.for_layouts(cfg)


def describe(cfg: Config) -> str:
    """The strategy in words: "DDP (a full replica on every rank)", or a sharding strategy's stage."""
    return strategy_plan(cfg).describe(cfg)


def layout_problems(cfg: Config) -> list[Problem]:
    """What run.strategy refuses of the config's tensor or pipeline layout."""
    return strategy_plan(cfg).layout_problems(cfg)


def strategy_problems(cfg: Config, precision: str, gpu_name: str, fp8_allowed: bool) -> list[Problem]:
    """What run.strategy refuses of the settings it reads, of the precision on the GPU, and of run.fp8
    where the shared fp8 rule allows it (fp8_allowed)."""
    plan = strategy_plan(cfg)
    fp8 = plan.fp8_problems(cfg) if fp8_allowed and cfg.run.fp8 != "off" else []
    return plan.setting_problems(cfg) + plan.precision_problems(cfg, precision, gpu_name) + fp8
