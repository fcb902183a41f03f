"""The model families: each a descriptor (models/family.py: shapes, tokenizer, batches, what it
accepts; costs.py: its formulas; new_project.py: what copier writes) beside its nn.Module. eval and
sample call build_model; a training run builds through its resolved family (Run.family.build).

Every model is an nn.Module with forward(inputs, targets, loss_reduction="mean") -> loss,
num_params() and flops_per_token(), built on the CPU; the caller moves it to its device.
"""

from __future__ import annotations

from .family import family


def build_model(cfg, vocab_size: int, load_weights: bool = True):
    """A freshly initialised model of cfg.model.arch on the CPU (with model.pretrained and
    load_weights, loaded from the local weights)."""
    return family(cfg.model.arch).build(cfg, vocab_size, load_weights)
