"""The data of a split (train, val) for the model family: next-token pairs for gpt/gpt3 (data.py),
masked-LM pairs for bert (mlm_data.py).

    from .splits import open_split
    val = open_split(cfg, data_dir, "val")
"""

from __future__ import annotations

from pathlib import Path

from .data import TokenData
from .mlm_data import MaskedTokenData


def open_split(cfg, data_dir: Path, split: str):
    """Inputs and targets of one split: for bert, inputs with [MASK] and labels -100 where nothing is predicted."""
    if cfg.model.arch == "bert":
        return MaskedTokenData.open(cfg, data_dir, split)
    return TokenData.open(data_dir, split, cfg.model.sequence_len)
