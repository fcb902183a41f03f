"""The precision training computes in, decided in one place from run.dtype and the GPU:

    auto   bf16 on a GPU that has it (compute capability 8.0 on: A100, H100, L40S, RTX 4090), fp16
           with dynamic loss scaling on one without (V100), fp32 on a CPU
    bf16   bf16 autocast (or bf16 weights, where a strategy keeps them); refused, in one line, on a GPU without bf16
    fp16   fp16 autocast with dynamic loss scaling (or fp16 weights and the strategy's own scaler);
           honoured on a CPU too, which is how the tests run this path
    fp32   no autocast

run.fp8 (tensorwise | rowwise) puts the linear layers' matmuls in fp8 on top of bf16, on a GPU with
fp8 (compute capability 8.9 on) and compiled (strategies/fp8.py); emulated on a CPU. fp8_problem
says why it cannot run, to the ranks and to `plan` and `check` alike.

The ranks resolve it from their device (distributed.resolve_precision), `plan` and `check` from
cluster.gpu_type (gpus.py says which GPUs have bf16; rules.precision_problems refuses bf16 there).
No torch here.

Loss scaling: fp16 ends at 65504 and flushes gradients below about 6e-8 to 0, so the loss is
multiplied by a scale before backward and the gradients divided by it before clipping and the
update. A step whose gradients hold inf or NaN (the scale was too large) is skipped: no update,
the scale halves. After SCALE_WINDOW steps without one the scale doubles. DDP (torch's GradScaler)
and a strategy with its own scaler start at 2**INITIAL_SCALE_POWER.
"""

from __future__ import annotations

from .config import Config, ConfigError
from .gpus import find_answer

INITIAL_SCALE_POWER = 16  # first loss scale 2**16 (GradScaler's default)
SCALE_WINDOW = 1000  # steps without an overflow before the scale doubles


def resolve(requested: str, on_gpu: bool, gpu_has_bf16: bool, gpu_name: str) -> str:
    """'bf16', 'fp16' or 'fp32' for run.dtype on a device; ConfigError for bf16 on a GPU without it.
    Resolving a resolved value gives it back."""
    if requested == "auto":
        if not on_gpu:
            return "fp32"
        return "bf16" if gpu_has_bf16 else "fp16"
    if requested == "bf16" and on_gpu and not gpu_has_bf16:
        raise ConfigError(bf16_refusal(gpu_name), key="run.dtype")
    return requested


def bf16_refusal(gpu_name: str) -> str:
    return (
        f"run.dtype=bf16 but the {gpu_name} has no bf16 (it came with compute capability 8.0: A100, H100); "
        "set run.dtype=fp16 (loss-scaled) or run.dtype=auto, which picks fp16 there"
    )


def fp8_problem(
    fp8: str,
    precision: str,
    *,
    on_gpu: bool,
    gpu_has_fp8: bool,
    gpu_name: str,
    compiled: bool | None,
    eager_reason: str | None = None,
) -> str | None:
    """Why run.fp8 cannot train here, or None. precision: run.dtype resolved; compiled: whether the
    model is compiled (None: not known yet, as in plan and check); eager_reason: why the strategy
    leaves it uncompiled, and how to change that."""
    if fp8 == "off":
        return None
    if on_gpu and not gpu_has_fp8:
        return (
            f"run.fp8={fp8} but the {gpu_name} has no fp8 matmuls (they came with compute capability 8.9: "
            "H100, H200, H800, L40S, RTX 4090); set run.fp8=off"
        )
    if precision not in ("bf16", "fp32") or (on_gpu and precision != "bf16"):
        return (
            f"run.fp8={fp8} multiplies in fp8 around bf16, but the run computes in {precision}; "
            "set run.dtype=bf16 (or auto on a GPU with fp8)"
        )
    if on_gpu and compiled is False:
        return (
            f"run.fp8={fp8} needs the model compiled on a GPU: uncompiled, its scaling and casts cost more "
            f"than the fp8 matmuls save; set run.compile=true{f' ({eager_reason})' if eager_reason else ''}, "
            "or run.fp8=off"
        )
    return None


def fp8_note(fp8: str, on_gpu: bool) -> str:
    """What the run's first line adds to its precision."""
    if fp8 == "off":
        return ""
    return f" + fp8 {fp8} matmuls (torchao)" + ("" if on_gpu else " emulated on the CPU")


def on_gpu_type(cfg: Config) -> str:
    """The precision cfg trains in on cluster.gpu_type, for plan and check: 'auto' resolved by the
    GPU table, anything else as asked (rules.precision_problems judges bf16 there)."""
    found = find_answer(cfg.cluster.gpu_type)
    if cfg.run.dtype != "auto" or found is None:
        return cfg.run.dtype if cfg.run.dtype != "auto" else "bf16"
    return "bf16" if found[0].has_bf16 else "fp16"
