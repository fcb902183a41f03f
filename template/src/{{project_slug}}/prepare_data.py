"""prepare-data: raw documents -> tokenizer.json + packed train/val token shards + meta.json.

    <package> prepare-data                  # reads data.dir/raw/*.{parquet,jsonl,txt}
    <package> prepare-data --demo-corpus    # first writes a small corpus from Python's docstrings
    <package> prepare-data data.tokenizer=/mnt/shared/models/bert-large-uncased   # a local tokenizer

The tokenizer: data.tokenizer when set (tokenizer.json, vocab.txt or a folder with either); for
model.arch=bert with model.pretrained, the tokenizer in that folder; else one trained on the raw
text (byte-level BPE for gpt/gpt3, WordPiece with [PAD] [UNK] [CLS] [SEP] [MASK] for bert). It is
saved as data.dir/tokenizer.json either way, so training never needs the original again.

Runs in one process on a CPU machine; every training node then reads the result from shared storage.
Documents are shuffled in blocks with a fixed seed so training can read the shards in order.
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import time
from pathlib import Path

import numpy as np

from .config import Config, ConfigError
from .data import (
    BERT_SPECIALS,
    META,
    ShardWriter,
    bos_id,
    find_raw_files,
    iter_documents,
    load_tokenizer,
    train_tokenizer,
)
from .demo_corpus import write_demo_corpus

_BLOCK_DOCS = 4096  # documents shuffled and encoded together


def prepare_data(cfg: Config, demo_corpus: bool = False) -> dict:
    data_dir = Path(cfg.data.dir)
    data_dir.mkdir(parents=True, exist_ok=True)
    started = time.time()
    if demo_corpus:
        print(f"writing the demo corpus to {write_demo_corpus(data_dir / 'raw')}", flush=True)
    files = find_raw_files(data_dir, cfg.data.raw)
    print(f"{len(files)} input file(s), first: {files[0]}", flush=True)

    tokenizer_path = data_dir / "tokenizer.json"
    tok = obtain_tokenizer(cfg, files, tokenizer_path)
    tok.save(str(tokenizer_path))

    vocab = tok.get_vocab_size()
    dtype = np.dtype(np.uint16 if vocab <= 2**16 else np.uint32)
    # Documents are separated by <|bos|> (gpt) or [SEP] (bert: mlm_data cuts [CLS] ... [SEP] windows).
    sep = tok.token_to_id("[SEP]") if cfg.model.arch == "bert" else bos_id(tok)
    writers = {s: ShardWriter(data_dir, s, dtype, cfg.data.shard_tokens) for s in ("train", "val")}
    rng = random.Random(cfg.run.seed)
    docs = iter_documents(files)
    first_block = True
    while block := list(itertools.islice(docs, _BLOCK_DOCS)):
        rng.shuffle(block)
        # At least one validation document even for a tiny corpus.
        n_val = max(int(first_block), round(len(block) * cfg.data.val_fraction))
        first_block = False
        for i, enc in enumerate(tok.encode_batch(block, add_special_tokens=False)):
            writers["val" if i < n_val else "train"].add([sep, *enc.ids])
    for w in writers.values():
        w.flush()
    meta = {
        "dtype": dtype.name,
        "vocab_size": vocab,
        "bos_id": sep,
        "tokenizer": "tokenizer.json",
        "train": writers["train"].shards,
        "val": writers["val"].shards,
    }
    (data_dir / META).write_text(json.dumps(meta, indent=2))
    n_train = sum(s["tokens"] for s in meta["train"])
    n_val = sum(s["tokens"] for s in meta["val"])
    print(
        f"wrote {n_train:,} train and {n_val:,} val tokens ({dtype.name}) to {data_dir} "
        f"in {time.time() - started:.1f}s",
        flush=True,
    )
    return meta


def obtain_tokenizer(cfg: Config, files: list[Path], tokenizer_path: Path):
    """The tokenizer named by the config (see the module docstring), or a newly trained one."""
    arch = cfg.model.arch
    if arch == "bert":
        from .models.bert import check_vocab, pretrained_folder, pretrained_vocab_size
    if cfg.data.tokenizer:
        tok = load_tokenizer(Path(cfg.data.tokenizer))
        print(f"using tokenizer {cfg.data.tokenizer} ({tok.get_vocab_size()} tokens)", flush=True)
    elif arch == "bert" and cfg.model.pretrained:
        folder = pretrained_folder(cfg.model.pretrained)
        if not any((folder / name).is_file() for name in ("tokenizer.json", "vocab.txt")):
            raise ConfigError(
                f"model.pretrained={cfg.model.pretrained!r} holds no tokenizer.json or vocab.txt; set "
                "data.tokenizer to the tokenizer these weights were trained with"
            )
        tok = load_tokenizer(folder)
        print(f"using the tokenizer of model.pretrained {folder} ({tok.get_vocab_size()} tokens)", flush=True)
    else:
        sample = _take_chars(iter_documents(files), cfg.data.tokenizer_train_chars)
        tok = train_tokenizer(sample, cfg.data.vocab_size, arch)
        kind = "WordPiece" if arch == "bert" else "BPE"
        print(f"trained a {tok.get_vocab_size()}-token {kind} tokenizer -> {tokenizer_path}", flush=True)
    if arch == "bert":
        missing = [t for t in BERT_SPECIALS if tok.token_to_id(t) is None]
        if missing:
            raise ConfigError(
                f"the tokenizer has no {', '.join(missing)}: model.arch=bert needs BERT's special tokens "
                f"{' '.join(BERT_SPECIALS)}; use a BERT tokenizer or leave data.tokenizer empty to train one"
            )
        if cfg.model.pretrained:  # fail before hours of tokenizing, not at train start
            check_vocab(cfg.model.pretrained, pretrained_vocab_size(cfg.model.pretrained), tok.get_vocab_size())
    return tok


def _take_chars(docs, limit: int):
    total = 0
    for doc in docs:
        if total >= limit:
            return
        total += len(doc)
        yield doc


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--demo-corpus", action="store_true", help="first write a small corpus from Python's docstrings")


def run(cfg: Config, args: argparse.Namespace) -> int:
    prepare_data(cfg, demo_corpus=args.demo_corpus)
    return 0
