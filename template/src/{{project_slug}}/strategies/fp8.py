"""fp8 matmuls for training (run.fp8): the model's linear layers swapped in place for torchao's
Float8Linear, which casts each matmul's inputs to fp8 with dynamic scales (one per tensor under
`tensorwise`, one per row under `rowwise`), multiplies on the GPU's fp8 tensor cores and returns
bf16 (under FSDP2 with `tensorwise`, the blocks' weights are gathered in fp8). Weights, optimizer
state and checkpoints stay as they were: the state dict has the same keys,
so a run resumes, evaluates and exports with fp8 on or off.

Left in bf16: the output head (its logits feed the loss, where fp8's three significant bits cost
accuracy; nanochat and torchtitan keep it too) and layers whose sizes are not multiples of 16, which
the fp8 kernels cannot take. On a CPU the matmuls are emulated (same casts, fp32 arithmetic): how
the tests run this path. The refusals (a GPU without fp8, another precision than bf16, uncompiled)
are precision.fp8_problem's, shared with `check` and `plan`.
"""

from __future__ import annotations

import dataclasses

import torch

from ..runtime.distributed import gpu_capability
from ..runtime.run_context import Run
from ..settings import precision
from ..settings.config import ConfigError
from ..settings.packages import require_package
from .common import compiled
from .memory import strategy_plan


def require_fp8(run: Run) -> None:
    """ConfigError (key run.fp8) where this device cannot train with run.fp8 (fp8 matmuls from
    compute capability 8.9; a CPU emulates them)."""
    device = run.device
    capability, name = gpu_capability(device)
    problem = precision.fp8_problem(
        run.cfg.run.fp8,
        run.precision,
        on_gpu=device.type == "cuda",
        gpu_has_fp8=capability >= (8, 9),
        gpu_name=name,
        compiled=compiled(run.cfg.run, device)[0],
    )
    if problem:
        raise ConfigError(problem, key="run.fp8")


def convertible(module: torch.nn.Module, name: str, head: str = "lm_head") -> bool:
    """Whether the linear layer `name` multiplies in fp8: not the output head (the family names it),
    sizes the kernels take."""
    if name.rsplit(".", 1)[-1] == head or not isinstance(module, torch.nn.Linear):
        return False
    return module.in_features % 16 == 0 and module.out_features % 16 == 0


def to_float8(model: torch.nn.Module, run: Run) -> torch.nn.Module:
    """The model with its convertible linear layers multiplying in fp8 (in place), per run.fp8."""
    require_fp8(run)
    # A project's own dependency, imported only here; its import noise: cli.QUIET_LOGGERS.
    float8 = require_package("torchao.float8", "", f"run.fp8={run.cfg.run.fp8}", "or set run.fp8=off")
    recipe = float8.Float8LinearConfig.from_recipe_name(run.cfg.run.fp8)
    # Where the strategy gathers sharded weights (FSDP2), on GPUs a tensorwise weight is gathered in
    # fp8 (half of bf16's bytes; Gloo has no fp8 type); a rowwise scale needs the whole row: bf16.
    fp8_gather = strategy_plan(run.cfg).gathers_fp8 and run.cfg.run.fp8 == "tensorwise" and run.device.type == "cuda"
    config = dataclasses.replace(recipe, emulate=run.device.type != "cuda", enable_fsdp_float8_all_gather=fp8_gather)
    head = run.family.output_head
    return float8.convert_to_float8_training(
        model, config=config, module_filter_fn=lambda module, name: convertible(module, name, head)
    )
