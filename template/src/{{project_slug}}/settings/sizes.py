"""Model sizes and parallel layouts by name, for the three model families (no torch here).

    gpt   'tiny' or nanochat's depth dial 'd<depth>' (width 64*depth rounded up to heads of 128)
    bert  'tiny', 'base', 'large' (Devlin et al. 2019)
    gpt3  'tiny', '125M' ... '175B' (Brown et al. 2020, Table 2.1)

A shape is a dict: n_layer, n_embd, n_head, n_kv_head, and for bert/gpt3 also the published
sequence length, global batch (sequences) and peak learning rate that train.yaml starts from.
"""

from __future__ import annotations

import math
import re

from .config import ConfigError

ARCHS = ("gpt", "bert", "gpt3")

# GPT-3 paper, Table 2.1: layers, width, heads, batch in tokens (here in 2048-token sequences:
# 0.5M -> 256, 1M -> 512, 2M -> 1024, 3.2M -> 1536 as Megatron runs it) and learning rate.
# Two printed values cannot be built and every reproduction (Megatron-DeepSpeed included) changes them:
# 1.3B lists 24 heads of 128 for width 2048 (16 heads of 128 here); 13B lists d_model 5140 (40 x 128 = 5120).
GPT3_SIZES = {
    "tiny": {"n_layer": 4, "n_embd": 64, "n_head": 4, "global_batch": 16, "lr": 1e-3},
    "125M": {"n_layer": 12, "n_embd": 768, "n_head": 12, "global_batch": 256, "lr": 6.0e-4},
    "350M": {"n_layer": 24, "n_embd": 1024, "n_head": 16, "global_batch": 256, "lr": 3.0e-4},
    "760M": {"n_layer": 24, "n_embd": 1536, "n_head": 16, "global_batch": 256, "lr": 2.5e-4},
    "1.3B": {"n_layer": 24, "n_embd": 2048, "n_head": 16, "global_batch": 512, "lr": 2.0e-4},
    "2.7B": {"n_layer": 32, "n_embd": 2560, "n_head": 32, "global_batch": 512, "lr": 1.6e-4},
    "6.7B": {"n_layer": 32, "n_embd": 4096, "n_head": 32, "global_batch": 1024, "lr": 1.2e-4},
    "13B": {"n_layer": 40, "n_embd": 5120, "n_head": 40, "global_batch": 1024, "lr": 1.0e-4},
    "175B": {"n_layer": 96, "n_embd": 12288, "n_head": 96, "global_batch": 1536, "lr": 0.6e-4},
}

BERT_SIZES = {
    "tiny": {"n_layer": 2, "n_embd": 64, "n_head": 2, "global_batch": 16, "lr": 1e-3},
    "base": {"n_layer": 12, "n_embd": 768, "n_head": 12, "global_batch": 256, "lr": 1e-4},
    "large": {"n_layer": 24, "n_embd": 1024, "n_head": 16, "global_batch": 256, "lr": 1e-4},
}
BERT_SEQUENCE_LEN = 512

# The seeds' Megatron-DeepSpeed layouts (A100 40/80 GB nodes of 8), selectable as copier presets.
GPT3_LAYOUTS = {
    "125m-1gpu": {"size": "125M", "nodes": 1, "gpus_per_node": 1, "tp": 1, "pp": 1},
    "125m-2dp": {"size": "125M", "nodes": 1, "gpus_per_node": 2, "tp": 1, "pp": 1},
    "125m-4dp": {"size": "125M", "nodes": 1, "gpus_per_node": 4, "tp": 1, "pp": 1},
    "1.3b-4dp": {"size": "1.3B", "nodes": 1, "gpus_per_node": 4, "tp": 1, "pp": 1},
    "1.3b-8dp": {"size": "1.3B", "nodes": 1, "gpus_per_node": 8, "tp": 1, "pp": 1},
    "1.3b-4dp-4pp": {"size": "1.3B", "nodes": 2, "gpus_per_node": 8, "tp": 1, "pp": 4},
    "13b-4dp-4pp": {"size": "13B", "nodes": 2, "gpus_per_node": 8, "tp": 1, "pp": 4},
    "13b-4dp-8pp": {"size": "13B", "nodes": 4, "gpus_per_node": 8, "tp": 1, "pp": 8},
    "13b-4dp-4pp-4tp": {"size": "13B", "nodes": 8, "gpus_per_node": 8, "tp": 4, "pp": 4},
}


def model_shape(size: str, n_kv_head: int | None = None, arch: str = "gpt") -> dict:
    """Layers, width and heads (plus the paper's batch and lr for bert/gpt3) of a size name."""
    if arch == "gpt3":
        return _named(GPT3_SIZES, size, arch)
    if arch == "bert":
        return _named(BERT_SIZES, size, arch)
    if arch != "gpt":
        raise ConfigError(f"model.arch={arch!r} is not a model family; use one of {', '.join(ARCHS)}")
    if size == "tiny":
        shape = {"n_layer": 2, "n_embd": 64, "n_head": 4, "n_kv_head": 2}
    else:
        match = re.fullmatch(r"d([1-9][0-9]*)", size)
        if not match:
            raise ConfigError(f"model.size={size!r} is not a gpt size; use 'tiny' or 'd<depth>' such as d20")
        depth = int(match.group(1))
        # nanochat's aspect ratio (width 64 per layer), rounded up to whole heads of 128 dims.
        n_embd = math.ceil(64 * depth / 128) * 128
        n_head = n_embd // 128
        shape = {"n_layer": depth, "n_embd": n_embd, "n_head": n_head, "n_kv_head": n_head}
    if n_kv_head is not None:
        shape["n_kv_head"] = n_kv_head
    return shape


def _named(table: dict, size: str, arch: str) -> dict:
    if size not in table:
        raise ConfigError(f"model.size={size!r} is not a {arch} size; use one of {', '.join(table)}")
    shape = dict(table[size])
    shape["n_kv_head"] = shape["n_head"]
    return shape
