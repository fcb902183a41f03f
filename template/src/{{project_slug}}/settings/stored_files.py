"""Reading back what the project wrote or a user edited: config/*.yaml, meta.json, prepare-data's
plan.json and done.json, checkpoint manifests and the `latest` pointer, the run lock and the markers
under run.output_dir, the job records in .jobs/*.jsonl.

Such a file may be cut short by a crash, saved in another encoding, or hold valid JSON of another
shape. Every reader here ends that in DamagedFile, one line: "<file>[:line]: <what is wrong>; <the fix>".
A file of records (JSON lines) skips a damaged line with a warning naming file:line instead, since
the other lines stay useful.

    text = read_text(Path("config/train.yaml"), fix="save it as UTF-8")
    plan = read_json(path, fix="delete it", keys={"files": list})
    records, warnings = read_json_lines(path, keys={"platform": str, "id": str})
"""

from __future__ import annotations

import codecs
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


class ConfigError(ValueError):
    """A mistake the user can fix, printed in a line or two without traceback. `key`: the config
    key ("section.name") whose value is wrong; callers relate errors to settings by it, not by wording."""

    def __init__(self, message: str, key: str | None = None):
        super().__init__(message)
        self.key = key


class DamagedFile(ConfigError):
    """A stored file that cannot be used as it is; `problem` says why without the file and the fix,
    for callers that word their own line around it."""

    def __init__(self, path: Path, problem: str, fix: str, line: int | None = None, key: str | None = None):
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: {problem}; {fix}", key=key)
        self.path, self.problem, self.line = path, problem, line


# A byte-order mark says the encoding (Windows editors save UTF-16 with one); UTF-32's marks begin
# with UTF-16's, so they are tried first.
_MARKS = (
    (codecs.BOM_UTF32_LE, "utf-32"),
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF8, "utf-8-sig"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
)
_KINDS = {dict: "a JSON object", list: "a JSON array", str: "text", int: "a whole number", float: "a number"}


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def decode(data: bytes, path: Path, fix: str, line: int | None = None, marks: bool = True) -> str:
    """UTF-8 (or, with marks, the encoding a byte-order mark names), else DamagedFile naming the line
    of the first bad byte."""
    for mark, encoding in _MARKS if marks else ():
        if data.startswith(mark):
            try:
                return data.decode(encoding)
            except UnicodeDecodeError:
                raise DamagedFile(path, f"not valid {encoding.upper()} after its byte-order mark", fix, line) from None
    if b"\x00" in data:  # valid UTF-8, but no text file holds it
        at = line or data.count(b"\n", 0, data.index(b"\x00")) + 1
        problem = "holds NUL bytes (the file is binary, or UTF-16 without a byte-order mark)"
        raise DamagedFile(path, problem, fix, at)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        at = line or data.count(b"\n", 0, exc.start) + 1
        problem = f"byte 0x{data[exc.start]:02x} is not UTF-8 (the file is binary or in another encoding, e.g. Latin-1)"
        raise DamagedFile(path, problem, fix, at) from None


def read_text(path: Path, fix: str, key: str | None = None) -> str:
    """The file's text; DamagedFile when it cannot be read or decoded."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DamagedFile(path, "not found", fix, key=key) from None
    except OSError as exc:
        raise DamagedFile(path, f"cannot be read ({exc.strerror or exc})", fix, key=key) from None
    try:
        return decode(data, path, fix)
    except DamagedFile as exc:
        exc.key = key
        raise


def read_yaml(path: Path, fix: str, key: str | None = None) -> Any:
    """The YAML value of a file read by read_text; DamagedFile naming the line that does not parse."""
    import yaml  # only the YAML files' readers pay for it

    text = read_text(path, fix, key)
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        what = one_line(getattr(exc, "problem", None) or exc)
        raise DamagedFile(Path(path), f"not valid YAML ({what})", fix, mark and mark.line + 1, key) from None


def kind_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true/false"
    return next((word for kind, word in _KINDS.items() if isinstance(value, kind)), type(value).__name__)


def _fits(value: Any, kind) -> bool:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, int) and float in kinds:
        return True
    return any(value is None if k is None else isinstance(value, k) for k in kinds)


def shape_problem(value: Any, keys: dict | None = None, optional: dict | None = None) -> str | None:
    """What keeps value from being a JSON object with these keys (name -> type, or a tuple of
    types; None in a tuple allows null), and these optional ones where present; None if it fits."""
    if not isinstance(value, dict):
        return f"holds {kind_of(value)} where a JSON object belongs"
    missing = [name for name in keys or {} if name not in value]
    if missing:
        return "has no " + ", ".join(repr(name) for name in missing)
    for name, kind in {**(optional or {}), **(keys or {})}.items():
        if name in value and not _fits(value[name], kind):
            wanted = " or ".join(kind_of(k()) if k else "null" for k in (kind if isinstance(kind, tuple) else (kind,)))
            return f"key {name!r} holds {kind_of(value[name])} where {wanted} belongs"
    return None


def parse_json(text: str, path: Path, fix: str, line: int | None = None) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:
        what = "empty" if not text.strip() else f"not readable JSON: {getattr(exc, 'msg', exc)}"
        at = line or getattr(exc, "lineno", None)
        raise DamagedFile(path, what + (" (a write cut short?)" if text.strip() else ""), fix, at) from None


def read_json(
    path: Path, fix: str, keys: dict | None = None, optional: dict | None = None, key: str | None = None
) -> Any:
    """The file's JSON value; with keys (or optional), a JSON object of that shape. DamagedFile otherwise."""
    value = parse_json(read_text(path, fix, key), Path(path), fix)
    if keys is not None or optional is not None:
        problem = shape_problem(value, keys, optional)
        if problem:
            raise DamagedFile(Path(path), problem, fix, key=key)
    return value


def read_json_lines(
    path: Path, keys: dict, optional: dict | None = None, check: Callable[[dict], str | None] | None = None
) -> tuple[list[dict], list[str]]:
    """The JSON objects of a file of records, one a line, that fit the shape (and pass `check`, which
    says what else is wrong with a record); and one warning per other non-blank line ("file:line:
    what; skipped"). A missing file holds no records."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], []
    except OSError as exc:
        return [], [f"{path}: cannot be read ({exc.strerror or exc}); its records are left out"]
    records, warnings = [], []
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            record = parse_json(decode(raw, path, "", number, marks=False), path, "", number)
            problem = shape_problem(record, keys, optional) or (check(record) if check else None)
        except DamagedFile as exc:
            problem = exc.problem
        if problem:
            warnings.append(f"{path}:{number}: {problem}; this line is skipped")
        else:
            records.append(record)
    return records, warnings


def warn(message: str) -> None:
    """One line on stderr: something was left out, and the command goes on."""
    print(f"warning: {one_line(message)}", file=sys.stderr, flush=True)
