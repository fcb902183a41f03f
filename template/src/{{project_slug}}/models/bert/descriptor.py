"""BERT masked LM (models/bert/model.py) as the rest of the project sees it: the paper's sizes, its
formulas (the vocabulary head runs on the predicted positions only), WordPiece with BERT's special
tokens, local weights (no torch here).

Parameters (transformers' BertForMaskedLM, no pooler): embeddings (V + 512 + 2)*h + LayerNorm 2h,
per layer 12h^2 + 13h, MLM head transform h^2 + h + LayerNorm 2h, decoder tied to the word
embedding plus a V bias. FLOPs per token: all but the embedding tables, plus the tied decoder on the
15% predicted positions, + attention. Activations: Korthikanti et al. (costs.py
transformer_layer_activations; transformers' "sdpa" attention) with the measured REPLICATED_BYTES
below; the logits 12 bytes per b*s*V on the 15% predicted positions only (model.py projects only
those; measured 1.6-2.0 bytes per b*s*V).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...settings.config import ConfigError
from ..costs import block_params, transformer_layer_activations
from ..family import Family

BERT_SIZES = {
    "tiny": {"n_layer": 2, "n_embd": 64, "n_head": 2},
    "base": {"n_layer": 12, "n_embd": 768, "n_head": 12},
    "large": {"n_layer": 24, "n_embd": 1024, "n_head": 16},
}
WEIGHT_FILES = (
    "model.safetensors",
    "pytorch_model.bin",
    "model.safetensors.index.json",
    "pytorch_model.bin.index.json",
)  # transformers' weight files, one or sharded
SEQUENCE_LEN = 512  # BertConfig's position embeddings
POSITIONS, TOKEN_TYPES = 512, 2  # BertConfig defaults: position and segment embedding tables
# BERT's special tokens by transformers' names, in the ids a trained tokenizer gives them ([PAD] 0:
# BertConfig's default pad_token_id).
SPECIAL_TOKENS = {"pad_token": "[PAD]", "unk_token": "[UNK]", "cls_token": "[CLS]", "sep_token": "[SEP]",
                  "mask_token": "[MASK]"}  # fmt: skip
MLM_SHARE = 0.15  # positions the loss predicts (models/bert/model.py's MLM_PROBABILITY): the head runs on those only
# Per layer, bytes per s*b*h kept for backward by precision, measured as gpt3's (H100, torch 2.11,
# transformers 5.17, width 1024): 11 in bf16 (35 in all), 19 under autocast (43: post-LN in fp32);
# checkpointed: the saved input.
REPLICATED_BYTES = {"bf16": 11, "autocast": 19}
CHECKPOINT_BYTES = {"bf16": 3, "autocast": 3}


@dataclass(frozen=True)
class BertFamily(Family):
    def num_params(self, shape: dict, vocab_size: int, sequence_len: int) -> int:
        h, L, V = shape["n_embd"], shape["n_layer"], vocab_size
        # embeddings and their LayerNorm, blocks, the head's transform (dense + LayerNorm) and decoder bias
        return (V + POSITIONS + TOKEN_TYPES) * h + 2 * h + L * block_params(h) + h * h + 3 * h + V

    def flops_per_token(self, shape: dict, vocab_size: int, sequence_len: int) -> int:
        """All but the embedding tables (biases and norms included), the tied decoder on the predicted
        share of the positions, attention."""
        h, L, V = shape["n_embd"], shape["n_layer"], vocab_size
        tables = (V + POSITIONS + TOKEN_TYPES) * h
        body = 6 * (self.num_params(shape, V, sequence_len) - tables)
        return int(body + 6 * MLM_SHARE * V * h + 12 * L * h * sequence_len)

    def largest_layer_params(self, shape: dict, vocab_size: int) -> int:
        return vocab_size * shape["n_embd"] + vocab_size  # the MLM decoder: the tied embedding plus its bias

    def layer_activations(self, shape: dict, seq: int, micro: int, tp: int, mode: str, scores_stored: bool) -> float:
        return transformer_layer_activations(shape, seq, micro, tp, REPLICATED_BYTES[mode], scores_stored)

    def checkpointed_layer_bytes(self, mode: str) -> float:
        return CHECKPOINT_BYTES[mode]

    def logits_bytes(self, softcap: float) -> float:
        return 12 * MLM_SHARE

    def config_settings(self, section: str, answers: dict) -> list[tuple[str | None, Any, str]]:
        """From scratch at the size's shape, or fine-tuning local weights (the pretrained_dir answer)."""
        if section == "model":
            return [
                ("size", answers["model_size"], f"{' | '.join(self.sizes)} (shape used when pretrained is empty)"),
                ("sequence_len", SEQUENCE_LEN, "tokens per sequence, [CLS] and [SEP] included (BERT's 512 positions at most)"),
                ("pretrained", answers.get("pretrained_dir", ""), 'local folder with config.json + weights to fine-tune; "" = from scratch'),
                ("dropout", None, "hidden dropout, masks per sample; null = the model's config.json (0.1 from scratch)"),
                ("attention_dropout", None, "dropout of the attention probabilities; null = none (MosaicBERT's choice: the fused flash kernel); 0.1 = BERT's recipe, T x T probabilities materialised (plan and bench/gpu_estimate.py show the cost)"),
            ]  # fmt: skip
        return super().config_settings(section, answers)

    def weights_folder(self, pretrained: str) -> Path:
        """The model.pretrained folder (transformers' layout), checked for config.json and weights."""
        folder = Path(pretrained)
        fix = 'copy config.json and model.safetensors (or pytorch_model.bin) there, or set model.pretrained="" to train from scratch'
        if not folder.is_dir():
            raise ConfigError(f"model.pretrained={pretrained!r} is not a folder on this machine; {fix}")
        if not (folder / "config.json").is_file():
            raise ConfigError(f"model.pretrained={pretrained!r} has no config.json; {fix}")
        if not any((folder / name).is_file() for name in WEIGHT_FILES):
            raise ConfigError(
                f"model.pretrained={pretrained!r} has no weights ({' or '.join(WEIGHT_FILES[:2])}); {fix}"
            )
        return folder

    def weights_vocab_size(self, pretrained: str) -> int:
        """vocab_size of the folder's config.json, read without transformers (prepare-data checks it early)."""
        return int(json.loads((self.weights_folder(pretrained) / "config.json").read_text())["vocab_size"])


