"""Masked-LM batches for model.arch=bert, read from the packed shards prepare-data writes.

    data = MaskedTokenData.open(cfg, Path(cfg.data.dir), "train")
    input_ids, labels = data.batch(first=0, count=8)     # LongTensors (8, model.sequence_len)

Sequence i is [CLS] + window i of the token stream (sequence_len - 2 tokens; documents inside it
are separated by [SEP], as in RoBERTa's full-sentence packing) + [SEP]. Masking is transformers'
DataCollatorForLanguageModeling (15% of the positions predicted: 80% [MASK], 10% a random token,
10% unchanged) under a random generator seeded by (run.seed, split, i): the masked batch is a pure
function of the sequence index, like the data position is of the step (data.micro_batch_start), so
a resumed run and any world size read exactly the same masked batches. The index is not wrapped
before seeding, so a second epoch masks the same windows differently (dynamic masking). The
validation masks ignore run.seed, so runs with different seeds are scored on the same predictions.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .config import Config, ConfigError
from .data import BERT_SPECIALS, load_tokenizer, read_meta
from .models.bert import MLM_PROBABILITY, import_transformers

_SPLIT_CODE = {"train": 0, "val": 1}
_VAL_SEED = 0  # validation masks are the same for every run.seed


class MaskedTokenData:
    """Memory-mapped shards of one split, addressed as a list of masked [CLS] ... [SEP] sequences."""

    masked_lm = True  # evaluate.py scores predicted positions only (perplexity, no bits per byte)

    def __init__(
        self, shards: list[np.ndarray], sequence_len: int, specials: dict[str, int], collator, seed: int, split: str
    ):
        if sequence_len < 3:
            raise ConfigError(
                f"model.sequence_len={sequence_len} leaves no room for text between [CLS] and [SEP]; "
                "use at least 3 (BERT: up to 512)"
            )
        self.shards, self.sequence_len, self.specials = shards, sequence_len, specials
        self.collator, self.seed, self.split_code = collator, seed, _SPLIT_CODE.get(split, len(_SPLIT_CODE))
        self.window = sequence_len - 2  # stream tokens per sequence; windows do not cross shards
        self.counts = [len(s) // self.window for s in shards]
        self.offsets = np.cumsum([0] + self.counts)

    @classmethod
    def open(cls, cfg: Config, data_dir: Path, split: str) -> MaskedTokenData:
        meta = read_meta(data_dir)
        tok = load_tokenizer(data_dir / meta["tokenizer"])
        missing = [t for t in BERT_SPECIALS if tok.token_to_id(t) is None]
        if missing:
            raise ConfigError(
                f"the tokenizer in {data_dir} has no {', '.join(missing)}: the data was prepared for another model "
                f"family; run prepare-data with model.arch=bert (or another data.dir)"
            )
        specials = {t: tok.token_to_id(t) for t in BERT_SPECIALS}
        dtype = np.dtype(meta["dtype"])
        shards = [np.memmap(data_dir / s["file"], dtype=dtype, mode="r") for s in meta[split]]
        seed = cfg.run.seed if split == "train" else _VAL_SEED
        data = cls(shards, cfg.model.sequence_len, specials, masking_collator(tok, specials), seed, split)
        if data.num_sequences == 0:
            raise ConfigError(
                f"the {split} split in {data_dir} holds fewer than {data.window} tokens per shard; "
                "add data or lower model.sequence_len"
            )
        return data

    @property
    def num_sequences(self) -> int:
        return int(self.offsets[-1])

    def tokens(self, index: int) -> np.ndarray:
        """Sequence `index` before masking: [CLS] window [SEP] (wraps around after the last one)."""
        index %= self.num_sequences
        shard = int(np.searchsorted(self.offsets, index, side="right") - 1)
        start = (index - int(self.offsets[shard])) * self.window
        out = np.empty(self.sequence_len, dtype=np.int64)
        out[0], out[-1] = self.specials["[CLS]"], self.specials["[SEP]"]
        out[1:-1] = self.shards[shard][start : start + self.window]
        return out

    def masked(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, labels) of sequence `index`; labels are -100 where nothing is predicted."""
        ids = torch.from_numpy(self.tokens(index))[None]
        # Special tokens ([CLS], [SEP] between documents, ...) are never masked, as in BERT.
        special = torch.isin(ids, torch.tensor(sorted(self.specials.values())))
        seed = int(np.random.SeedSequence([self.seed, self.split_code, index]).generate_state(1, np.uint64)[0])
        # The collator draws from torch's global generator: fork it so training's RNG stream
        # (dropout, and so exact resume) is untouched, and seed it by the sequence alone.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed & (2**63 - 1))
            inputs, labels = self.collator.torch_mask_tokens(ids.clone(), special_tokens_mask=special)
        return inputs[0], labels[0]

    def batch(self, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and labels (count, sequence_len) for sequences first .. first+count-1."""
        pairs = [self.masked(first + i) for i in range(count)]
        return torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])


def masking_collator(tok, specials: dict[str, int]):
    """DataCollatorForLanguageModeling over our tokenizers.Tokenizer (15%, 80/10/10)."""
    transformers = import_transformers()
    wrapped = transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
    )
    # seed=None: the collator then uses torch's global generator, which masked() seeds per sequence.
    return transformers.DataCollatorForLanguageModeling(tokenizer=wrapped, mlm=True, mlm_probability=MLM_PROBABILITY)
