"""Model registry: one builder per model family (model.arch); the trainer calls build_model.

Every model is an nn.Module with forward(inputs, targets, loss_reduction="mean") -> loss,
num_params() and flops_per_token(), built on the CPU; the caller moves it to its device.
"""

from __future__ import annotations

from ..settings.config import Config
from ..settings.rules import model_shape
from .gpt import GPT, GPTConfig


def build_gpt_config(cfg: Config, vocab_size: int) -> GPTConfig:
    shape = model_shape(cfg.model.size, cfg.model.n_kv_head, cfg.model.arch)
    return GPTConfig(
        vocab_size=vocab_size,
        sequence_len=cfg.model.sequence_len,
        softcap=cfg.model.softcap,
        dropout=cfg.model.dropout or 0.0,
        **shape,
    )


def build_model(cfg: Config, vocab_size: int):
    """A freshly initialised (or, for bert with model.pretrained, loaded) model on the CPU."""
    if cfg.model.arch == "bert":
        from .bert import build_bert  # imports transformers only when asked for

        return build_bert(cfg, vocab_size)
    if cfg.model.arch == "gpt3":
        from .gpt3 import build_gpt3

        return build_gpt3(cfg, vocab_size)
    model = GPT(build_gpt_config(cfg, vocab_size))
    model.init_weights()
    model.checkpointing = cfg.model.activation_checkpointing
    return model
