"""The GPT of a project's config (the family's builder), and the GPT as a transformers model (its
exporter): NanoChatForCausalLM where transformers has the architecture, else the network itself
with its modeling code (gpt/export.py)."""

from __future__ import annotations

import torch

from .descriptor import FAMILY
from .model import GPT, GPTConfig
from .pieces import PIECES, SWITCHES


def build(cfg, vocab_size: int, load_weights: bool = True) -> GPT:
    """The GPT of cfg.model (its size through the family's shapes), initialised on the CPU."""
    m = cfg.model
    shape = FAMILY.shape(m.size, m.n_kv_head)
    config = GPTConfig(
        vocab_size=vocab_size,
        sequence_len=m.sequence_len,
        softcap=m.softcap,
        dropout=m.dropout or 0.0,
        **{switch: getattr(m, switch) for switch in SWITCHES},
        **shape,
    )
    model = GPT(config)
    model.init_weights()
    model.checkpointing = cfg.model.activation_checkpointing
    return model


def to_transformers(model: GPT):
    """transformers' NanoChatForCausalLM with these weights: the same computation (rotary pairs of
    halves, QK-norm after rotary, parameter-free RMSNorm on the embedding, blocks and output, ReLU^2,
    softcapped logits, untied head), so its logits equal ours. A model with a piece NanoChatConfig
    has no field for (the rotary base it has; the initialisation does not matter once trained)
    becomes GPTForCausalLM, our network with its modeling code."""
    from transformers import NanoChatConfig, NanoChatForCausalLM

    c = model.config
    if any(getattr(c, k) != GPTConfig.__dataclass_fields__[k].default for k in (*PIECES, "qk_scale", "window_pattern")):
        from .export import from_gpt

        return from_gpt(model)
    config = NanoChatConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.n_embd,
        intermediate_size=4 * c.n_embd,
        num_hidden_layers=c.n_layer,
        num_attention_heads=c.n_head,
        num_key_value_heads=c.n_kv_head,
        max_position_embeddings=c.sequence_len,
        rms_norm_eps=torch.finfo(torch.float32).eps,  # F.rms_norm's default for fp32
        rope_parameters={"rope_type": "default", "rope_theta": c.rotary_base},
        final_logit_softcapping=c.softcap if c.softcap > 0 else None,
        hidden_act="relu2",
        attention_bias=False,
        attention_dropout=0.0,
        tie_word_embeddings=False,
    )
    names = {"wte.weight": "model.embed_tokens.weight", "lm_head.weight": "lm_head.weight"}
    ours = {"attn.c_q": "self_attn.q_proj", "attn.c_k": "self_attn.k_proj", "attn.c_v": "self_attn.v_proj"}
    ours |= {"attn.c_proj": "self_attn.o_proj", "mlp.c_fc": "mlp.fc1", "mlp.c_proj": "mlp.fc2"}
    for i in range(c.n_layer):
        names |= {f"blocks.{i}.{a}.weight": f"model.layers.{i}.{b}.weight" for a, b in ours.items()}
    hf = NanoChatForCausalLM(config)
    # The tables' padding rows (model.vocab_multiple) are never read nor produce a logit: cut off.
    weights = {
        names[k]: v[: c.vocab_size] if k in ("wte.weight", "lm_head.weight") else v
        for k, v in model.state_dict().items()
        if k in names
    }
    hf.load_state_dict(weights, strict=True)
    return hf.eval()
