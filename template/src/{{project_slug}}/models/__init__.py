"""Model registry: one builder per model family named in config; the trainer calls build_model."""

from __future__ import annotations

from ..config import Config
from ..rules import model_shape
from .gpt import GPT, GPTConfig


def build_gpt_config(cfg: Config, vocab_size: int) -> GPTConfig:
    shape = model_shape(cfg.model.size, cfg.model.n_kv_head, cfg.model.arch)
    return GPTConfig(vocab_size=vocab_size, sequence_len=cfg.model.sequence_len, softcap=cfg.model.softcap, **shape)


def build_model(cfg: Config, vocab_size: int) -> GPT:
    """A freshly initialised model on the CPU; the caller moves it to its device."""
    model = GPT(build_gpt_config(cfg, vocab_size))
    model.init_weights()
    return model
