"""Tokenizer and packed token shards.

Layout of the data folder (on shared storage, read by every rank):
  raw/               input documents: *.parquet, *.jsonl, *.txt (read by documents.py)
  tokenizer.json     BPE tokenizer (trained by prepare-data or given by the user)
  train_00000.bin    token ids, uint16 or uint32, documents separated by the <|bos|> token
  val_00000.bin      held-out documents, same format
  meta.json          dtype, vocabulary size, shard token counts and the data's fingerprint
  previous-<time>/   what `prepare-data --force` replaced (a complete data folder without raw/)

The fingerprint (data_fingerprint) names the tokenizer and the token ids together; every checkpoint
records the one it was trained on, and a resume, eval or sample on other data is refused.

Training reads fixed-length sequences in order; the position in the stream is a pure function of
the optimizer step, so every rank knows its slice without coordination and resume is exact.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..models.family import TOKENIZER_KINDS, Family, families
from ..settings.config import ConfigError
from ..settings.packages import import_transformers
from ..settings.stored_files import DamagedFile, read_json

BOS = "<|bos|>"
# Where a BPE token may not cross: GPT-4's pattern with digits in groups of one or two (nanochat's
# choice). Trained on the demo text at 8192 tokens it holds 4.07 bytes a token against 3.88 with
# GPT-2's pattern (ByteLevel's own): equal tokens are 5% more text.
SPLIT_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,2}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+"""
)
META = "meta.json"


