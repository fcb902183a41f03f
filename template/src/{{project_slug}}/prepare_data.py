"""prepare-data: raw documents -> tokenizer.json + packed train/val token shards + meta.json.

    <package> prepare-data                  # reads data.dir/raw/*.{parquet,jsonl,txt}
    <package> prepare-data --demo-corpus    # first writes a small corpus from Python's docstrings
    <package> prepare-data data.tokenizer=/mnt/shared/models/bert-large-uncased   # a local tokenizer
    <package> prepare-data --force          # replace prepared data; the old moves to previous-<time>/

The tokenizer: data.tokenizer when set (tokenizer.json, vocab.txt or a folder with either); for
model.arch=bert with model.pretrained, the tokenizer in that folder; else one trained on the raw
text (byte-level BPE for gpt/gpt3, WordPiece with [PAD] [UNK] [CLS] [SEP] [MASK] for bert). It is
saved as data.dir/tokenizer.json either way, so training never needs the original again.

Runs in one process on a CPU machine; every training node then reads the result from shared storage.
Documents are shuffled in blocks with a fixed seed so training can read the shards in order.

Nothing is half written: the files are made in a hidden folder inside data.dir and moved into place
(meta.json last) only when all of them are good, so a refused or interrupted run leaves data.dir as
it was. Prepared data is never replaced silently: runs trained on it need its exact token ids, and
checkpoints record its fingerprint (data.py). With --force the replaced files move, whole, to
data.dir/previous-<UTC time>/, a data folder those runs can continue from.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import re
import shutil
import time
from pathlib import Path

import numpy as np

from .config import Config, ConfigError
from .data import (
    BERT_SPECIALS,
    META,
    ShardWriter,
    bos_id,
    compute_fingerprint,
    data_fingerprint,
    load_tokenizer,
    train_tokenizer,
)
from .demo_corpus import write_demo_corpus
from .documents import check_input_file, find_raw_files, iter_documents

_BLOCK_DOCS = 4096  # documents shuffled and encoded together
TOKENIZER = "tokenizer.json"
_OUTPUT = re.compile(r"(meta\.json|tokenizer\.json|(train|val)_\d{5}\.bin(\.tmp)?)")  # what a run replaces


def prepare_data(cfg: Config, demo_corpus: bool = False, force: bool = False) -> dict:
    data_dir = Path(cfg.data.dir)
    replaced = _replaced_fingerprint(data_dir, force)
    started = time.time()
    created = [d for d in (data_dir, data_dir / "raw") if not d.exists()]  # removed again if this run fails
    staging = data_dir / f".prepare-data-{os.getpid()}"
    demo = None
    try:
        if demo_corpus:
            demo = write_demo_corpus(data_dir / "raw")
            print(f"writing the demo corpus to {demo}", flush=True)
        files = find_raw_files(data_dir, cfg.data.raw)
        for path in files:  # before hours of tokenizing: empty, binary and broken files
            check_input_file(path)
        print(f"{len(files)} input file(s), first: {files[0]}", flush=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        meta = _write_data(cfg, files, staging, data_dir / TOKENIZER)
        _check_long_enough(cfg, meta, files)
        previous = _install(staging, data_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if demo is not None and demo.parent in created:
            demo.unlink(missing_ok=True)
        for folder in reversed(created):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    n_train = sum(s["tokens"] for s in meta["train"])
    n_val = sum(s["tokens"] for s in meta["val"])
    print(
        f"wrote {n_train:,} train and {n_val:,} val tokens ({meta['dtype']}) to {data_dir} "
        f"in {time.time() - started:.1f}s; data fingerprint {meta['fingerprint']}",
        flush=True,
    )
    if previous is not None and replaced is None:
        print(f"moved the files of an unfinished prepare-data (no {META}) to {previous}", flush=True)
    elif previous is not None:
        same = " (the same data: nothing changes for its runs)" if replaced == meta["fingerprint"] else ""
        print(
            f"the data it replaced (fingerprint {replaced}){same} is in {previous}: runs trained on it "
            f"continue with data.dir={previous}; delete that folder when no run needs it",
            flush=True,
        )
    return meta


def _replaced_fingerprint(data_dir: Path, force: bool) -> str | None:
    """Refuse to replace prepared data unless forced; the fingerprint of what --force replaces."""
    if not (data_dir / META).is_file():
        return None
    try:
        fingerprint = data_fingerprint(data_dir)
    except (ConfigError, OSError, ValueError, KeyError, TypeError):
        fingerprint = "unreadable"  # a damaged meta.json is still not overwritten unasked
    if not force:
        raise ConfigError(
            f"{data_dir} already holds prepared data (fingerprint {fingerprint}), and runs trained on it need "
            f"exactly its tokenizer and token ids; use another data.dir, or add --force to replace it (the "
            f"current {TOKENIZER}, {META} and shards then move to {data_dir}/previous-<UTC time>/)"
        )
    return fingerprint


def _write_data(cfg: Config, files: list[Path], folder: Path, tokenizer_path: Path) -> dict:
    """Tokenizer, shards and meta.json (with the fingerprint) in folder; returns the meta."""
    tok = obtain_tokenizer(cfg, files, tokenizer_path)
    tok.save(str(folder / TOKENIZER))

    vocab = tok.get_vocab_size()
    dtype = np.dtype(np.uint16 if vocab <= 2**16 else np.uint32)
    # Documents are separated by <|bos|> (gpt) or [SEP] (bert: mlm_data cuts [CLS] ... [SEP] windows).
    sep = tok.token_to_id("[SEP]") if cfg.model.arch == "bert" else bos_id(tok)
    writers = {s: ShardWriter(folder, s, dtype, cfg.data.shard_tokens) for s in ("train", "val")}
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
        "tokenizer": TOKENIZER,
        "train": writers["train"].shards,
        "val": writers["val"].shards,
        "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    meta["fingerprint"] = compute_fingerprint(folder, meta)
    (folder / META).write_text(json.dumps(meta, indent=2))
    return meta


def _check_long_enough(cfg: Config, meta: dict, files: list[Path]) -> None:
    """Refuse data that holds no whole training sequence (sequence_len + 1 tokens) in a split:
    training would stop at its start (sequences do not cross shards)."""
    need = cfg.model.sequence_len + 1
    longest = {split: max((s["tokens"] for s in meta[split]), default=0) for split in ("train", "val")}
    short = [split for split, tokens in longest.items() if tokens < need]
    if not short:
        return
    inputs = (
        f"the documents of {files[0]}"
        if len(files) == 1
        else f"the documents of {len(files)} files in {files[0].parent}"
    )
    fix = "add documents or lower model.sequence_len"
    if short == ["val"]:
        fix = f"raise data.val_fraction (now {cfg.data.val_fraction}), add documents or lower model.sequence_len"
    raise ConfigError(
        f"{inputs} are too short for one sequence: {longest['train']:,} train and {longest['val']:,} val tokens "
        f"(largest shard), model.sequence_len={need - 1} needs {need} in {' and in '.join(short)}; {fix}"
    )


def _install(staging: Path, data_dir: Path) -> Path | None:
    """Move the staged files into data_dir, meta.json last; files of an earlier run first move
    (meta.json first) to a new previous-<UTC time>/ folder, which is returned."""
    old = [p for p in data_dir.iterdir() if p.is_file() and _OUTPUT.fullmatch(p.name)]
    previous = None
    if old:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        previous = data_dir / f"previous-{stamp}"
        suffix = 1
        while previous.exists():
            suffix += 1
            previous = data_dir / f"previous-{stamp}-{suffix}"
        previous.mkdir()
        for path in sorted(old, key=lambda p: p.name != META):
            os.replace(path, previous / path.name)
    for path in sorted(staging.iterdir(), key=lambda p: p.name == META):
        os.replace(path, data_dir / path.name)
    return previous


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
    p.add_argument(
        "--force",
        action="store_true",
        help="replace data already prepared in data.dir (the old files move to data.dir/previous-<UTC time>/)",
    )


def run(cfg: Config, args: argparse.Namespace) -> int:
    prepare_data(cfg, demo_corpus=args.demo_corpus, force=args.force)
    return 0
