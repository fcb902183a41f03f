"""data.rows=documents: training rows that start at a document, documents packed into them best-fit.

    data = DocumentRows.open(data_dir, "train", sequence_len)   # the interface of tokens.TokenData
    x, y = data.batch(first, count)

Each row of sequence_len + 1 tokens is filled in turn from a window of the next BUFFER documents (in
the split's order): the longest document that still fits whole, again and again; when none fits, the
shortest one is cut to fill the row exactly and its rest dropped. Every row so starts with <|bos|>
and ends full, no padding; nanochat packs its rows this way. A document longer than a row is only
ever a row's cut tail. Rows never cross shards. The packing is a pure function of the shards, so
row `index` is the same on every rank, after a resume and on any number of processes (the windows'
guarantees); a pass over the split is num_sequences rows, fewer than the windows (what the cuts drop).

Validation keeps the windows (data/splits.py): its score stays comparable across layouts.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..settings.config import ConfigError
from .tokens import TokenData, bos_id, data_tokenizer, open_shards, read_meta

BUFFER = 1000  # documents the packer chooses among


def pack_shard(tokens: np.ndarray, bos: int, capacity: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(segment starts, segment lengths, first segment of each row + the end) of one shard's rows."""
    starts = np.flatnonzero(tokens == bos)
    ends = np.append(starts[1:], len(tokens))
    # The documents not yet in the buffer, as its sort keys (length, -order, start): among equal
    # lengths the earliest document sorts last, where the search for the longest that fits lands.
    pending = iter(zip((ends - starts).tolist(), itertools.count(0, -1), starts.tolist()))
    buffer = sorted(itertools.islice(pending, BUFFER))
    seg_start, seg_len, row_first = [], [], [0]
    while True:
        placed, position = [], 0
        while position < capacity and buffer:
            room = capacity - position
            fits = bisect.bisect_right(buffer, (room, float("inf"), 0)) - 1
            length, _, start = buffer.pop(fits if fits >= 0 else 0)
            take = min(length, room)  # the shortest one cut when none fits whole
            placed.append((start, take))
            position += take
            for doc in itertools.islice(pending, 1):  # the buffer refilled to BUFFER documents
                bisect.insort(buffer, doc)
        if position < capacity:  # the shard's last documents do not fill a row
            break
        seg_start += [start for start, _ in placed]
        seg_len += [take for _, take in placed]
        row_first.append(len(seg_start))
    return np.asarray(seg_start, dtype=np.int64), np.asarray(seg_len, dtype=np.int64), np.asarray(row_first)


@dataclass
class DocumentRows:
    """Memory-mapped shards of one split, addressed as rows of whole documents (and a cut tail)."""

    shards: list[np.memmap]
    sequence_len: int
    bos: int

    @classmethod
    def open(cls, data_dir: Path, split: str, sequence_len: int) -> DocumentRows:
        shards = open_shards(data_dir, read_meta(data_dir), split)
        data = cls(shards, sequence_len, bos_id(data_tokenizer(data_dir)))
        if data.num_sequences == 0:
            raise ConfigError(
                f"the {split} split in {data_dir} holds no row of {sequence_len + 1} tokens of whole documents; "
                "add data or lower model.sequence_len",
                key="data.rows",
            )
        return data

    def __post_init__(self):
        self.packed = [pack_shard(np.asarray(s), self.bos, self.sequence_len + 1) for s in self.shards]
        self.offsets = np.cumsum([0] + [len(first) - 1 for _, _, first in self.packed])

    @property
    def num_sequences(self) -> int:
        return int(self.offsets[-1])

    def sequence(self, index: int) -> np.ndarray:
        index %= self.num_sequences  # wrap around: a new epoch starts over
        shard = int(np.searchsorted(self.offsets, index, side="right") - 1)
        starts, lengths, first = self.packed[shard]
        row = index - int(self.offsets[shard])
        parts = range(first[row], first[row + 1])
        tokens = self.shards[shard]
        return np.concatenate([np.asarray(tokens[starts[i] : starts[i] + lengths[i]], dtype=np.int64) for i in parts])

    batch = TokenData.batch  # rows first .. first+count-1 as inputs and targets (count, T)
