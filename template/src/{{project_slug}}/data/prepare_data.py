"""prepare-data: raw documents -> tokenizer.json + packed train/val token shards + meta.json.

    <package> prepare-data                  # reads data.dir/raw/*.{parquet,jsonl,txt}
    <package> prepare-data --demo-corpus    # first writes a small corpus from Python's docstrings
    <package> prepare-data data.tokenizer=/mnt/shared/tokenizers/mine     # a local tokenizer
    <package> prepare-data --force          # replace prepared data; the old moves to previous-<time>/

The tokenizer: data.tokenizer when set (data/tokens.py load_tokenizer reads what users have); for a
family that starts from local weights (model.pretrained), the tokenizer in that folder; else one
trained on the raw text: byte-level BPE, or the family's own kind with its special tokens (its
descriptor). It is saved as data.dir/tokenizer.json either way, so training never needs the original
again.

Runs on one CPU machine, on every core: the input is cut into parts (documents.py) that worker
processes encode into shards of their own (encode_parts.py; --workers, default one per core, each
with a share of the library's threads); every training node then reads the result from shared
storage. Documents are shuffled in blocks with a fixed seed so training can read the shards in order.
Progress (documents, tokens, tokens/s, time left) goes to stderr as a bar on a terminal, and to
stdout as a line every 30 s in a log.

Nothing is half written: the files are made in data.dir/.prepare-data/ and moved into place
(meta.json last) only when all of them are good, so a refused run leaves data.dir as it was. An
interrupted one (Ctrl-C, a killed job) leaves its finished parts there: the same command continues
from them, as long as the input files and settings are unchanged (else it starts over and says why). Prepared data is never replaced silently: runs trained on it need its exact token ids, and
checkpoints record its fingerprint (data.py). With --force the replaced files move, whole, to
data.dir/previous-<UTC time>/, a data folder those runs can continue from.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from ..models.family import TOKENIZER_KINDS, check_vocab, family
from ..settings.bounds import count, mebibytes
from ..settings.config import Config, ConfigError
from .demo_corpus import write_demo_bundle, write_demo_corpus
from .documents import PART_BYTES, SEGMENT_CHARS, Part, check_input_file, find_raw_files, iter_segments, plan_parts
from .encode_parts import BLOCK_CHARS, BLOCK_SEGMENTS, ORDER_VERSION, EncodeSettings
from .encode_workers import WorkerDied, encode_all
from .progress import Progress
from .staging import Staging, stat_of
from .tokens import META, bos_id, compute_fingerprint, data_fingerprint, load_tokenizer, train_tokenizer

TOKENIZER = "tokenizer.json"
_OUTPUT = re.compile(r"(meta\.json|tokenizer\.json|(train|val)_\d{5}\.bin(\.tmp)?)")  # what a run replaces


def prepare_data(
    cfg: Config,
    demo_corpus: bool = False,
    force: bool = False,
    workers: int | None = None,
    part_bytes: int = PART_BYTES,
) -> dict:
    data_dir = Path(cfg.data.dir)
    replaced = _replaced_fingerprint(data_dir, force)
    started = time.monotonic()
    created = [d for d in (data_dir, data_dir / "raw") if not d.exists()]  # removed again if this run is refused
    staging = Staging(data_dir)
    opened = False
    demo = None
    try:
        if demo_corpus:
            demo = write_demo_corpus(data_dir / "raw")
            print(f"writing the demo corpus to {demo}", flush=True)
        files = find_raw_files(data_dir, cfg.data.raw)
        for path in files:  # before hours of tokenizing: empty, binary and broken files
            check_input_file(path)
        print(f"{len(files)} input file{'s' if len(files) > 1 else ''}, first: {files[0]}", flush=True)
        note = staging.open(_plan(cfg, files, part_bytes))
        opened = True
        if note:
            print(note, flush=True)
        meta, run = _write_data(cfg, files, plan_parts(files, part_bytes), staging, data_dir / TOKENIZER, workers)
        _check_long_enough(cfg, meta, files)
        previous = _install(staging.out, data_dir)
        staging.remove()
    except ConfigError:  # refused: nothing of this run stays
        if opened:
            staging.remove()
        if demo is not None and demo.parent in created:
            demo.unlink(missing_ok=True)
        for folder in reversed(created):
            if folder.is_dir() and not any(folder.iterdir()):
                folder.rmdir()
        raise
    except BaseException:  # interrupted: the finished parts stay for the next run
        kept = staging.finished_parts() if opened else 0
        staging.close()
        if kept:
            print(
                f"prepare-data stopped; {kept} finished part(s) stay in {staging.folder}: the same command continues from them",
                flush=True,
            )
        raise
    if demo_corpus and family(cfg.model.arch).causal and not (data_dir / "eval_bundle").exists():
        print(f"writing a small task bundle of the demo corpus to {write_demo_bundle(data_dir / 'eval_bundle')}")
    n_train = sum(s["tokens"] for s in meta["train"])
    n_val = sum(s["tokens"] for s in meta["val"])
    rate = run["tokens"] / max(run["seconds"], 1e-9)
    print(
        f"wrote {n_train:,} train and {n_val:,} val tokens ({meta['dtype']}) to {data_dir} in "
        f"{time.monotonic() - started:.1f}s (encoding {rate:,.0f} tokens/s on {run['workers']} worker"
        f"{'s' if run['workers'] > 1 else ''} x {run['threads']} thread{'s' if run['threads'] > 1 else ''}); "
        f"data fingerprint {meta['fingerprint']}",
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


def _plan(cfg: Config, files: list[Path], part_bytes: int) -> dict:
    """Everything the tokens depend on: a run with the same plan continues an interrupted one."""
    d = cfg.data
    return {
        "files": [stat_of(str(path)) for path in files],
        "tokenizer": stat_of(d.tokenizer)
        or (stat_of(cfg.model.pretrained) if family(cfg.model.arch).pretrained else None),
        "settings": [
            cfg.model.arch,
            d.vocab_size,
            d.tokenizer_train_chars,
            cfg.run.seed,
            d.val_fraction,
            d.shard_tokens,
        ],
        "layout": [part_bytes, SEGMENT_CHARS, BLOCK_SEGMENTS, BLOCK_CHARS, ORDER_VERSION],
    }


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


def _write_data(
    cfg: Config, files: list[Path], parts: list[Part], staging: Staging, tokenizer_path: Path, workers: int | None
):
    """Tokenizer, shards and meta.json (with the fingerprint) in staging.out; the meta and how the
    encoding ran."""
    if staging.tokenizer.is_file():
        tok = load_tokenizer(staging.tokenizer)
        print(f"using the tokenizer the interrupted run made ({tok.get_vocab_size()} tokens)", flush=True)
    else:
        tok = obtain_tokenizer(cfg, parts, tokenizer_path)
        tok.save(str(staging.tokenizer.with_suffix(".tmp")))
        staging.tokenizer.with_suffix(".tmp").replace(staging.tokenizer)
    vocab = tok.get_vocab_size()
    dtype = np.dtype(np.uint16 if vocab <= 2**16 else np.uint32)
    # Documents are separated by the family's separator where it names one (a masked LM's batches cut
    # windows of the stream between their own special tokens), else by the tokenizer's BOS.
    separator = family(cfg.model.arch).separator
    sep = tok.token_to_id(separator) if separator else bos_id(tok)
    settings = EncodeSettings(dtype.name, sep, cfg.run.seed, cfg.data.val_fraction, cfg.data.shard_tokens)
    finished, run = encode_all(tok, parts, settings, staging.parts, staging.tokenizer, workers)
    _check_every_file_has_text(files, finished)
    shards = staging.assemble(finished, cfg.data.shard_tokens)
    shutil.copyfile(staging.tokenizer, staging.out / TOKENIZER)
    meta = {
        "dtype": dtype.name,
        "vocab_size": vocab,
        "bos_id": sep,
        "tokenizer": TOKENIZER,
        "train": shards["train"],
        "val": shards["val"],
        "prepared_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    meta["fingerprint"] = compute_fingerprint(staging.out, meta)
    (staging.out / META).write_text(json.dumps(meta, indent=2))
    return meta, run


def _check_every_file_has_text(files: list[Path], finished: list[dict]) -> None:
    documents: dict[str, int] = {}
    for done in finished:
        for path, found in done["files"].items():
            documents[path] = documents.get(path, 0) + found
    for path in map(str, files):
        if not documents.get(path):
            raise ConfigError(f"{path} holds no text (only empty documents); fill it, remove it or narrow data.raw")


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


def obtain_tokenizer(cfg: Config, parts: list[Part], tokenizer_path: Path):
    """The tokenizer named by the config (see the module docstring), or a newly trained one."""
    fam = family(cfg.model.arch)
    if cfg.data.tokenizer:
        tok = load_tokenizer(Path(cfg.data.tokenizer))
        print(f"using tokenizer {cfg.data.tokenizer} ({tok.get_vocab_size()} tokens)", flush=True)
    elif fam.pretrained and cfg.model.pretrained:
        folder = fam.weights_folder(cfg.model.pretrained)  # local weights bring their tokenizer
        names = ("tokenizer.json", *fam.tokenizer_files)
        if not any((folder / name).is_file() for name in names):
            raise ConfigError(
                f"model.pretrained={cfg.model.pretrained!r} holds no {' or '.join(names)}; set "
                "data.tokenizer to the tokenizer these weights were trained with"
            )
        tok = load_tokenizer(folder)
        print(f"using the tokenizer of model.pretrained {folder} ({tok.get_vocab_size()} tokens)", flush=True)
    else:
        started = time.monotonic()
        limit = cfg.data.tokenizer_train_chars
        read_sample = functools.partial(_tokenizer_sample, parts, limit)  # (purpose) -> texts
        if fam.tokenizer == "bpe":
            tok = train_tokenizer(read_sample, cfg.data.vocab_size)
        else:
            tok = fam.train_own_tokenizer(read_sample, cfg.data.vocab_size)
        print(
            f"trained a {tok.get_vocab_size()}-token {TOKENIZER_KINDS[fam.tokenizer]} tokenizer in "
            f"{time.monotonic() - started:.1f}s -> {tokenizer_path}",
            flush=True,
        )
    specials = list(fam.special_tokens.values())
    missing = [t for t in specials if tok.token_to_id(t) is None]
    if missing:
        raise ConfigError(
            f"the tokenizer has no {', '.join(missing)}: model.arch={fam.name} needs its special tokens "
            f"{' '.join(specials)}; use a tokenizer that holds them or leave data.tokenizer empty to train one"
        )
    if fam.pretrained and cfg.model.pretrained:  # fail before hours of tokenizing, not at train start
        check_vocab(cfg.model.pretrained, fam.weights_vocab_size(cfg.model.pretrained), tok.get_vocab_size())
    return tok


def _tokenizer_sample(parts: list[Part], limit: int, purpose: str):
    """The first `limit` characters of the corpus, in segments, with the input read shown."""
    progress = Progress(f"reading for {purpose}", sum(part.size for part in parts))
    chars = 0
    try:
        for part in parts:
            for text, starts in iter_segments(part, progress.update):
                if chars >= limit:
                    return
                chars += len(text)
                progress.update(documents=int(starts))
                yield text
    finally:
        progress.close()
        print(f"learning {purpose} from {chars:,} characters (the library shows no progress) ...", flush=True)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--demo-corpus", action="store_true", help="first write a small corpus from Python's docstrings")
    p.add_argument(
        "--force",
        action="store_true",
        help="replace data already prepared in data.dir (the old files move to data.dir/previous-<UTC time>/)",
    )
    p.add_argument(
        "--workers",
        type=count,
        default=None,
        help="processes encoding parts of the corpus at once (default: one per usable core; the same tokens for any number)",
    )
    p.add_argument(
        "--part-mb",
        type=mebibytes,
        default=PART_BYTES / 2**20,
        help="input per part, the unit of parallel work and of resume; small files are packed into parts this "
        "large (default %(default)g; the order of the tokens depends on it)",
    )


def run(cfg: Config, args: argparse.Namespace) -> int:
    try:
        prepare_data(cfg, args.demo_corpus, args.force, args.workers, round(args.part_mb * 2**20))
    except WorkerDied as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
