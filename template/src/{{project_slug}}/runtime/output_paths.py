"""The folders a command writes to, checked before it starts: the one place (cli.py calls it for
every command), so a bad folder is one line naming its key, not a traceback halfway through.

    require_writable_outputs(cfg, "train", args)    # run.output_dir
    require_writable_outputs(cfg, "prepare-data", args)    # data.dir
    require_writable_outputs(cfg, "doctor", args)          # --log-dir, when given

Each folder must exist or be makeable, be a folder (no file on its path), be writable (tried with a
file created and removed: root passes os.access on read-only mounts and /sys), have room, and be
neither the project folder nor the other of run.output_dir / data.dir (a run written over its data,
or a run spread among the project's files). Nothing is created: a refused command leaves no trace.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from argparse import Namespace
from pathlib import Path

from ..settings.bounds import CONTROL
from ..settings.config import Config, ConfigError, project_root

MIN_FREE_BYTES = 2**20
"""Less room than this fails the first write (config.yaml, metrics, a shard) of any command. Whether
a checkpoint fits is the save's own question (checkpoint_files.room_reason): it knows its size."""


def outputs(cfg: Config, command: str, args: Namespace) -> dict[str, str]:
    """{key: folder} that `command` writes to (export: its out_dir argument; doctor and debug-dump:
    the folder given for their logs and dumps, their own default being fresh)."""
    if command in ("train", "node", "eval"):
        return {"run.output_dir": cfg.run.output_dir}
    if command == "launch" and getattr(args, "platform", None) == "devmachine" and args.action == "submit":
        return {"run.output_dir": cfg.run.output_dir}
    if command == "prepare-data":
        return {"data.dir": cfg.data.dir}
    if command == "export":
        return {"out_dir": args.out_dir}
    if command == "doctor" and args.log_dir:
        return {"--log-dir": args.log_dir}
    if command == "debug-dump" and args.out:
        return {"--out": args.out}
    return {}


def _nearest_existing(path: Path) -> Path:
    while not path.exists() and not path.is_symlink():
        path = path.parent
    return path


def _refusal(key: str, folder: str, cfg: Config) -> str | None:
    """Why `folder` cannot be written as `key`, or None."""
    fix = {
        "run.output_dir": "run.output_dir=runs/<name>",
        "data.dir": "data.dir=data",
        "out_dir": "another folder for `export`",
        "--log-dir": "another --log-dir, or none for a temporary folder",
        "--out": "another --out, or none for the run's debug-dump folder",
    }[key]
    if not folder.strip():
        return f"{key} is empty, so the command would write into the project folder; set {fix}"
    control = CONTROL.search(folder)
    if control:
        return f"{key}={folder!r} holds the control character {control.group()!r} (a pasted newline?); set {fix}"
    path = Path(folder).absolute()
    if path.resolve() == project_root().resolve():
        return f"{key}={folder} is the project folder; its files would be mixed with the project's: set {fix}"
    others = {"run.output_dir": cfg.run.output_dir, "data.dir": cfg.data.dir}
    for other, value in others.items():
        if other != key and value.strip() and path.resolve() == Path(value).resolve():
            return f"{key}={folder} is also {other}: a run and its data need folders of their own; set {fix}"
    existing = _nearest_existing(path)
    if not existing.is_dir():
        what = "a broken link" if existing.is_symlink() and not existing.exists() else "a file"
        return f"{key}={folder}: {existing} is {what}, not a folder; remove it or set {fix}"
    try:
        fd, probe = tempfile.mkstemp(prefix=".write-test-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"{key}={folder} cannot be written ({existing}: {exc.strerror}); choose a folder you can write: {fix}"
    free = shutil.disk_usage(existing).free
    if free < MIN_FREE_BYTES:
        return (
            f"{key}={folder} has {free // 2**20} MiB free ({existing}); make room there or set {fix} on a larger disk"
        )
    return None


def require_writable_outputs(cfg: Config, command: str, args: Namespace) -> None:
    """Refuse, with one line naming the key and the fix, a folder `command` could not write."""
    for key, folder in outputs(cfg, command, args).items():
        message = _refusal(key, str(folder), cfg)
        if message:
            raise ConfigError(message, key=key)


def own_paths(cfg: Config) -> list[Path]:
    """The folders whose write failures are the user's to fix, not a restart's (unrecoverable.py)."""
    return [Path(p).resolve() for p in (cfg.run.output_dir, cfg.data.dir) if p.strip()]