def train_tokenizer(read_sample: Callable[[str], Iterator[str]], vocab_size: int):
    """A byte-level BPE tokenizer (GPT-2 style: every byte is representable, nothing is unknown)
    trained on the texts of read_sample(purpose), with BOS as its one special token. The same sample
    gives the same tokenizer, token ids included, on any machine. A family of another tokenizer kind
    trains its own (its descriptor's tokenizer_trainer)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,  # its bars would draw over prepare-data's (they count the same documents)
    )
    tok.train_from_iterator(read_sample("the tokenizer"), trainer=trainer)
    return tok


def data_tokenizer(data_dir: Path):
    """The tokenizer the prepared data in data_dir was encoded with (meta.json names it)."""
    return load_tokenizer(Path(data_dir) / read_meta(Path(data_dir))["tokenizer"])


# What a tokenizer folder may hold, in the order they are looked for (load_tokenizer), before the
# files of the families' own kinds (family_tokenizer_files).
TOKENIZER_FILES = (
    "tokenizer.json (with tokenizer_config.json: a transformers folder)",
    "vocab.json + merges.txt (GPT-2 byte-level BPE)",
)
# A transformers folder's own description of its tokenizer: its special tokens, its class's settings.
TRANSFORMERS_CONFIGS = ("tokenizer_config.json", "special_tokens_map.json")
GPT2_SEPARATOR = "<|endoftext|>"


def family_tokenizer_files() -> dict[str, Family]:
    """The tokenizer files of a kind of its own that a family of this project reads (its descriptor's
    tokenizer_files): file name -> the family."""
    return {name: fam for fam in families().values() for name in fam.tokenizer_files}


def load_tokenizer(path: Path):
    """A tokenizers.Tokenizer from what users have: a tokenizer.json; a transformers tokenizer folder
    (tokenizer.json and tokenizer_config.json: loaded by transformers, so its special tokens and its
    class's settings hold); GPT-2's vocab.json + merges.txt (a folder holding them, or either file,
    also under a prefix such as gpt2-vocab.json + gpt2-merges.txt); a file of a family's own kind;
    or a folder holding any of these (TOKENIZER_FILES, first found wins)."""
    from tokenizers import Tokenizer

    path = Path(path)
    if path.is_dir():
        return _from_folder(path)
    if not path.is_file():
        raise ConfigError(f"tokenizer {path} not found; run prepare-data first or set data.tokenizer")
    if path.name.endswith(("vocab.json", "merges.txt")):
        return _gpt2_from_files(path)
    own = family_tokenizer_files()
    for name, fam in own.items():
        if path.suffix == Path(name).suffix:
            return fam.read_tokenizer_file(name, path)
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
        raise ConfigError(
            f"tokenizer {path} could not be read ({_first_line(exc)}); give a tokenizer.json, GPT-2's "
            f"vocab.json + merges.txt{''.join(f' or a {name}' for name in own)}",
            key="data.tokenizer",
        ) from None


def _from_folder(folder: Path):
    has = {name for name in ("tokenizer.json", "vocab.json", "merges.txt") if (folder / name).is_file()}
    transformers_folder = any((folder / name).is_file() for name in TRANSFORMERS_CONFIGS)
    if "tokenizer.json" in has or (transformers_folder and {"vocab.json", "merges.txt"} <= has):
        return _from_transformers_folder(folder) if transformers_folder else load_tokenizer(folder / "tokenizer.json")
    if {"vocab.json", "merges.txt"} & has:
        return _gpt2_from_files(folder / ("vocab.json" if "vocab.json" in has else "merges.txt"))
    own = family_tokenizer_files()
    for name, fam in own.items():
        if (folder / name).is_file():
            return fam.read_tokenizer_file(name, folder / name)
    looked_for = [
        *TOKENIZER_FILES,
        *(f"{name} ({fam.name}'s {TOKENIZER_KINDS[fam.tokenizer]})" for name, fam in own.items()),
    ]
    raise ConfigError(
        f"tokenizer folder {folder} holds no tokenizer files: looked for {'; '.join(looked_for)}; "
        "copy them there or point data.tokenizer at them",
        key="data.tokenizer",
    )


def _from_transformers_folder(folder: Path):
    """The folder's tokenizer as transformers loads it (AutoTokenizer when tokenizer_config.json names
    the class, else the generic fast tokenizer): special tokens from special_tokens_map.json and
    tokenizer_config.json are special here too (never split, no bytes in bits-per-byte)."""
    transformers = import_transformers("a tokenizer folder's tokenizer (tokenizer.json, vocab.txt)")
    try:
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        named = isinstance(config, dict) and config.get("tokenizer_class")
        loader = transformers.AutoTokenizer if named else transformers.PreTrainedTokenizerFast
        loaded = loader.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # malformed JSON, an unknown class, a missing file: transformers raises many kinds
        raise ConfigError(
            f"tokenizer folder {folder} could not be read by transformers ({_first_line(exc)}); "
            "fix or remove its tokenizer_config.json / special_tokens_map.json, or point data.tokenizer at its tokenizer.json",
            key="data.tokenizer",
        ) from None
    backend = getattr(loaded, "backend_tokenizer", None)
    if backend is None:
        raise ConfigError(
            f"tokenizer folder {folder} loads as {type(loaded).__name__}, which has no tokenizer.json form; "
            "save it with a fast tokenizer (tokenizer.save_pretrained) and point data.tokenizer at that folder",
            key="data.tokenizer",
        )
    return backend


def _gpt2_from_files(given: Path):
    """GPT-2's byte-level BPE from its vocab.json and merges.txt (either path names the pair: the
    other is the sibling with the same prefix), with <|endoftext|> as the special document separator."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

    prefix = given.name[: -len("vocab.json")] if given.name.endswith("vocab.json") else given.name[: -len("merges.txt")]
    vocab, merges = given.with_name(prefix + "vocab.json"), given.with_name(prefix + "merges.txt")
    for present, missing in ((vocab, merges), (merges, vocab)):
        if present.is_file() and not missing.is_file():
            raise ConfigError(
                f"tokenizer {present} has no {missing.name} beside it: GPT-2's byte-level BPE needs both "
                f"{vocab.name} and {merges.name}; copy {missing.name} into {missing.parent}",
                key="data.tokenizer",
            )
    try:
        table = json.loads(vocab.read_text(encoding="utf-8"))
        if not isinstance(table, dict) or not all(isinstance(i, int) for i in table.values()):
            raise ValueError("not a JSON object of token -> id")
        tok = Tokenizer(models.BPE.from_file(str(vocab), str(merges)))
    except Exception as exc:  # json's, ours, or tokenizers' bare Exception on a bad merges line
        raise ConfigError(
            f"tokenizer {vocab} + {merges.name} could not be read ({_first_line(exc)}); give GPT-2's "
            "vocab.json (token -> id) and merges.txt (one 'left right' pair a line)",
            key="data.tokenizer",
        ) from None
    # GPT-2's settings, as transformers' GPT2 tokenizer sets them.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    if GPT2_SEPARATOR in table:
        tok.add_special_tokens([GPT2_SEPARATOR])
    return tok


