"""Masked-LM batches for model.arch=bert (its descriptor's `batches`), read from the packed shards prepare-data writes.

    data = open_split(cfg, Path(cfg.data.dir), "train")    # data/splits.py: MaskedTokenData.open
    input_ids, labels = data.batch(first=0, count=8)     # LongTensors (8, model.sequence_len)

Sequence i is [CLS] + window i of the token stream (sequence_len - 2 tokens; documents inside it
are separated by [SEP], as in RoBERTa's full-sentence packing) + [SEP]. Masking follows BERT's
create_pretraining_data: every sequence predicts the same number of positions,
predictions_per_sequence(sequence_len) (15%), chosen among its non-special tokens (fewer only where
a sequence holds fewer); of those 80% become [MASK], 10% a random non-special token of the
vocabulary, 10% stay. A fixed count per row lets the model gather exactly that many positions per
row, a static shape.

Every draw is a hash of (run.seed, split, the sequence's index, the position), computed for the
whole batch at once (models/sample_dropout.py's integer mix): no random generator is read or
seeded, so training's stream stays untouched, and the masked batch is a pure function of the
sequence index, like the data position is of the step (data.micro_batch_start): a resumed run and
any world size read exactly the same masked batches. The index is not wrapped before hashing, so a
second epoch masks the same windows differently (dynamic masking). The validation masks ignore
run.seed, so runs with different seeds are scored on the same predictions.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import torch

from ...settings.config import Config, ConfigError
from ..sample_dropout import _MASK, _mix
from .descriptor import SPECIAL_TOKENS
from .model import predictions_per_sequence

_SPLIT_CODE = {"train": 0, "val": 1}
_VAL_SEED = 0  # validation masks are the same for every run.seed
# Mixed into the keys so masks and dropout (sample_dropout, keyed by the same seed and index) differ.
_MASKING_SALT = 0x6D6C6D
_CHOICE_SALT = 0x2545F491
_NOT_A_CANDIDATE = torch.iinfo(torch.int64).max  # sorts after every candidate's score


class MaskedTokenData:
    """Memory-mapped shards of one split, addressed as a list of masked [CLS] ... [SEP] sequences."""

    def __init__(
        self,
        shards: list[np.ndarray],
        sequence_len: int,
        specials: dict[str, int],
        vocab_size: int,
        seed: int,
        split: str,
    ):
        if sequence_len < 3:
            raise ConfigError(
                f"model.sequence_len={sequence_len} leaves no room for text between [CLS] and [SEP]; "
                "use at least 3 (BERT: up to 512)"
            )
        self.shards, self.sequence_len, self.specials = shards, sequence_len, specials
        self.window = sequence_len - 2  # stream tokens per sequence; windows do not cross shards
        self.counts = [len(s) // self.window for s in shards]
        self.offsets = np.cumsum([0] + self.counts)
        split_code = _SPLIT_CODE.get(split, len(_SPLIT_CODE))
        self.split_key = _mix(_mix(_mix(seed & _MASK) ^ _MASKING_SALT) ^ split_code)
        special_ids = torch.tensor(sorted(specials.values()), dtype=torch.int64)
        self.is_special = torch.zeros(max(vocab_size, int(special_ids.max()) + 1), dtype=torch.bool)
        self.is_special[special_ids] = True  # [CLS], [SEP] between documents, ... are never predicted
        self.replacements = (~self.is_special[:vocab_size]).nonzero()[:, 0]  # the random token's choices

    @classmethod
    def open(cls, cfg: Config, prepared) -> MaskedTokenData:
        """The batches of a split as prepare-data wrote it (data/tokens.py PreparedSplit)."""
        tok, data_dir, split = prepared.tokenizer, prepared.data_dir, prepared.name
        missing = [t for t in SPECIAL_TOKENS.values() if tok.token_to_id(t) is None]
        if missing:
            raise ConfigError(
                f"the tokenizer in {data_dir} has no {', '.join(missing)}: the data was prepared for another model "
                f"family; run prepare-data with model.arch=bert (or another data.dir)"
            )
        specials = {t: tok.token_to_id(t) for t in SPECIAL_TOKENS.values()}
        seed = cfg.run.seed if split == "train" else _VAL_SEED
        data = cls(prepared.shards(), cfg.model.sequence_len, specials, prepared.meta["vocab_size"], seed, split)
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
        return self.token_rows(index, 1)[0]

    def token_rows(self, first: int, count: int) -> np.ndarray:
        """Sequences first .. first+count-1 before masking, (count, sequence_len)."""
        index = np.arange(first, first + count) % self.num_sequences
        shard = np.searchsorted(self.offsets, index, side="right") - 1
        start = (index - self.offsets[shard]) * self.window
        out = np.empty((count, self.sequence_len), dtype=np.int64)
        out[:, 0], out[:, -1] = self.specials["[CLS]"], self.specials["[SEP]"]
        for row, (s, b) in enumerate(zip(shard.tolist(), start.tolist())):
            out[row, 1:-1] = self.shards[s][b : b + self.window]
        return out

    def batch(self, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Inputs and labels (count, sequence_len) for sequences first .. first+count-1; labels
        are -100 where nothing is predicted."""
        index = np.arange(first, first + count, dtype=np.int64)  # numpy: on 16 values, a third of torch's time
        row_keys = _mix(_mix((index & _MASK) ^ self.split_key) ^ (index >> 32))
        return self.mask(torch.from_numpy(self.token_rows(first, count)), torch.from_numpy(row_keys))

    def mask(self, ids: torch.Tensor, row_keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """BERT's masking of ids (B, T), every draw a hash of the row's key (B,) and the position."""
        T = ids.shape[1]
        drawn = _mix(row_keys[:, None] ^ _position_keys(T))  # (B, T), uniform in [0, 2^32)
        special = self.is_special.index_select(0, ids.reshape(-1)).view_as(ids)  # 3x faster than is_special[ids]
        # The K candidates of smallest hash: a sample without replacement. _mix is a bijection of
        # 32-bit values, so a row's hashes are distinct: no tie leaves the choice to topk.
        score = drawn.masked_fill(special, _NOT_A_CANDIDATE)
        picked = torch.topk(score, predictions_per_sequence(T), dim=1, largest=False, sorted=False).indices
        predicted = ~special.gather(1, picked)  # False where a row ran out of candidates
        original = ids.gather(1, picked)
        # A picked hash is among the row's smallest: mixed again, its last decimal digit makes the
        # 80/10/10 choice and the digits above it the random token.
        choice = _mix(drawn.gather(1, picked) ^ _CHOICE_SALT)
        bucket = torch.where(predicted, choice % 10, 9)  # 0-7 [MASK], 8 a random token, 9 kept
        random_token = self.replacements.take((choice // 10) % len(self.replacements))
        replaced = torch.where(bucket < 8, self.specials["[MASK]"], torch.where(bucket == 8, random_token, original))
        labels = torch.full_like(ids, -100).scatter_(1, picked, torch.where(predicted, original, -100))
        return ids.scatter(1, picked, replaced), labels

    # --- evaluation (evaluation/evaluate.py asks the split's batches to score themselves) --------------

    @staticmethod
    def score(model, x: torch.Tensor, y: torch.Tensor, autocast) -> torch.Tensor:
        """One batch's summed loss over the predicted positions, their count, and the right top
        predictions among them (fp64; a fourth sum, bytes, has no meaning here)."""
        with autocast:
            losses, hits = model(x, y, loss_reduction="hits").double()
        count = torch.tensor(losses.numel(), device=losses.device, dtype=torch.float64)
        return torch.stack([losses.sum(), count, hits.sum(), torch.zeros_like(count)])

    @staticmethod
    def scores(sums: torch.Tensor) -> dict:
        """Mean loss over the predicted positions, perplexity and masked-token accuracy: bits per
        byte would not compare with a causal model's."""
        loss = (sums[0] / sums[1]).item()
        accuracy = (sums[2] / sums[1]).item()  # top prediction right, of the predicted positions
        return {
            "val_loss": loss,
            "val_ppl": math.exp(loss),
            "val_accuracy": accuracy,
            "val_tokens": int(sums[1].item()),
        }


@functools.lru_cache(maxsize=8)
def _position_keys(sequence_len: int) -> torch.Tensor:
    return _mix(torch.arange(sequence_len, dtype=torch.int64))


def open_batches(cfg, prepared):
    """The family's batches of a prepared split (its descriptor's `batches`): inputs with [MASK],
    labels -100 where nothing is predicted."""
    return MaskedTokenData.open(cfg, prepared)
