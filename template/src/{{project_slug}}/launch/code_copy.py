"""Jobs that run the project's code from the shared storage, in a ready-made image (no image build).

    <package> launch <platform> --code-from-storage --image nvcr.io/nvidia/pytorch:25.01-py3
    <package> launch <platform> --code-from-storage         # the image of launch/code-from-storage.yaml
    <package> launch <platform> --no-code-from-storage      # the project's image, in a code_from=storage project

(On a cluster without containers, the nodes' Python is the "image".)

Each submission copies pyproject.toml, src/, config/ and launch/ (no data, runs, caches or build
outputs) to <parent of run.output_dir>/code/<git commit or time>-<digest of the files> (by default
<shared_mount>/<package>/code/...): a job, and every requeue or restart of it, runs the files it was
submitted with, whatever changes in the checkout later. The same files are copied once (the digest
finds the copy made before). The job starts cluster/ready_image.py of the copy, by path, which puts
the copy's src/ on PYTHONPATH, checks the image (its torch, the strategy's packages, NCCL on GPUs)
and starts `<package> node`.

Projects answered code_from=storage hold launch/code-from-storage.yaml (the ready-made image): there
this is the default; --image and --[no-]code-from-storage decide for one submission.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from argparse import ArgumentParser, BooleanOptionalAction, Namespace
from pathlib import Path

from ..settings.config import Config, ConfigError, project_root, under_root
from ..settings.stored_files import read_yaml
from . import jobs

SETTINGS = Path("launch") / "code-from-storage.yaml"
COPIED = ("pyproject.toml", "src", "config", "launch")
SKIPPED_PARTS = ("__pycache__", ".pytest_cache", ".ruff_cache")
SKIPPED_SUFFIXES = (".pyc", ".egg-info")
ENTRY = Path("cluster") / "ready_image.py"  # under src/<package>/ of the copy


def add_arguments(p: ArgumentParser) -> None:
    p.add_argument(
        "--code-from-storage",
        action=BooleanOptionalAction,
        default=None,
        help="copy the project to the shared storage and run it from there in a ready-made image with PyTorch "
        "(default: on where launch/code-from-storage.yaml exists, the answer code_from=storage)",
    )
    p.add_argument(
        "--image",
        help="with --code-from-storage: the image to run (default: launch/code-from-storage.yaml's, else the "
        "launch file's); any image with PyTorch and the project's dependencies",
    )


def ready_image(args: Namespace) -> tuple[bool, str | None]:
    """(run from the shared storage?, the image to run or None for the launch file's)."""
    path = project_root() / SETTINGS
    settings = read_yaml(path, "re-render it with `copier update`") if path.is_file() else {}
    enabled = path.is_file() if args.code_from_storage is None else args.code_from_storage
    if args.image and not enabled:
        raise ConfigError(
            "--image runs a ready-made image with the code from the shared storage: add --code-from-storage "
            "(the project's own image is the launch file's: `copier update --data image=...`)"
        )
    return enabled, args.image or (settings or {}).get("image") or None


def copied_files(root: Path) -> list[Path]:
    """The files a copy holds, relative to the project root, sorted."""
    found = []
    for name in COPIED:
        top = root / name
        paths = [top] if top.is_file() else sorted(p for p in top.rglob("*") if p.is_file())
        for path in paths:
            relative = path.relative_to(root)
            if any(part in SKIPPED_PARTS or part.endswith(SKIPPED_SUFFIXES) for part in relative.parts):
                continue
            found.append(relative)
    return found


def copies_folder(cfg: Config) -> Path:
    """Beside run.output_dir, which lies on the storage every node mounts."""
    return under_root(cfg.run.output_dir).parent / "code"


def planned_copy(cfg: Config) -> tuple[Path, list[Path]]:
    """Where this submission's copy goes (its name follows the files) and the files, relative."""
    root = project_root()
    files = copied_files(root)
    digest = hashlib.sha256()
    for relative in files:
        try:
            content = (root / relative).read_bytes()
        except OSError as exc:  # a file left unreadable (root's, a broken link): the job would lack it too
            raise ConfigError(
                f"cannot read {root / relative} to copy it ({exc.strerror or exc}): make it readable, or "
                "move it out of the project's src/, config/ or launch/"
            ) from None
        digest.update(str(relative).encode() + b"\0" + content + b"\0")
    folder, content = copies_folder(cfg), digest.hexdigest()[:12]
    made = sorted(folder.glob(f"*-{content}")) if folder.is_dir() else []
    if made:  # these files were copied before (under another commit or time, maybe)
        return made[0], files
    # Outside git: the time of the newest file copied, so a dry run names the copy the submission makes.
    newest = max(((root / relative).stat().st_mtime for relative in files), default=0.0)
    version = jobs.code_version(root) or time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(newest))
    return folder / f"{version}-{content}", files


def copy_project(cfg: Config, dry_run: bool = False) -> Path:
    """The project's copy on the shared storage for this submission (made now, or found made; a dry
    run only names it)."""
    target, files = planned_copy(cfg)
    if dry_run or target.is_dir():
        return target
    # Written beside it, then renamed: a job never finds a copy half-written.
    staging = target.parent / f".{target.name}.{os.getpid()}"
    root = project_root()
    try:
        for relative in files:
            (staging / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / relative, staging / relative)
        os.rename(staging, target)
    except OSError as exc:
        shutil.rmtree(staging, ignore_errors=True)
        if target.is_dir():  # another submission copied the same files meanwhile
            return target
        raise ConfigError(
            f"cannot copy the project to {target} ({exc.strerror}): run.output_dir must lie on the shared "
            "storage, mounted on this machine at the same path as on the nodes"
        ) from None
    return target


def entry(copy: Path, package: str) -> str:
    """The node start of the copy, run by path (the package is not installed in the image)."""
    return str(copy / "src" / package / ENTRY)


def node_command(command: list[str], copy: Path, package: str) -> list[str]:
    """A launch file's `<package> node ...` as the copy's node start."""
    if not command or command[0] != package:
        raise ConfigError(
            f"the training command {' '.join(command)!r} does not start with `{package}`: only the launch files' "
            "own `<package> node` command can run from the shared storage"
        )
    return ["python", entry(copy, package), *command[1:]]
