"""What every strategy does the same way: which parameters get weight decay (AdamW's groups), the
global gradient norm they log and clip by, and whether the model is compiled.

Every strategy compiles on CUDA: DDP the module before wrapping it, an engine its wrapped module,
the pipeline each layer of its stage (the schedule between them stays eager). CPU runs stay eager:
they are the tests' runs, and Inductor's C++ build would cost each process minutes.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from ..settings.config import RunConfig


def compiled(run: RunConfig, device) -> tuple[bool, str]:
    """Whether the model is compiled on `device` under run.compile, and the note saying so."""
    if not run.compile:
        return False, "eager (run.compile=false)"
    if device.type != "cuda":
        return False, f"eager on {device.type} (run.compile applies on CUDA)"
    return True, "compiled"


def norm_dtype(device: torch.device) -> torch.dtype:
    """fp64, as the sharded strategies use, except where the device has none (Apple's MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


def global_grad_norm(grads: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of all grads as one vector, as a float32 scalar (inf or NaN if a gradient is)."""
    if not grads:
        return torch.zeros(())
    norms = torch._foreach_norm(grads, 2, dtype=norm_dtype(grads[0].device))
    return torch.linalg.vector_norm(torch.stack(norms)).float()


def clip_gradients(
    parameters: Iterable[torch.nn.Parameter], max_norm: float | None, norm: torch.Tensor | None = None
) -> torch.Tensor:
    """Scale the gradients so that their global norm is at most max_norm (0 or None: leave them);
    returns the norm before clipping (given: a norm taken over more than these parameters, as the
    pipeline's over every stage). The factor is torch's: max_norm / (norm + 1e-6), at most 1."""
    params = [p for p in parameters if p.grad is not None]
    norm = global_grad_norm([p.grad for p in params]) if norm is None else norm
    if max_norm:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, norm)
    return norm


def skip_step(optimizer: torch.optim.Optimizer, skip: torch.Tensor, update, scaled: bool = False) -> None:
    """Run update() (the optimizer's step, maybe through the loss scaler) so that it changes nothing
    where skip (a device bool tensor) is set, decided on the device: the host never waits for the
    verdict. Optimizers that take `found_inf` (ours; torch's fused ones, unless the loss scaler hands
    them its own: scaled) leave the step out themselves. For any other (torch's unfused AdamW, which
    this package builds on a CPU only) the weights and state the step changed are put back; state the
    step created (its first) goes back to AdamW's start, zeros."""
    if getattr(optimizer, "takes_found_inf", False) or (optimizer.defaults.get("fused") and not scaled):
        optimizer.found_inf = skip.to(torch.float32)
        try:
            update()
        finally:
            del optimizer.found_inf
        return
    params = [p for group in optimizer.param_groups for p in group["params"]]
    with torch.no_grad():
        before = {id(t): t.clone() for t in params + _state_tensors(optimizer)}
    update()
    with torch.no_grad():
        for t in params + _state_tensors(optimizer):
            old = before.get(id(t))
            t.copy_(torch.where(skip.to(t.device), old if old is not None else torch.zeros_like(t), t))


def _state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for state in optimizer.state.values() for v in state.values() if torch.is_tensor(v)]


def param_groups(model, weight_decay: float) -> list[dict]:
    """AdamW groups: weight decay shrinks matrices toward 0; on embedding tables it only hurts rare tokens."""

    def decays(name, p):
        return p.dim() >= 2 and not any(key in name for key in ("wte", "wpe", "embeddings"))

    named = list(model.named_parameters())
    return [
        {"params": [p for n, p in named if decays(n, p)], "weight_decay": weight_decay},
        {"params": [p for n, p in named if not decays(n, p)], "weight_decay": 0.0},
    ]
