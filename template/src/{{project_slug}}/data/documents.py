"""The raw documents prepare-data reads: which files, their text, and what is refused.

    data.raw="" -> data.dir/raw/*     *.parquet (a string `text` column), *.jsonl (a "text" field
                                      per line), *.txt (one document per file), all UTF-8

Files are read in parts (plan_parts: about PART_BYTES of input each, row groups for parquet, small
files packed together), which workers encode in parallel and a resumed run skips when done. A
part's documents come as segments of at most about SEGMENT_CHARS characters, so no document,
however long, is held whole beyond the one record (a JSON line, a parquet cell) that stores it.

Every unusable input is refused by name before hours of tokenizing where a look at its start (or a
parquet's footer) tells (check_input_file), and during reading otherwise: an empty, binary or
non-UTF-8 file, a parquet that is damaged, has no `text` column or one of another type.
"""

from __future__ import annotations

import codecs
import glob
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..settings.config import ConfigError

SUFFIXES = (".parquet", ".jsonl", ".json", ".txt")
_SNIFF_BYTES = 1 << 16  # read of each text input before the long passes, to refuse binaries early
PART_BYTES = 16 << 20  # input per part: the unit of parallel work and of resume
SEGMENT_CHARS = 1 << 20  # longer documents are cut into segments of about this many characters


@dataclass(frozen=True)
class Piece:
    """A range of one input file: for text files a byte range (each line belongs to the piece its
    first byte lies in), for parquet a range of row groups."""

    path: str
    start: int
    stop: int
    size: int  # input bytes it stands for, for progress


@dataclass(frozen=True)
class Part:
    """About part_bytes of input: a piece of a big file, or small files packed together (a folder
    of 100,000 small files is not 100,000 parts). Parts depend only on the files and part_bytes,
    so any number of workers writes the same tokens."""

    pieces: tuple[Piece, ...]

    @property
    def size(self) -> int:
        return sum(piece.size for piece in self.pieces)


def plan_parts(paths: list[Path], part_bytes: int = PART_BYTES) -> list[Part]:
    parts, pending, pending_bytes = [], [], 0
    for piece in _pieces(paths, part_bytes):
        pending.append(piece)
        pending_bytes += piece.size
        if pending_bytes >= part_bytes:
            parts.append(Part(tuple(pending)))
            pending, pending_bytes = [], 0
    if pending:
        parts.append(Part(tuple(pending)))
    return parts


def _pieces(paths: list[Path], part_bytes: int) -> Iterator[Piece]:
    for path in paths:
        size = path.stat().st_size
        if path.suffix.lower() == ".parquet":
            meta = open_parquet(path).metadata
            rows, first, taken = max(1, meta.num_rows), 0, 0
            for group in range(meta.num_row_groups):
                taken += meta.row_group(group).num_rows
                if group == meta.num_row_groups - 1 or taken * size / rows >= part_bytes:
                    yield Piece(str(path), first, group + 1, round(taken * size / rows))
                    first, taken = group + 1, 0
        else:
            for s in range(0, size, part_bytes):
                yield Piece(str(path), s, min(s + part_bytes, size), min(part_bytes, size - s))


Progress = Callable[[float], None]  # called with the input bytes just consumed


def iter_segments(
    part: Part, progress: Progress | None = None, documents: dict[str, int] | None = None
) -> Iterator[tuple[str, bool]]:
    """(text, whether it starts a document) for the part's documents, in file order; `documents`
    counts the documents that start in each file."""
    for piece in part.pieces:
        for text, starts in _piece_segments(piece, progress):
            if documents is not None:
                documents[piece.path] = documents.get(piece.path, 0) + starts
            yield text, starts


def _piece_segments(piece: Piece, progress: Progress | None) -> Iterator[tuple[str, bool]]:
    path = Path(piece.path)
    suffix = path.suffix.lower()
    if suffix == ".txt":
        yield from _txt_segments(path, piece, progress)
        return
    if suffix == ".parquet":
        docs = _parquet_documents(path, piece, progress)
    elif suffix in (".jsonl", ".json"):
        docs = _jsonl_documents(path, piece, progress)
    else:
        raise ConfigError(f"{path}: unsupported file type '{suffix}'; use .parquet, .jsonl or .txt")
    for text in docs:
        for i, segment in enumerate(cut_segments([text])):
            yield segment, i == 0


def cut_segments(chunks, limit: int = SEGMENT_CHARS) -> Iterator[str]:
    """Join the text chunks and cut them into pieces of about `limit` characters, each ending at a
    newline (or else a space) followed by a non-space, where tokenizers split words anyway."""
    buffer = ""
    for chunk in chunks:
        buffer += chunk
        while len(buffer) > limit:
            cut = _cut_point(buffer, limit)
            yield buffer[:cut]
            buffer = buffer[cut:]
    if buffer:
        yield buffer


def _cut_point(text: str, limit: int) -> int:
    for sep in ("\n", " "):
        at = limit
        while (at := text.rfind(sep, 0, at)) > 0:
            if not text[at + 1].isspace():
                return at + 1
    return limit  # no such place: one word longer than a segment


def _parquet_documents(path: Path, piece: Piece, progress: Progress | None) -> Iterator[str]:
    import pyarrow as pa

    table = open_parquet(path)
    groups = range(piece.start, piece.stop)
    rows = sum(table.metadata.row_group(g).num_rows for g in groups) or 1
    try:
        for batch in table.iter_batches(columns=["text"], batch_size=1024, row_groups=groups):
            yield from (t for t in batch.column(0).to_pylist() if t)
            if progress:
                progress(piece.size * batch.num_rows / rows)
    except (pa.ArrowException, OSError, ValueError) as exc:  # a damaged page, a truncated column
        raise _unreadable_parquet(path, exc) from None


def _seek_line(f, start: int) -> int:
    """Move to the first line that starts at or after byte `start`; its offset."""
    if start:
        f.seek(start - 1)
        while (rest := f.readline(SEGMENT_CHARS)) and not rest.endswith(b"\n"):
            pass  # the end of a line that began in the previous piece, read a chunk at a time
    return f.tell()


def _jsonl_documents(path: Path, piece: Piece, progress: Progress | None) -> Iterator[str]:
    with path.open("rb") as f:
        at = _seek_line(f, piece.start)
        line_no = 1 if piece.start == 0 else None  # elsewhere lines are named by their byte offset
        while at < piece.stop and (raw := f.readline()):
            name = f"line {line_no}" if line_no else f"the line at byte {at}"
            where = f"{path}:{line_no}" if line_no else f"{path} ({name})"
            at += len(raw)
            line_no = line_no and line_no + 1
            if progress:
                progress(len(raw))
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise _not_text(path, f"{name} is not UTF-8") from None
            if not line.strip():
                continue
            try:
                text = json.loads(line)["text"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise ConfigError(f"{where} is not a JSON object with a 'text' field") from None
            if not isinstance(text, (str, type(None))):
                raise ConfigError(
                    f"{where}: 'text' is a {type(text).__name__}, not a string; store the documents as text"
                )
            if text:
                yield text


def _txt_segments(path: Path, piece: Piece, progress: Progress | None) -> Iterator[tuple[str, bool]]:
    """A .txt file is one document: its first piece starts it, the others continue it."""
    decoder = codecs.getincrementaldecoder("utf-8")()

    def chunks():
        with path.open("rb") as f:
            at = _seek_line(f, piece.start)
            ended = True  # the last piece read ended its line
            while (at < piece.stop or not ended) and (raw := f.readline(SEGMENT_CHARS)):
                if progress:
                    progress(len(raw))
                if b"\0" in raw:
                    raise _not_text(path, "a binary file: it holds NUL bytes")
                try:
                    yield decoder.decode(raw)
                except UnicodeDecodeError as exc:
                    raise _not_text(path, f"byte {at + exc.start} is not UTF-8") from None
                at += len(raw)
                ended = raw.endswith(b"\n")
            try:
                yield decoder.decode(b"", final=True)
            except UnicodeDecodeError:
                raise _not_text(path, f"it ends inside a character (byte {at - 1})") from None

    first = piece.start == 0
    for segment in cut_segments(chunks()):
        if segment.strip():
            yield segment, first
            first = False


def check_input_file(path: Path) -> None:
    """Refuse an input file prepare-data cannot use, reading only its start (or a parquet's footer):
    an empty, binary or non-UTF-8 file, a broken parquet or one without a text column."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ConfigError(f"{path}: unsupported file type '{suffix}'; use .parquet, .jsonl or .txt")
    if path.stat().st_size == 0:
        raise ConfigError(f"{path} is empty (0 bytes); fill it, remove it or narrow data.raw")
    if suffix == ".parquet":
        if open_parquet(path).metadata.num_rows == 0:
            raise ConfigError(f"{path} holds no rows; fill it, remove it or narrow data.raw")
        return
    with path.open("rb") as f:
        head = f.read(_SNIFF_BYTES)
    if b"\0" in head:
        raise _not_text(path, "a binary file: it holds NUL bytes")
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)  # a character may straddle the cut
    except UnicodeDecodeError as exc:
        raise _not_text(path, f"byte {exc.start} is not UTF-8") from None


def open_parquet(path: Path):
    """A pyarrow ParquetFile whose `text` column holds strings; anything else is refused by name."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.ParquetFile(path)
    except (pa.ArrowException, OSError, ValueError) as exc:  # e.g. ArrowInvalid: no parquet magic bytes
        raise _unreadable_parquet(path, exc) from None
    schema = table.schema_arrow
    if "text" not in schema.names:
        raise ConfigError(
            f"{path} has no 'text' column (columns: {schema.names}); rename the column holding the documents to 'text'"
        )
    kind = schema.field("text").type
    if pa.types.is_dictionary(kind):  # dictionary-encoded strings read back as strings
        kind = kind.value_type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or str(kind) == "string_view"):
        raise ConfigError(f"{path}: the 'text' column holds {kind}, not strings; store the documents as text")
    return table


def _unreadable_parquet(path: Path, exc: Exception) -> ConfigError:
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ConfigError(
        f"{path} is not a readable parquet file ({reason}); write it again, remove it or narrow data.raw"
    )


def _not_text(path: Path, why: str) -> ConfigError:
    return ConfigError(f"{path} is not UTF-8 text ({why}); convert it to UTF-8, remove it or narrow data.raw")


def find_raw_files(data_dir: Path, pattern: str) -> list[Path]:
    pattern = pattern or "raw/*"
    full = pattern if Path(pattern).is_absolute() else str(data_dir / pattern)
    files, seen, repeated = [], set(), 0
    # `**` follows links into folders, so a link to a parent (raw/sub/loop -> ..) names each file
    # again at every depth until the kernel stops the loop: each real file is read once (its
    # shortest name first), or it would land in train and validation both.
    for path in sorted((Path(p) for p in glob.glob(full, recursive=True)), key=lambda p: (len(p.parts), p)):
        if not path.is_file():
            continue
        real = path.resolve()
        if real in seen:
            repeated += 1
            continue
        seen.add(real)
        files.append(path)
    if repeated:
        print(
            f"data.raw: skipped {repeated:,} path(s) that lead to a file already read (links); each file is read once"
        )
    files.sort()
    if not files:
        raise ConfigError(
            f"no input files match {full}; put .parquet/.jsonl/.txt files there, set data.raw, "
            "or run prepare-data --demo-corpus"
        )
    return files
