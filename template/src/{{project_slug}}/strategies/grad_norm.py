"""The global gradient norm that DDP and DeepSpeed ZeRO 0 log and clip by, computed the way
DeepSpeed's ZeRO 1-3 compute theirs: each gradient's norm accumulated in fp64, then the root of
the sum of their squares.

    from .grad_norm import clip_gradients
    grad_norm = clip_gradients(model.parameters(), cfg.optim.grad_clip)   # the norm before clipping

torch's clip_grad_norm_ takes each norm in the gradients' own dtype: on a CPU the fp32 norm of the
tiny GPT's 2048x64 output-head gradient was 1.8e-5 (relative) off its fp64 value, and the global
norm DDP logged as far off ZeRO's. With fp64 on both sides, DDP and ZeRO 0-3 log the same norm and
scale the gradients by the same factor to 1e-7. The per-gradient norms come from torch._foreach_norm,
as in torch's own clipping: on a GPU one multi-tensor kernel (and its cleanup) instead of a launch
per gradient; on a CPU the same per-tensor loop as before, bit for bit. All stays on the device:
nothing waits for the GPU until a logging step reads the norm.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def norm_dtype(device: torch.device) -> torch.dtype:
    """fp64, as DeepSpeed uses, except where the device has none (Apple's MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


def global_grad_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of all grads as one vector, as a float32 scalar (inf or NaN if a gradient is)."""
    if not grads:
        return torch.zeros(())
    norms = torch._foreach_norm(grads, 2, dtype=norm_dtype(grads[0].device))
    return torch.linalg.vector_norm(torch.stack(norms)).float()


def clip_gradients(parameters: Iterable[torch.nn.Parameter], max_norm: float | None) -> torch.Tensor:
    """Scale the gradients so that their global norm is at most max_norm (0 or None: leave them);
    returns the norm before clipping. The factor is torch's: max_norm / (norm + 1e-6), at most 1."""
    params = [p for p in parameters if p.grad is not None]
    norm = global_grad_norm([p.grad for p in params])
    if max_norm:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm
