"""The optimizer of a run: AdamW for every parameter (optim.optimizer=adamw), or Muon for the blocks'
matrices beside AdamW for the embeddings, the head and the scalars (optim.optimizer=muon, nanochat's
recipe), each group with its own learning rate (models/gpt/descriptor.py derives them for the run).

    optimizer = build_optimizer(model, run)          # run: runtime.run_context.Run
    set_schedule(optimizer, schedule.at(step, cfg.schedule))   # every step (training/schedule.py)

Muon's update for a matrix (Jordan et al. 2024; the variant nanochat trains with):
  1. Nesterov momentum of the gradient;
  2. orthogonalised by five Polar Express iterations (Amsel et al. 2025: a quintic polynomial per
     iteration, its coefficients chosen for that iteration), on the matrix scaled to spectral norm
     below 1, in bf16 on a GPU; its rows equalised before (MuonEq) and its norm set after (Muon+);
  3. NorMuon's variance reduction (Li et al. 2025): a running second moment per row (or column, the
     longer side's neurons) rescales the orthogonalised update, keeping its overall norm;
  4. cautious weight decay: decay only where the update and the weight agree in sign;
  5. the step, lr scaled by sqrt(max(1, rows / columns)).
Matrices of one shape are stacked and handled together. The orthogonalisation, the only costly part,
is spread over the data-parallel ranks: each orthogonalises its share of a stack and an all-gather
hands every rank the whole (the gradients are already averaged: DDP all-reduced them), so steps
3-5 run everywhere on the same numbers and every rank keeps the whole state. A checkpoint then holds
the state of every matrix, written by rank 0, and resumes on any number of ranks. Under FSDP2
(strategies/fsdp/) the matrices are sharded by rows: their gradients are gathered whole first (the
same numbers as DDP's from there on) and each rank writes the update into the rows it holds.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch.optim.adamw import adamw

from ..models.family import peak_lrs_line
from .common import param_groups

# Polar Express: (a, b, c) of X <- a X + b (X X^T) X + c (X X^T)^2 X for iterations 1..5 (the paper's
# values for five iterations with a safety factor of 2e-2).
POLAR_EXPRESS = (
    (8.156554524902461, -22.48329292557795, 15.878769915207462),
    (4.042929935166739, -2.808917465908714, 0.5000178451051316),
    (3.8916678022926607, -2.772484153217685, 0.5060648178503393),
    (3.285753657755655, -2.3681294933425376, 0.46449024233003106),
    (2.3465413258596377, -1.7097828382687081, 0.42323551169305323),
)


def orthogonalize(g: torch.Tensor) -> torch.Tensor:
    """A stack (K, m, n) of matrices -> their nearest semi-orthogonal matrices (approximately:
    singular values near 1), iterating on the smaller Gram matrix. Each row is first scaled to the
    matrix's mean row norm (MuonEq: a better-conditioned spectrum going in), and the result's
    Frobenius norm set to sqrt(min(m, n)), an exactly semi-orthogonal matrix's (Muon+: five
    iterations stop short of it)."""
    x = g.bfloat16() if g.is_cuda else g.float()
    mean_row = x.float().norm(dim=(-2, -1), keepdim=True) / x.size(-2) ** 0.5
    x = x * (mean_row / x.float().norm(dim=-1, keepdim=True).clamp_min(1e-6)).to(x.dtype)
    tall = x.size(-2) > x.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) * 1.01 + 1e-6)  # spectral norm below 1
    for a, b, c in POLAR_EXPRESS:
        gram = x @ x.mT
        x = a * x + (b * gram + c * (gram @ gram)) @ x
    x = (x.mT if tall else x).to(g.dtype)
    return x * (min(x.shape[-2:]) ** 0.5 / x.float().norm(dim=(-2, -1), keepdim=True).clamp_min(1e-6)).to(x.dtype)


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A tensor a sharded strategy split over the ranks (a DTensor), gathered whole; others as they are."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def held_rows(param: torch.Tensor, values: torch.Tensor | None = None) -> torch.Tensor:
    """The part of `param` this rank holds (its local shard, or all of it); given `values` (the whole
    matrix's), the same part of those."""
    if not hasattr(param, "to_local"):
        return param if values is None else values
    if values is None:
        return param.to_local()
    from torch.distributed.tensor import distribute_tensor

    # Every rank holds the same whole values: each keeps its own part, nothing is sent.
    return distribute_tensor(values, param.device_mesh, param.placements, src_data_rank=None).to_local()


class MuonAdamW(torch.optim.Optimizer):
    """Groups of kind "muon" (matrices of one shape: lr, momentum, beta2, weight_decay) and of kind
    "adamw" (lr, betas, eps, weight_decay), stepped together.

    A caller may set `found_inf` (a 0-dim float tensor on the device, torch's name for it) before a
    step: where it is 1 the step changes nothing, weights and state alike, decided on the device
    (training/divergence.py)."""

    takes_found_inf = True

    def __init__(self, groups: list[dict], world_size: int = 1, rank: int = 0, fused: bool = False):
        super().__init__(groups, defaults={})
        self.world_size, self.rank, self.fused = world_size, rank, fused

    @torch.no_grad()
    def step(self, closure=None):
        found_inf = getattr(self, "found_inf", None)
        for group in self.param_groups:
            if group["kind"] == "muon":
                self._muon_step(group, found_inf)
            else:
                self._adamw_step(group, found_inf)

    def _adamw_step(self, group: dict, found_inf: torch.Tensor | None) -> None:
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        states = [self.state[p] for p in params]
        for p, state in zip(params, states):
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device if self.fused else "cpu")
                state["exp_avg"] = torch.zeros_like(p)
                state["exp_avg_sq"] = torch.zeros_like(p)
        beta1, beta2 = group["betas"]
        if found_inf is not None and not self.fused and found_inf.item():
            return  # only the fused kernels take found_inf (this path: Apple's MPS, where reading it is cheap)
        adamw(
            params,
            [p.grad for p in params],
            [s["exp_avg"] for s in states],
            [s["exp_avg_sq"] for s in states],
            [],
            [s["step"] for s in states],
            foreach=not self.fused,
            fused=self.fused or None,
            amsgrad=False,
            beta1=beta1,
            beta2=beta2,
            lr=group["lr"],
            weight_decay=group["weight_decay"],
            eps=group["eps"],
            maximize=False,
            **({"found_inf": found_inf} if found_inf is not None and self.fused else {}),
        )

    def _muon_step(self, group: dict, found_inf: torch.Tensor | None) -> None:
        params = group["params"]
        if params[0].grad is None:
            return
        grads = torch.stack([whole(p.grad) for p in params])  # a sharded strategy's matrices gathered
        # A step not to apply: gradients, the state's rates and the step times set to 0 (all finite, so the
        # product is exactly 0); the same numbers as without found_inf when it is 0.
        applied = None
        if found_inf is not None:
            applied = (found_inf == 0).to(grads.dtype)
            grads.masked_fill_(found_inf != 0, 0.0)
        state = self.state[params[0]]  # the group's state, kept with its first matrix
        if not state:
            rows, cols = params[0].shape
            state["momentum_buffer"] = torch.zeros_like(grads)
            # NorMuon's second moment: one value per neuron of the longer side.
            state["second_moment"] = grads.new_zeros((len(params), rows, 1) if rows >= cols else (len(params), 1, cols))
        momentum = group["momentum"]
        buf = state["momentum_buffer"]
        buf.lerp_(grads, 1 - momentum if applied is None else (1 - momentum) * applied)
        update = self._orthogonalized(grads.lerp_(buf, momentum))  # Nesterov: the gradient pulled toward the momentum

        rows, cols = update.shape[-2:]
        reduce_dim = -1 if rows >= cols else -2
        v_mean = update.square().mean(dim=reduce_dim, keepdim=True)
        norm_before = (v_mean.sum(dim=(-2, -1), keepdim=True) * update.size(reduce_dim)).sqrt()
        second = state["second_moment"]
        second.lerp_(v_mean, 1 - group["beta2"] if applied is None else (1 - group["beta2"]) * applied)
        scale = second.clamp_min(1e-10).rsqrt()
        norm_after = ((v_mean * update.size(reduce_dim)) * scale.square()).sum(dim=(-2, -1), keepdim=True).sqrt()
        update = update * (scale * (norm_before / norm_after.clamp_min(1e-10)))

        lr = group["lr"] * math.sqrt(max(1.0, rows / cols))
        held = [held_rows(p.detach()) for p in params]  # all of each matrix, or this rank's rows of it
        if hasattr(params[0], "to_local"):
            update = torch.stack([held_rows(p, u) for p, u in zip(params, update)])
        weights = torch.stack(held)
        agree = (update * weights) >= 0  # cautious weight decay
        delta = lr * update + (lr * group["weight_decay"]) * weights * agree
        weights.sub_(delta if applied is None else delta * applied)
        for target, new in zip(held, weights):
            target.copy_(new)

    def _orthogonalized(self, stack: torch.Tensor) -> torch.Tensor:
        """Each rank orthogonalises its share of the stack; an all-gather hands everyone the whole."""
        if self.world_size == 1:
            return orthogonalize(stack)
        per_rank = -(-stack.size(0) // self.world_size)
        padded = stack.new_zeros((per_rank * self.world_size, *stack.shape[1:]))
        padded[: stack.size(0)] = stack
        mine = orthogonalize(padded[self.rank * per_rank : (self.rank + 1) * per_rank]).contiguous()
        dist.all_gather_single(padded, mine)
        return padded[: stack.size(0)]


def set_schedule(optimizer: torch.optim.Optimizer, point) -> None:
    """This step's learning rates (each group's peak x point.lr_factor) and, for Muon's groups, its
    momentum and weight decay (peak x point.weight_decay_factor); AdamW's weight decay stays."""
    for group, (lr, weight_decay) in zip(optimizer.param_groups, optimizer.peaks):
        group["lr"] = lr * point.lr_factor
        if group.get("kind") == "muon":
            group["momentum"] = point.muon_momentum
            group["weight_decay"] = weight_decay * point.weight_decay_factor


def build_optimizer(model: torch.nn.Module, run):
    """optim.optimizer=adamw: torch's AdamW over common.param_groups at optim.lr. muon: a group per
    parameter role (the model's param_roles) at the run's family's derived hyper-parameters, Muon's
    matrices grouped by shape, orthogonalised over run's ranks. Every group keeps its peak in base_lr
    and base_weight_decay."""
    cfg, device = run.cfg, run.device
    fused = device.type == "cuda"
    o = cfg.optim
    if o.optimizer == "adamw":
        optimizer = torch.optim.AdamW(
            param_groups(model, o.weight_decay), lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, fused=fused
        )
        return with_peaks(optimizer)
    fam = run.family
    settings = fam.optimizer_groups(cfg, fam.shape(cfg.model.size, cfg.model.n_kv_head, cfg.model))
    roles = model.param_roles()
    named = list(model.named_parameters())
    groups = []
    for role, hyper in settings.items():
        params = [p for n, p in named if roles[n] == role]
        stacks = (
            [[p for p in params if p.shape == s] for s in sorted({p.shape for p in params})]
            if role == "matrix"
            else [params]
        )
        for stack in filter(None, stacks):
            groups.append({**hyper, "params": stack, "role": role})
    # torch's fused AdamW has a CPU kernel too, 4x the foreach path's speed there (10M parameters, one
    # thread: 10 against 43 ms); optim.optimizer=adamw keeps torch's default on a CPU, bitwise equal
    # to the torch AdamW a sharded strategy steps.
    return with_peaks(MuonAdamW(groups, run.world_size, run.rank, fused=device.type in ("cuda", "cpu")))


def with_peaks(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Remember each group's peak lr and weight decay, which set_schedule scales (kept apart from the
    groups: a checkpoint's groups hold the values of the step it was saved at)."""
    optimizer.peaks = [(group["lr"], group["weight_decay"]) for group in optimizer.param_groups]
    return optimizer


def peak_lrs(optimizer: torch.optim.Optimizer) -> dict[str, float]:
    """Each group kind's peak learning rate (the first group of a kind): what the run prints."""
    peaks = {}
    for group, (lr, _) in zip(optimizer.param_groups, optimizer.peaks):
        peaks.setdefault(group.get("kind", "adamw"), lr)
    return peaks


def groups_line(optimizer: torch.optim.Optimizer) -> str:
    """The peak learning rate of each role, as the run's first line shows them."""
    seen = {}
    for group, (lr, _) in zip(optimizer.param_groups, optimizer.peaks):
        seen.setdefault(group.get("role", group.get("kind", "adamw")), lr)
    return peak_lrs_line(seen)
