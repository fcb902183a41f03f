"""One part of the corpus -> its own train and val token shards: prepare-data's unit of work, run in
worker processes (each with its own share of the tokenizer library's threads).

Documents are shuffled in blocks with a generator of the part's own (run.seed, part number), which
also draws the ones held out for validation, so the tokens depend on the files and the settings,
never on the number of workers. A long document's segments stay together, in order and in one split:
a row that starts at a document reads on into its own text, and no document is on both sides. A part is written into a folder of its own and renamed into place
with done.json when whole: a resumed prepare-data keeps finished parts and redoes the others.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from ..settings.config import ConfigError
from .documents import Part, iter_segments
from .staging import DONE, part_folder
from .tokens import ShardWriter

BLOCK_SEGMENTS = 4096  # segments shuffled together ...
BLOCK_CHARS = 16 << 20  # ... and at most this much text
BATCH_CHARS = 1 << 20  # text per encode call: what bounds the tokenizer's memory
ORDER_VERSION = 2  # raised when the order or split of what parts write changes (2: whole documents)


@dataclass(frozen=True)
class EncodeSettings:
    dtype: str
    separator: int  # written before every document
    seed: int
    val_fraction: float
    shard_tokens: int


def encode_part(tok, part: Part, index: int, settings: EncodeSettings, parts_dir: Path, report=None) -> dict:
    """Write the part's shards; returns its done.json: shards per split, documents, tokens.
    report(bytes, documents, tokens) is called after every encode call with what it added."""
    final = part_folder(parts_dir, index)
    folder = final.with_name(f"{final.name}.{os.getpid()}.tmp")  # a crashed writer's folder is never reused
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    dtype = np.dtype(settings.dtype)
    writers = {s: ShardWriter(folder, s, dtype, settings.shard_tokens) for s in ("train", "val")}
    encode = getattr(tok, "encode_batch_fast", None) or tok.encode_batch  # no offsets: faster, same ids
    rng = random.Random(f"{settings.seed}:{index}")
    consumed = [0.0]
    totals = {"documents": 0, "tokens": 0}

    def on_bytes(n: float) -> None:
        consumed[0] += n

    documents_per_file: dict[str, int] = {}
    segments = iter_segments(part, on_bytes, documents_per_file)
    carried = False  # the split of a document that goes on from the previous block
    for number, (units, goes_on, stays_open) in enumerate(_blocks(segments)):
        # A document cut by the block's end keeps its place: last here, first in the next block.
        first = units[:1] if goes_on else []
        last = units[-1:] if stays_open and len(units) > len(first) else []
        free = units[len(first) : len(units) - len(last)]
        rng.shuffle(free)
        # Each document is held out with probability val_fraction: the share is right however the
        # corpus is cut into files and parts (a count per part rounded a folder of one-document
        # files all into val). The first part's first block holds out one at least, so even a
        # tiny corpus has a validation split (of a document in segments its first one only: a
        # corpus of one long text still trains on the rest).
        drawn = [rng.random() < settings.val_fraction for _ in free + last]
        at_least_one = index == 0 and number == 0 and drawn and not any(drawn)
        held_out = [carried] * len(first) + drawn
        carried = held_out[-1]
        items = [(val, segment) for val, unit in zip(held_out, first + free + last) for segment in unit]
        if at_least_one:
            forced = sum(map(len, first))
            items[forced] = (True, items[forced][1])
        for batch in _batches(items):
            docs = tokens = 0
            for (val, (_, starts)), enc in zip(
                batch, encode([text for _, (text, _) in batch], add_special_tokens=False)
            ):
                writer = writers["val" if val else "train"]
                if starts:  # a shard closes between documents, never inside one
                    writer.end_document()
                    writer.add((settings.separator,))
                writer.add(enc.ids)
                docs += starts
                tokens += len(enc.ids) + starts
            totals["documents"] += docs
            totals["tokens"] += tokens
            if report:
                report(consumed[0], docs, tokens)
            consumed[0] = 0.0
    for writer in writers.values():
        writer.flush()
    done = {
        "part": asdict(part),
        **totals,
        "files": documents_per_file,
        "train": writers["train"].shards,
        "val": writers["val"].shards,
    }
    (folder / DONE).write_text(json.dumps(done))
    shutil.rmtree(final, ignore_errors=True)
    folder.replace(final)
    # Fault injection (runtime/faults.py's list): a slow prepare-data, to interrupt between parts.
    slow = float(os.environ.get("TRAIN_FAULT_PART_SECONDS", "0") or 0)
    if slow > 0:
        time.sleep(slow)
    return done


def _blocks(segments):
    """Blocks of whole documents (each a list of its segments) of at most BLOCK_SEGMENTS documents
    and about BLOCK_CHARS of text, as (documents, goes_on, stays_open): a document longer than that
    ends its block unfinished (stays_open) and goes on as the first of the next (goes_on), so no
    block holds more than about BLOCK_CHARS, whatever a document's length."""
    units, chars, goes_on = [], 0, False
    for text, starts in segments:
        if units and chars >= BLOCK_CHARS or len(units) >= BLOCK_SEGMENTS and starts:
            yield units, goes_on, not starts
            units, chars, goes_on = [], 0, not starts
        if starts or not units:
            units.append([])
        units[-1].append((text, starts))
        chars += len(text)
    if units:
        yield units, goes_on, False


def _batches(items):
    batch, chars = [], 0
    for item in items:
        batch.append(item)
        chars += len(item[1][0])
        if chars >= BATCH_CHARS:
            yield batch
            batch, chars = [], 0
    if batch:
        yield batch


# --- worker processes ---------------------------------------------------------------------------
_worker: dict = {}


def start_worker(tokenizer_path: str, threads: int, queue) -> None:
    """Pool initializer: the library's thread count must be set before its first parallel call."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the parent, which ends the workers
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    from tokenizers import Tokenizer

    _worker.update(tok=Tokenizer.from_file(tokenizer_path), queue=queue)


def run_part(part: Part, index: int, settings: EncodeSettings, parts_dir: str) -> dict:
    """encode_part in a worker; progress goes to the parent through the queue, and a mistake in the
    input comes back as {"error": message} (the parent refuses it in one line)."""
    queue = _worker["queue"]
    try:
        return encode_part(_worker["tok"], part, index, settings, Path(parts_dir), lambda *r: queue.put(r))
    except ConfigError as exc:
        return {"error": str(exc)}
