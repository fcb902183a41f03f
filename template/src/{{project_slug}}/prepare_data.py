"""prepare-data: raw documents -> tokenizer.json + packed train/val token shards + meta.json.

    <package> prepare-data                  # reads data.dir/raw/*.{parquet,jsonl,txt}
    <package> prepare-data --demo-corpus    # first writes a small corpus from Python's docstrings

Runs in one process on a CPU machine; every training node then reads the result from shared storage.
Documents are shuffled in blocks with a fixed seed so training can read the shards in order.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from pathlib import Path

import numpy as np

from .config import Config
from .data import META, ShardWriter, bos_id, find_raw_files, iter_documents, load_tokenizer, train_tokenizer
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
    if cfg.data.tokenizer:
        tok = load_tokenizer(Path(cfg.data.tokenizer))
        tok.save(str(tokenizer_path))
        print(f"using tokenizer {cfg.data.tokenizer} ({tok.get_vocab_size()} tokens)", flush=True)
    else:
        sample = _take_chars(iter_documents(files), cfg.data.tokenizer_train_chars)
        tok = train_tokenizer(sample, cfg.data.vocab_size)
        tok.save(str(tokenizer_path))
        print(f"trained a {tok.get_vocab_size()}-token BPE tokenizer -> {tokenizer_path}", flush=True)

    vocab = tok.get_vocab_size()
    dtype = np.dtype(np.uint16 if vocab <= 2**16 else np.uint32)
    sep = bos_id(tok)
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


def _take_chars(docs, limit: int):
    total = 0
    for doc in docs:
        if total >= limit:
            return
        total += len(doc)
        yield doc