def _first_line(exc: Exception) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def bos_id(tok) -> int:
    """Id of the document separator; user tokenizers may name it differently."""
    for name in (BOS, GPT2_SEPARATOR, "</s>", "[SEP]", "<s>"):
        idx = tok.token_to_id(name)
        if idx is not None:
            return idx
    raise ConfigError(f"tokenizer has none of the separator tokens {BOS}, {GPT2_SEPARATOR}, </s>, [SEP], <s>; add one")


def token_byte_lengths(tok) -> np.ndarray:
    """UTF-8 bytes each token stands for (0 for special tokens), for bits-per-byte."""
    from tokenizers import decoders, models, pre_tokenizers

    vocab = tok.get_vocab()
    lengths = np.zeros(tok.get_vocab_size(), dtype=np.int64)
    specials = {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    # Byte-level BPE: ours (a split pattern, then ByteLevel) and GPT-2's decode through ByteLevel.
    byte_level = isinstance(tok.pre_tokenizer, pre_tokenizers.ByteLevel) or isinstance(tok.decoder, decoders.ByteLevel)
    # WordPiece marks a word's continuation with a prefix ("##ing"); the prefix is no text.
    prefix = tok.model.continuing_subword_prefix if isinstance(tok.model, models.WordPiece) else None
    for token, idx in vocab.items():
        if token in specials:
            continue
        # Byte-level tokens spell one byte per character; WordPiece ones are text; others are decoded.
        if byte_level:
            lengths[idx] = len(token)
        elif prefix is not None:
            lengths[idx] = len(token.removeprefix(prefix).encode("utf-8"))
        else:
            lengths[idx] = len(tok.decode([idx]).encode("utf-8"))
    return lengths


class ShardWriter:
    """Appends token ids to numbered shard files of at least `shard_tokens` tokens (a document is
    never split between shards), written as they come: memory does not grow with the shard."""

    def __init__(self, folder: Path, prefix: str, dtype: np.dtype, shard_tokens: int):
        self.folder, self.prefix, self.dtype, self.shard_tokens = folder, prefix, dtype, shard_tokens
        self.shards: list[dict] = []
        self._file = None
        self._written = 0

    def add(self, ids) -> None:
        if self._file is None:
            self._file = (self.folder / (self._name() + ".tmp")).open("wb")
        np.asarray(ids, dtype=self.dtype).tofile(self._file)
        self._written += len(ids)

    def end_document(self) -> None:
        """A document boundary: the shard closes here once it holds shard_tokens."""
        if self._written >= self.shard_tokens:
            self.flush()

    def flush(self) -> None:
        if self._file is None:
            return
        self._file.close()
        name = self._name()
        (self.folder / (name + ".tmp")).replace(self.folder / name)
        self.shards.append({"file": name, "tokens": self._written})
        self._file, self._written = None, 0

    def _name(self) -> str:
        return f"{self.prefix}_{len(self.shards):05d}.bin"


def sequences_in_shard(tokens: int, sequence_len: int, causal: bool) -> int:
    """Sequences training reads from a shard of `tokens` tokens (windows never cross shards).
    Causal: inputs and their shifted targets take sequence_len + 1 tokens, and the next window starts
    sequence_len later. Masked: sequence_len - 2 tokens between the two special tokens that open and
    close a masked LM's sequence."""
    if causal:
        return max(0, (tokens - 1) // sequence_len)
    return tokens // max(1, sequence_len - 2)


def require_shards(data_dir: Path, meta: dict, split: str) -> None:
    """One line for a shard meta.json lists that is gone (one deleted, a copy cut short), or whose size
    is not its token count times the dtype's bytes (a copy cut short, a dtype edited in meta.json:
    read anyway, such a shard would give other token ids)."""
    missing = [s["file"] for s in meta[split] if not (data_dir / s["file"]).is_file()]
    if missing:
        raise ConfigError(
            f"{data_dir / missing[0]} is listed in meta.json but missing ({len(missing)} {split} shard(s)); "
            f"run prepare-data again for data.dir={data_dir}",
            key="data.dir",
        )
    itemsize = np.dtype(meta["dtype"]).itemsize
    for shard in meta[split]:
        size, expected = (data_dir / shard["file"]).stat().st_size, shard["tokens"] * itemsize
        if size != expected:
            raise ConfigError(
                f"{data_dir / shard['file']} has {size:,} bytes, but meta.json says {shard['tokens']:,} tokens of "
                f"{meta['dtype']} ({expected:,} bytes): the shard or meta.json was changed after prepare-data; "
                f"run `prepare-data --force` for data.dir={data_dir}",
                key="data.dir",
            )


def open_shards(data_dir: Path, meta: dict, split: str) -> list[np.memmap]:
    """The split's shards, memory-mapped, once require_shards has found them as meta.json says."""
    require_shards(data_dir, meta, split)
    dtype = np.dtype(meta["dtype"])
    return [np.memmap(data_dir / s["file"], dtype=dtype, mode="r") for s in meta[split]]


@dataclass
class PreparedSplit:
    """One split as prepare-data wrote it, for a family's own batches (its descriptor's `batches`): the
    folder, its meta.json and the tokenizer that encoded it; shards() memory-maps the token ids."""

    data_dir: Path
    name: str
    meta: dict
    tokenizer: Any

    @classmethod
    def open(cls, data_dir: Path, name: str) -> PreparedSplit:
        meta = read_meta(data_dir)
        return cls(data_dir, name, meta, load_tokenizer(data_dir / meta["tokenizer"]))

    def shards(self) -> list[np.memmap]:
        return open_shards(self.data_dir, self.meta, self.name)


@dataclass
class TokenData:
    """Memory-mapped shards of one split, addressed as a list of fixed-length sequences."""

    shards: list[np.memmap]
    sequence_len: int

    @classmethod
    def open(cls, data_dir: Path, split: str, sequence_len: int) -> TokenData:
        shards = open_shards(data_dir, read_meta(data_dir), split)
        data = cls(shards, sequence_len)
        if data.num_sequences == 0:
            raise ConfigError(
                f"the {split} split in {data_dir} holds fewer than {sequence_len + 1} tokens per shard; "
                "add data or lower model.sequence_len"
            )
        return data

    def __post_init__(self):
        self.counts = [sequences_in_shard(len(s), self.sequence_len, causal=True) for s in self.shards]
        self.offsets = np.cumsum([0] + self.counts)

    @property
    def num_sequences(self) -> int:
        return int(self.offsets[-1])

    def sequence(self, index: int) -> np.ndarray:
        index %= self.num_sequences  # wrap around: a new epoch starts over
        shard = int(np.searchsorted(self.offsets, index, side="right") - 1)
        start = (index - int(self.offsets[shard])) * self.sequence_len
        return np.asarray(self.shards[shard][start : start + self.sequence_len + 1], dtype=np.int64)

    def batch(self, first: int, count: int):
        """Inputs and targets (count, T) for sequences first .. first+count-1."""
        import torch

        rows = torch.from_numpy(np.stack([self.sequence(first + i) for i in range(count)]))
        return rows[:, :-1], rows[:, 1:]


def micro_batch_start(step: int, micro: int, rank: int, global_batch: int, micro_batch: int, accum: int) -> int:
    """Index of the first sequence of one micro batch: step blocks of the global batch, each split
    into contiguous per-rank slices. The order is the same for any world size, so one process with
    more accumulation sees exactly the data of several processes."""
    return step * global_batch + rank * micro_batch * accum + micro * micro_batch


def read_meta(data_dir: Path) -> dict:
    path = data_dir / META
    if not path.is_file():
        raise ConfigError(f"{path} not found: run `prepare-data` first (data.dir={data_dir})")
    try:
        meta = read_json(path, fix="run `prepare-data --force`")
        problem = _meta_problem(meta)
    except DamagedFile as exc:
        problem = exc.problem
    if problem:
        raise ConfigError(
            f"{path} is damaged ({problem}): run `prepare-data --force` to prepare data.dir={data_dir} again",
            key="data.dir",
        )
    return meta


def _meta_problem(meta) -> str | None:
    """What makes a parsed meta.json unusable (edited by hand, or written by something else)."""
    if not isinstance(meta, dict):
        return "not a JSON object"
    missing = [key for key in ("dtype", "vocab_size", "tokenizer", "train", "val") if key not in meta]
    if missing:
        return "no " + ", ".join(missing)
    if not isinstance(meta["tokenizer"], str):
        return f"tokenizer {meta['tokenizer']!r} is not a file name"
    try:
        dtype = np.dtype(meta["dtype"])
    except (TypeError, ValueError):
        return f"dtype {meta['dtype']!r} is not a NumPy dtype"
    if dtype.kind != "u":
        return f"dtype {meta['dtype']!r} is not an unsigned integer type (prepare-data writes uint16 or uint32)"
    if not isinstance(meta["vocab_size"], int) or isinstance(meta["vocab_size"], bool) or meta["vocab_size"] < 1:
        return f"vocab_size {meta['vocab_size']!r} is not a positive whole number"
    for split in ("train", "val"):
        shards = meta[split]
        if not isinstance(shards, list) or not all(
            isinstance(s, dict) and isinstance(s.get("file"), str) and isinstance(s.get("tokens"), int) for s in shards
        ):
            return f"{split} is not a list of shards with a file and a token count"
    return None


# Bytes read from each end of every shard for the fingerprint: cheap on terabytes, and a corpus
# tokenized again differs there (documents are shuffled into shards) or in the shards' sizes.
_FINGERPRINT_SAMPLE = 1 << 16


def compute_fingerprint(data_dir: Path, meta: dict) -> str:
    """16 hex digits of SHA-256 over what fixes the token ids training reads: meta's dtype, vocab
    size, separator and shard list, the whole tokenizer.json, and each shard's name, size in bytes
    and first and last 64 KiB. Not a hash of every byte: that would read the whole corpus (hours
    for terabytes) at every resume, eval and sample, and guards only against editing a shard by hand."""
    digest = hashlib.sha256()
    described = {key: meta.get(key) for key in ("dtype", "vocab_size", "bos_id", "train", "val")}
    digest.update(json.dumps(described, sort_keys=True).encode())
    try:
        digest.update((data_dir / meta["tokenizer"]).read_bytes())
        for shard in meta["train"] + meta["val"]:
            path = data_dir / shard["file"]
            size = path.stat().st_size
            digest.update(f"{shard['file']}:{size}".encode())
            with path.open("rb") as f:
                digest.update(f.read(_FINGERPRINT_SAMPLE))
                if size > _FINGERPRINT_SAMPLE:
                    f.seek(max(_FINGERPRINT_SAMPLE, size - _FINGERPRINT_SAMPLE))
                    digest.update(f.read())
    except FileNotFoundError as exc:
        raise ConfigError(
            f"{exc.filename} is missing, but {data_dir / META} names it; run prepare-data again"
        ) from None
    return digest.hexdigest()[:16]


def data_fingerprint(data_dir: Path, meta: dict | None = None) -> str:
    """The fingerprint meta.json records (computed for data prepared before meta.json held one)."""
    meta = read_meta(data_dir) if meta is None else meta
    return meta.get("fingerprint") or compute_fingerprint(data_dir, meta)


def find_data(fingerprint: str, folders: list[Path]) -> Path | None:
    """The first of folders, or of the previous-*/ folders prepare-data --force left in them,
    whose data has this fingerprint."""
    for folder in folders:
        for candidate in [folder, *sorted(folder.glob("previous-*"), reverse=True)]:
            try:
                if (candidate / META).is_file() and data_fingerprint(candidate) == fingerprint:
                    return candidate
            except (ConfigError, OSError, ValueError):  # a damaged folder is simply not the one
                continue
    return None
