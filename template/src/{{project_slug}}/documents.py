"""The raw documents prepare-data reads: which files, their text, and what is refused.

    data.raw="" -> data.dir/raw/*     *.parquet (a string `text` column), *.jsonl (a "text" field
                                      per line), *.txt (one document per file), all UTF-8

Every unusable input is refused by name before hours of tokenizing where a look at its start (or a
parquet's footer) tells (check_input_file), and during reading otherwise: an empty, binary or
non-UTF-8 file, a parquet that is damaged, has no `text` column or one of another type.
"""

from __future__ import annotations

import codecs
import glob
import json
from collections.abc import Iterator
from pathlib import Path

from .config import ConfigError

SUFFIXES = (".parquet", ".jsonl", ".json", ".txt")
_SNIFF_BYTES = 1 << 16  # read of each text input before the long passes, to refuse binaries early


def iter_documents(paths: list[Path]) -> Iterator[str]:
    """Yield text documents from parquet (`text` column), jsonl ("text" field) or txt (one document
    per file). A file that is unreadable, binary or yields no document is refused, by name."""
    for path in paths:
        found = 0
        for text in _file_documents(path):
            found += 1
            yield text
        if not found:
            raise ConfigError(f"{path} holds no text (only empty documents); fill it, remove it or narrow data.raw")


def _file_documents(path: Path) -> Iterator[str]:
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow as pa

        table = open_parquet(path)
        try:
            for batch in table.iter_batches(columns=["text"], batch_size=1024):
                yield from (t for t in batch.column(0).to_pylist() if t)
        except (pa.ArrowException, OSError, ValueError) as exc:  # a damaged page, a truncated column
            raise _unreadable_parquet(path, exc) from None
    elif suffix in (".jsonl", ".json"):
        with path.open("rb") as f:
            for line_no, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError:
                    raise _not_text(path, f"line {line_no} is not UTF-8") from None
                if not line.strip():
                    continue
                try:
                    text = json.loads(line)["text"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise ConfigError(f"{path}:{line_no} is not a JSON object with a 'text' field") from None
                if not isinstance(text, (str, type(None))):
                    raise ConfigError(
                        f"{path}:{line_no}: 'text' is a {type(text).__name__}, not a string; store the documents as text"
                    )
                if text:
                    yield text
    elif suffix == ".txt":
        raw = path.read_bytes()
        if b"\0" in raw:
            raise _not_text(path, "a binary file: it holds NUL bytes")
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _not_text(path, f"byte {exc.start} is not UTF-8") from None
        if text.strip():
            yield text
    else:
        raise ConfigError(f"{path}: unsupported file type '{suffix}'; use .parquet, .jsonl or .txt")


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
    files = sorted(Path(p) for p in glob.glob(full, recursive=True) if Path(p).is_file())
    if not files:
        raise ConfigError(
            f"no input files match {full}; put .parquet/.jsonl/.txt files there, set data.raw, "
            "or run prepare-data --demo-corpus"
        )
    return files
