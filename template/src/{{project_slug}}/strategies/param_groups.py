"""AdamW parameter groups, the same for every strategy: which parameters get weight decay.

from .param_groups import param_groups
torch.optim.AdamW(param_groups(model, cfg.optim.weight_decay), lr=cfg.optim.lr)
"""

from __future__ import annotations


def param_groups(model, weight_decay: float) -> list[dict]:
    """AdamW groups: weight decay shrinks matrices toward zero; on embedding tables it only hurts rare tokens."""

    def decays(name, p):
        return p.dim() >= 2 and not any(key in name for key in ("wte", "wpe", "embeddings"))

    named = list(model.named_parameters())
    return [
        {"params": [p for n, p in named if decays(n, p)], "weight_decay": weight_decay},
        {"params": [p for n, p in named if not decays(n, p)], "weight_decay": 0.0},
    ]