FAMILY = BertFamily(
    name="bert",
    summary="BERT masked LM with transformers, from scratch or local weights",
    builder="model:build_bert",
    exporter="model:to_transformers",
    batches="data:open_batches",
    sizes=BERT_SIZES,
    # BERT's 256 x 512 batch and 1e-4 (Devlin et al.); micro 16 keeps large's activations in 40 GB
    recipe_defaults={"global_batch": 256, "micro_batch": 32, "lr": 1e-4, "sequence_len": SEQUENCE_LEN},
    recipe_by_size={"large": {"micro_batch": 16}},
    causal=False,
    tokenizer="wordpiece",
    tokenizer_trainer="tokenizer:train_wordpiece",
    separator="[SEP]",  # between documents in the shards: data.py cuts [CLS] ... [SEP] windows of them
    special_tokens=SPECIAL_TOKENS,
    tokenizer_files={"vocab.txt": "tokenizer:read_vocab"},
    sampler="fill_mask:fill_mask",
    output_head="decoder",  # BertForMaskedLM's vocabulary projection
    sample_top_k=5,
    max_sequence_len=SEQUENCE_LEN,
    min_sequence_len=3,
    pretrained=True,
    title="BERT masked LM",
    default_size="large",
    default_strategy="deepspeed",
    vocab_size=30522,
    vocab_note="BERT's uncased vocabulary size",
    weight_decay=0.01,
    beta2=0.999,
)
