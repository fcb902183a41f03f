"""data.dir/.prepare-data/: where prepare-data builds its output before moving it into place, and
what lets an interrupted run continue.

    plan.json        the input files (path, size, modification time) and every setting the tokens
                     depend on; a run with another plan starts over
    tokenizer.json   the tokenizer, trained or loaded once
    parts/00000/     one finished part: its shards and done.json (encode_parts.py)
    out/             the assembled data folder: the parts' shards joined in part order, tokenizer, meta.json
    lock             held (flock) by the prepare-data writing here; a second one is refused
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path

from ..settings.config import ConfigError
from ..settings.stored_files import DamagedFile, read_json, shape_problem, warn

FOLDER = ".prepare-data"
DONE = "done.json"  # written into a part's folder last: the part is whole


def part_folder(parts_dir: Path, index: int) -> Path:
    return parts_dir / f"{index:05d}"


DONE_KEYS = {"train": list, "val": list, "files": dict}  # what assembling and the checks read
SHARD_KEYS = {"file": str, "tokens": int}


def finished(parts_dir: Path, index: int) -> dict | None:
    """What a finished part wrote (its done.json), or None; a damaged one (said) is encoded again."""
    path = part_folder(parts_dir, index) / DONE
    if not path.is_file():
        return None
    again = "the part is encoded again"
    try:
        done = read_json(path, fix=again, keys=DONE_KEYS)
    except DamagedFile as exc:
        warn(str(exc))
        return None
    shards = [shape_problem(shard, SHARD_KEYS) for split in ("train", "val") for shard in done[split]]
    counts = shape_problem(done["files"], optional=dict.fromkeys(done["files"], int))
    problem = next(filter(None, [*shards, counts]), None)
    if problem:
        warn(f"{path}: {'files' if problem == counts else 'a shard'} {problem}; {again}")
        return None
    return done


class Staging:
    def __init__(self, data_dir: Path):
        self.folder = data_dir / FOLDER
        self.parts = self.folder / "parts"
        self.out = self.folder / "out"
        self.tokenizer = self.folder / "tokenizer.json"
        self._lock = None

    def open(self, plan: dict) -> str | None:
        """Lock the folder and keep what an earlier run with the same plan finished (else empty it);
        a line saying which, or None for a fresh start."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = (self.folder / "lock").open("a+")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._lock.seek(0)
            holder = self._lock.read().strip() or "another process"
            self._lock.close()
            self._lock = None
            raise ConfigError(
                f"another prepare-data ({holder}) is writing {self.folder.parent}; wait for it to end, or use "
                "another data.dir"
            ) from None
        self._lock.truncate(0)
        self._lock.write(f"pid {os.getpid()} on {os.uname().nodename}")
        self._lock.flush()
        plan_file = self.folder / "plan.json"
        try:
            earlier = read_json(plan_file, fix="starting over") if plan_file.is_file() else None
        except DamagedFile as exc:
            warn(str(exc))
            earlier = None
        note = None
        if earlier == plan:
            for leftover in self.parts.glob("*.tmp"):  # a writer killed before its rename (encode_parts.py)
                shutil.rmtree(leftover, ignore_errors=True)
            return f"continuing the prepare-data interrupted in {self.folder} (same input files and settings)"
        if earlier is not None:
            note = f"the unfinished prepare-data in {self.folder} was for other input files or settings: starting over"
        for path in self.folder.iterdir():
            if path.name != "lock":
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        plan_file.write_text(json.dumps(plan, indent=1))
        return note

    def assemble(self, finished: list[dict], shard_tokens: int) -> dict[str, list[dict]]:
        """out/ with the parts' shards joined in part order into shards of at least shard_tokens
        tokens (the parts' own are small: thousands of them would each waste a sequence's tail and
        hold a memory map in every rank); the shard lists per split. The parts stay whole until the
        end, should this be interrupted."""
        shutil.rmtree(self.out, ignore_errors=True)
        self.out.mkdir()
        shards: dict[str, list[dict]] = {"train": [], "val": []}
        for split, joined in shards.items():
            target, tokens = None, 0
            for index, done in enumerate(finished):
                for shard in done[split]:
                    if target is None:
                        target = (self.out / f"{split}_{len(joined):05d}.bin").open("wb")
                    with (part_folder(self.parts, index) / shard["file"]).open("rb") as source:
                        shutil.copyfileobj(source, target, 16 << 20)
                    tokens += shard["tokens"]
                    if tokens >= shard_tokens:
                        target.close()
                        joined.append({"file": Path(target.name).name, "tokens": tokens})
                        target, tokens = None, 0
            if target is not None:
                target.close()
                joined.append({"file": Path(target.name).name, "tokens": tokens})
        return shards

    def remove(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        self.close()

    def close(self) -> None:
        if self._lock is not None:
            self._lock.close()
            self._lock = None

    def finished_parts(self) -> int:
        """Parts whose folder is in place: a writer's temporary folder holds its done.json before the rename."""
        if not self.parts.is_dir():
            return 0
        return sum(path.parent.name.isdigit() for path in self.parts.glob(f"*/{DONE}"))


def stat_of(path: str | None) -> list | None:
    """Path, size and modification time: what says a file is still the one a plan was made with."""
    if not path:
        return None
    try:
        st = os.stat(path)
    except OSError:
        return [path]
    return [path, st.st_size, st.st_mtime_ns]
