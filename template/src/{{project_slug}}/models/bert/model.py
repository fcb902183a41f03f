"""BERT masked language model: transformers' BertForMaskedLM behind this project's model contract.

    <package> train model.arch=bert model.size=base                        # from scratch
    <package> train model.arch=bert model.pretrained=/mnt/shared/models/bert-large-uncased   # fine-tune

From scratch the shape comes from sizes.BERT_SIZES (intermediate 4 x width, 512 positions) and the
vocabulary from the tokenizer prepare-data wrote. Fine-tuning reads config.json and the weights
(model.safetensors or pytorch_model.bin) from a local folder: air-gapped clusters download nothing,
so HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE are set before transformers is imported. Like models/gpt/model.py,
this file knows nothing of distribution.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...settings.config import Config, ConfigError
from ...settings.packages import import_transformers
from ..family import check_vocab
from ..sample_dropout import KeyedDropout, keyed_dropout
from .descriptor import FAMILY, MLM_SHARE, SEQUENCE_LEN

MLM_PROBABILITY = MLM_SHARE  # share of positions predicted (BERT's 15%; of those 80% [MASK], 10% random, 10% kept)


def predictions_per_sequence(sequence_len: int) -> int:
    """Positions predicted in every sequence (BERT's num_to_predict, max_predictions_per_seq at 15% of
    the length): models/bert/data.py masks this many where a row has as many non-special tokens, and the
    loss gathers this many per row, a shape fixed by the length alone (no graph break, no host sync)."""
    return max(1, round(sequence_len * MLM_PROBABILITY))


KEYED_ATTENTION = "sdpa_keyed_dropout"  # the attention function registered with transformers below


class BertMLM(nn.Module):
    """BertForMaskedLM with forward(input_ids, labels, loss_reduction) -> loss, num_params(), flops_per_token()."""

    def __init__(self, mlm: nn.Module, sequence_len: int):
        super().__init__()
        self.mlm = mlm
        self.sequence_len = sequence_len

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # the tied decoder weight counts once

    def flops_per_token(self) -> int:
        """Training FLOPs per token: 6 x matmul parameters (all but the embedding tables) + the
        tied vocabulary projection, run only on the predicted positions (MLM_PROBABILITY of them),
        + attention scores and values over the whole (bidirectional) sequence."""
        c = self.mlm.config
        emb = self.mlm.bert.embeddings
        tables = sum(
            m.weight.numel() for m in (emb.word_embeddings, emb.position_embeddings, emb.token_type_embeddings)
        )
        head_dim = c.hidden_size // c.num_attention_heads
        return int(
            6 * (self.num_params() - tables)
            + 6 * MLM_PROBABILITY * c.vocab_size * c.hidden_size
            + 12 * c.num_hidden_layers * c.num_attention_heads * head_dim * self.sequence_len
        )

    def forward(
        self, input_ids: torch.Tensor, labels: torch.Tensor | None = None, loss_reduction: str = "mean"
    ) -> torch.Tensor:
        """Logits (B, T, vocab) without labels. With labels (-100 = not predicted): the
        cross-entropy over the predicted positions, their mean, or with loss_reduction='none'
        one value per predicted position (flat, in row-major order); 'hits': those losses and, as a
        second row, 1 where the top prediction is the label (eval's masked-token accuracy)."""
        if labels is None:
            return self.mlm(input_ids=input_ids).logits
        hidden = self.mlm.bert(input_ids=input_ids).last_hidden_state
        picked = labels != -100
        if loss_reduction in ("none", "hits"):  # eval's per-position values: a shape that follows the labels
            logits = self.mlm.cls(hidden[picked]).float()
            losses = F.cross_entropy(logits, labels[picked], reduction="none")
            if loss_reduction == "none":
                return losses
            return torch.stack([losses, (logits.argmax(-1) == labels[picked]).float()])
        # The vocabulary projection only where a token is predicted: the (at most) K predicted
        # positions of each row, in order, then unpredicted ones (label -100) up to K. A fixed shape:
        # boolean indexing would break a compiled graph and wait for the GPU twice per micro batch.
        k = predictions_per_sequence(labels.size(1))  # at most the length: round(0.15 T) <= T
        rows = torch.sort(picked.to(torch.uint8), dim=1, descending=True, stable=True).indices[:, :k]
        gathered = hidden.gather(1, rows.unsqueeze(-1).expand(-1, -1, hidden.size(-1)))
        logits = self.mlm.cls(gathered).float()
        losses = F.cross_entropy(logits.flatten(0, 1), labels.gather(1, rows).flatten(), reduction="sum")
        # sum / count instead of reduction='mean': a batch without predictions gives 0, not NaN.
        return losses / picked.sum().clamp(min=1)


def scratch_config(size: str, vocab_size: int, **extra):
    """transformers' BertConfig of a size of the family's table (a 4h feed-forward, BERT's 512
    positions); extra: more BertConfig fields."""
    shape = FAMILY.shape(size)
    return import_transformers().BertConfig(
        vocab_size=vocab_size,
        hidden_size=shape["n_embd"],
        num_hidden_layers=shape["n_layer"],
        num_attention_heads=shape["n_head"],
        intermediate_size=4 * shape["n_embd"],
        max_position_embeddings=SEQUENCE_LEN,
        **extra,
    )


def build_bert(cfg: Config, vocab_size: int, load_weights: bool = True) -> BertMLM:
    """The model on the CPU: from model.pretrained (weights loaded unless load_weights=False, when a
    checkpoint will overwrite them) or freshly initialised with the shape of model.size."""
    transformers = import_transformers()
    m = cfg.model
    if m.pretrained:
        folder = FAMILY.weights_folder(m.pretrained)
        config = transformers.BertConfig.from_pretrained(str(folder), local_files_only=True)
        check_vocab(m.pretrained, config.vocab_size, vocab_size)
        if m.sequence_len > config.max_position_embeddings:
            raise ConfigError(
                f"model.sequence_len={m.sequence_len} exceeds the {config.max_position_embeddings} "
                f"positions of model.pretrained={m.pretrained!r}; lower it"
            )
        if load_weights:
            mlm = transformers.BertForMaskedLM.from_pretrained(str(folder), local_files_only=True)
        else:
            mlm = transformers.BertForMaskedLM(config)
        mlm = mlm.float()  # fp32 master weights whatever the file holds; autocast does bf16
    else:
        mlm = transformers.BertForMaskedLM(scratch_config(m.size, vocab_size))
    draw_dropout_per_sample(mlm, m.dropout, m.attention_dropout or 0.0)
    if m.activation_checkpointing:
        # Non-reentrant: works with ZeRO-3's parameter hooks and with inputs that need no grad.
        mlm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return BertMLM(mlm, m.sequence_len)


def to_transformers(model: BertMLM):
    """A plain BertForMaskedLM with these weights: the same config (its attention on transformers'
    own SDPA rather than the per-sample dropout function registered here), so any tool loads it."""
    transformers = import_transformers()
    config = transformers.BertConfig.from_dict(model.mlm.config.to_dict())
    config._attn_implementation = "sdpa"
    hf = transformers.BertForMaskedLM(config)
    hf.load_state_dict(model.mlm.state_dict())
    return hf.eval()


def draw_dropout_per_sample(mlm: nn.Module, p: float | None, attention_p: float) -> None:
    """Every dropout of transformers' BERT draws its masks per sample (models/sample_dropout.py): the
    hidden ones become KeyedDropout, the attention probabilities' go through keyed_attention,
    registered with transformers' AttentionInterface. p (model.dropout) replaces the hidden dropout
    probabilities, None keeps the model's config (hidden_dropout_prob); attention_p
    (model.attention_dropout) is the attention probabilities' (0: the fused SDPA kernel)."""
    transformers = import_transformers()
    if p is not None:
        mlm.config.hidden_dropout_prob = p
    mlm.config.attention_probs_dropout_prob = attention_p  # the config saved with the weights says what ran
    transformers.AttentionInterface.register(KEYED_ATTENTION, keyed_attention)
    mlm.set_attn_implementation(KEYED_ATTENTION)
    layer = 0
    for module in list(mlm.modules()):
        for name, child in list(module.named_children()):
            if type(child) is not nn.Dropout:
                continue
            if hasattr(module, "query"):  # self-attention: passes its dropout's p to the attention function
                child.p = attention_p
                module.dropout_key = layer
            else:
                setattr(module, name, KeyedDropout(child.p if p is None else p, layer))
            layer += 1


def keyed_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' attention function contract: (output (B, T, heads, head_dim), probabilities or
    None). Without dropout (eval, or p=0) torch's SDPA; with it the probabilities are materialised
    so their mask can be keyed per sample (SDPA's dropout draws from the process's generator)."""
    if not dropout:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kwargs)
    scores = torch.matmul(query, key.transpose(2, 3)) * (scaling or query.size(-1) ** -0.5)
    if attention_mask is not None and attention_mask.dtype == torch.bool:  # True = attend
        scores = scores.masked_fill(~attention_mask, float("-inf"))
    elif attention_mask is not None:  # additive
        scores = scores + attention_mask
    probs = F.softmax(scores.float(), dim=-1).to(query.dtype)
    probs = keyed_dropout(probs, dropout, module.dropout_key, True)
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs
