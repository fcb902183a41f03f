"""What lies under output_dir/checkpoints, read without torch: which checkpoints there are, whether
one is intact, which run wrote it, and whether the next one has room.

    checkpoints/step_00000020.pt              DDP: one file
    checkpoints/step_00000020.pt.json         its manifest
    checkpoints/step_00000020/                a sharded strategy: a folder of files (one set per rank)
    checkpoints/step_00000020/manifest.json   its manifest
    checkpoints/latest                        the newest complete checkpoint, replaced last

A manifest names the run that wrote the checkpoint (run_id: a run continues under the id of the
checkpoint it resumed from, a new run gets a new one; keep_last only ever deletes its own run's
checkpoints) and the size and sha256 of every file. It is in place before the checkpoint is renamed
to its final name, so a checkpoint under that name always has one; verifying it reads every byte
once. Checkpoints written before manifests existed are checked through the CRC-32 that every entry
of a torch.save zip carries.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import secrets
import shutil
import time
import zipfile
from pathlib import Path

from ..runtime import faults
from ..settings.config import ConfigError
from ..settings.stored_files import DamagedFile, read_json, read_text, shape_problem

LATEST = "latest"
STAGING = ".staging"  # under checkpoints/: a sharded strategy's folder being written, renamed into place when whole
MANIFEST = "manifest.json"
_STEP = re.compile(r"step_(\d{8})(\.pt)?")
_CHUNK = 1 << 22
FULL = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "the disk quota is exceeded",
    errno.EFBIG: "a file size limit (ulimit -f) is reached",
}


class SaveFailed(ConfigError):
    """A checkpoint could not be written for lack of room: the previous one is kept."""


def step_of(path: Path) -> int:
    return int(_STEP.fullmatch(path.name).group(1))


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-", time.gmtime()) + secrets.token_hex(3)


# ---------------------------------------------------------------------------------------------
# Writing: atomic replace, fsync, hashes


def fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """Flush every file under folder (and the folders themselves) to stable storage."""
    for root, _, files in os.walk(folder):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(root))


def temporary_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def atomic_write(path: Path, write, commit_hook: bool = True, before_rename=None) -> None:
    """write(f) into a temporary file, fsync it, call before_rename(), rename it to path: a crash at
    any moment leaves path as it was. The temporary file is gone afterwards, whatever happened."""
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename()
        if commit_hook:
            faults.pause_before_commit(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)


class HashingWriter:
    """A file wrapper for torch.save that hashes the bytes as they are written and keeps the
    OSError of a failed write (torch turns it into a RuntimeError without the errno)."""

    def __init__(self, f):
        self.f, self.sha, self.size, self.error = f, hashlib.sha256(), 0, None

    def write(self, data) -> int:
        try:
            written = self.f.write(data)
        except OSError as exc:
            self.error = exc
            raise
        self.sha.update(data)
        self.size += len(data)
        return written

    def flush(self) -> None:
        self.f.flush()

    def entry(self) -> dict:
        return {"size": self.size, "sha256": self.sha.hexdigest()}


def file_entry(path: Path) -> dict:
    sha, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            sha.update(block)
            size += len(block)
    return {"size": size, "sha256": sha.hexdigest()}


def manifest_path(checkpoint: Path) -> Path:
    return checkpoint / MANIFEST if checkpoint.is_dir() else checkpoint.with_name(checkpoint.name + ".json")


def write_manifest(path: Path, run_id: str | None, step: int, files: dict) -> None:
    """files: name relative to the checkpoint's folder -> file_entry."""
    record = {"run_id": run_id, "step": step, "files": dict(sorted(files.items()))}
    atomic_write(path, lambda f: f.write((json.dumps(record, indent=1) + "\n").encode()), commit_hook=False)


# ---------------------------------------------------------------------------------------------
# Reading: listings, the newest candidates, verification


def list_files(folder: Path) -> list[Path]:
    """DDP checkpoint files, oldest first."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_file() and _STEP.fullmatch(p.name) and p.suffix == ".pt")


def list_folders(folder: Path) -> list[Path]:
    """Checkpoint folders (a sharded strategy's), oldest first."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.is_dir() and _STEP.fullmatch(p.name))


def named_by_latest(folder: Path) -> Path | None:
    pointer = folder / LATEST
    if not pointer.is_file():
        return None
    try:  # a damaged pointer names nothing: the newest checkpoint on disk is used
        name = read_text(pointer, fix="the newest checkpoint on disk is used").strip()
    except DamagedFile:
        return None
    return folder / name if name and "\0" not in name else None


def candidates(folder: Path, listing=list_files) -> list[Path]:
    """Checkpoints to resume from, best first: the one `latest` names (it is replaced last, so it
    wins over a higher step on disk it does not name yet), then the older ones, newest first."""
    found = listing(folder)
    named = named_by_latest(folder)
    if named in found:
        return [named, *reversed([p for p in found if step_of(p) < step_of(named)])]
    return list(reversed(found))


MANIFEST_KEYS = {"files": dict}
MANIFEST_OPTIONAL = {"run_id": (str, None), "step": int}
FILE_ENTRY = {"size": int, "sha256": str}


def read_manifest(checkpoint: Path) -> dict | None:
    """The checkpoint's manifest; None for a checkpoint written before manifests existed."""
    path = manifest_path(checkpoint)
    if not path.exists():
        return None
    try:
        record = read_json(path, fix="the checkpoint is not used", keys=MANIFEST_KEYS, optional=MANIFEST_OPTIONAL)
    except DamagedFile:
        return {"unreadable": path.name}
    entries = (shape_problem(entry, FILE_ENTRY) for entry in record["files"].values())
    return {"unreadable": path.name} if any(entries) else record


def run_id_of(checkpoint: Path) -> str | None:
    record = read_manifest(checkpoint) or {}
    return record.get("run_id")


def problem(checkpoint: Path, part: tuple[int, int] = (0, 1), contents: bool = True) -> str | None:
    """What is wrong with a checkpoint, or None. part=(i, n): check only every n-th file from the
    i-th, so that n ranks verify a sharded checkpoint together; contents=False: sizes only, no sha256."""
    record = read_manifest(checkpoint)
    if record is not None and "unreadable" in record:
        return f"its manifest {record['unreadable']} is unreadable"
    folder = checkpoint if checkpoint.is_dir() else checkpoint.parent
    if record is None:  # older than manifests: the zip CRCs of its torch.save files
        files = sorted(checkpoint.rglob("*.pt")) if checkpoint.is_dir() else [checkpoint]
        return next(filter(None, (_zip_problem(p, folder) for p in files[part[0] :: part[1]])), None)
    names = sorted(record["files"])
    for name in names[part[0] :: part[1]]:
        expected, path = record["files"][name], folder / name
        try:
            size = path.stat().st_size
            if size != expected["size"]:
                return f"{name} has {size:,} bytes, its manifest says {expected['size']:,}"
            if contents and file_entry(path)["sha256"] != expected["sha256"]:
                return f"{name} does not match the sha256 in its manifest"
        except FileNotFoundError:
            return f"{name} is missing"
        except OSError as exc:
            return f"{name} cannot be read ({exc.strerror})"
    return None


def _zip_problem(path: Path, folder: Path) -> str | None:
    name = path.relative_to(folder)
    try:
        with zipfile.ZipFile(path) as archive:
            bad = archive.testzip()
        return f"{name}: {bad} fails its CRC check" if bad else None
    except (zipfile.BadZipFile, EOFError, ValueError):
        return f"{name} is not a complete checkpoint file ({path.stat().st_size:,} bytes)"
    except OSError as exc:
        return f"{name} cannot be read ({exc.strerror})"


def own(checkpoints: list[Path], run_id: str | None) -> list[Path]:
    """The checkpoints this run wrote (the others are never rotated away)."""
    return [p for p in checkpoints if (read_manifest(p) or {}).get("run_id", "") == run_id]


# ---------------------------------------------------------------------------------------------
# Room for the next checkpoint, and what a new run must not overwrite


def size_on_disk(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def free_bytes(folder: Path) -> int:
    """Free space for an unprivileged writer on folder's file system (its nearest existing parent)."""
    folder = Path(folder).absolute()
    while not folder.exists():
        folder = folder.parent
    return shutil.disk_usage(folder).free


def human(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    return str(n)


def save_failed(reason: str, folder: Path, name: str, needed: int) -> SaveFailed:
    """The one line for a save that found no room (after its partial files are removed)."""
    kept = candidates(folder, list_files) or candidates(folder, list_folders)
    keeps = f"{kept[0].name} is kept" if kept else "no earlier checkpoint exists"
    return SaveFailed(
        f"cannot save checkpoint {name} in {folder}: {reason}; it needs about {human(needed)}, "
        f"{human(free_bytes(folder))} free there. {keeps}: make room there (or move run.output_dir to a "
        "larger disk) and run the same command to resume",
        key="run.output_dir",
    )


def room_reason(exc: BaseException, folder: Path, needed: int, write_error: OSError | None = None) -> str | None:
    """Why a write failed if it was for lack of room: an errno that says so, or (torch reports
    its writer's failures without one) less room left than the checkpoint needs."""
    named = [e for e in (exc, exc.__cause__, exc.__context__, write_error) if isinstance(e, OSError) and e.errno]
    for error in named:
        if error.errno in FULL:
            return FULL[error.errno]
    if named:  # the system named another reason (permission denied, read-only): not room
        return None
    if isinstance(exc, (OSError, RuntimeError)) and free_bytes(folder) < needed:
        return FULL[errno.ENOSPC]
    return None


def unused_sibling(output_dir: Path) -> Path:
    output_dir = Path(output_dir)
    n = 2
    while (candidate := output_dir.with_name(f"{output_dir.name}-{n}")).exists():
        n += 1
    return candidate


# What a write killed before its rename leaves (temporary_name, and the markers' and the run lock's
# job record beside them): matched by name, so that no file of the user's is ever taken for one.
_LEFTOVER = re.compile(
    r"\.(step_\d{8}(\.pt(\.json)?)?|latest|manifest\.json|preempted\.json)\.tmp-\d+|\.job\.json\.\d+"
)


def remove_interrupted_writes(output_dir: Path) -> list[Path]:
    """Delete the temporaries of writes that never finished in output_dir, its checkpoints/ and the
    checkpoint folders there; the paths removed. Called by the run that holds the folder's lock."""
    ckpt_dir = Path(output_dir) / "checkpoints"
    removed = []
    for folder in (Path(output_dir), ckpt_dir, *list_folders(ckpt_dir)):
        if folder.is_dir():
            for path in sorted(folder.iterdir()):
                if _LEFTOVER.fullmatch(path.name) and path.is_file() and not path.is_symlink():
                    path.unlink(missing_ok=True)
                    removed.append(path)
    return removed


def refuse_to_start(output_dir: Path, resume: bool) -> None:
    """Before a run writes anything: a new run (checkpoint.resume=false) refuses a folder that holds
    an earlier run, and any run refuses a disk without room for its next checkpoint. The leftovers of
    writes an earlier run was killed in go first (said): they take room the next checkpoint needs."""
    output_dir = Path(output_dir)
    ckpt_dir = output_dir / "checkpoints"
    removed = remove_interrupted_writes(output_dir)
    if removed:
        names = ", ".join(str(p.relative_to(output_dir)) for p in removed)
        print(f"removed {len(removed)} unfinished temporary file(s) of an interrupted write in {output_dir}: {names}")
    found = sorted(list_files(ckpt_dir) + list_folders(ckpt_dir), key=step_of)
    if not resume:
        held = [f"checkpoints up to {found[-1].name}"] if found else []
        held += [name for name in ("metrics.jsonl", "config.yaml") if (output_dir / name).exists()]
        if held:
            raise ConfigError(
                f"run.output_dir={output_dir} holds an earlier run ({', '.join(held)}), which "
                "checkpoint.resume=false would overwrite. Start the new run in a folder of its own: "
                f"run.output_dir={unused_sibling(output_dir)} (or checkpoint.resume=true to continue the earlier one)",
                key="checkpoint.resume",
            )
    if found:
        needed, free = size_on_disk(found[-1]), free_bytes(ckpt_dir)
        if free < needed:
            raise ConfigError(
                f"{ckpt_dir} has {human(free)} free but the next checkpoint needs about {human(needed)} "
                f"(the size of {found[-1].name}): make room there (or move run.output_dir to a larger disk), "
                "then run the same command",
                key="run.output_dir",
            )
