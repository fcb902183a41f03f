"""Where a job keeps what it reads and writes: run.output_dir, data.dir and the project's copy
(--code-from-storage) must lie on the storage the platform mounts in every pod or instance (the
volumes its launch files name), or the job would write its checkpoints into a container that
vanishes with it, or find no data. The paths are judged normalised
(/mnt/shared/../etc is /etc), and where the storage is mounted on this machine too, through the
links they pass below a mount, followed as a node follows them (the storage holds the same links
there): /mnt/shared/runs -> /home/me/runs lies off the storage whatever its text says. Where the
storage is not mounted here the links cannot be followed, which `check` says in a note
(unfollowed_note). `check` judges the paths against the platforms' launch files (launch_file_problems,
with the mounts each platform folder's storage_mounts reads from them), each launch against its own
files before submitting; the copy is also written from this machine, at
the same path: a folder under a file or on read-only storage (tried with a file made and removed:
root passes os.access on a read-only mount) is refused before anything is copied.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from ..settings.config import Config, ConfigError

NOT_STORAGE = ("/dev/shm",)  # a pod's shared memory, not storage (storage_mounts leave it out)


def normalised(path: str) -> str:
    """The path as Linux resolves its text: `..` and `.` taken out, and POSIX's leading '//' one '/'."""
    normal = os.path.normpath(path)
    return "/" + normal.lstrip("/") if normal.startswith("//") else normal


def lies_under(path: str, mount: str) -> bool:
    path, mount = normalised(path), normalised(mount)
    return path == mount or path.startswith(mount.rstrip("/") + "/")


MAX_LINKS = 40  # links followed in one path, as Linux follows at most (ELOOP)


def followed_on_the_nodes(path: str, mounts: list[str]) -> tuple[str, str | None]:
    """(where `path` leads on the nodes, the last link below a mount on the way or None): each link
    below a mount (the mount point itself aside: it is this machine's arrangement) followed from the
    left, its target read as a node reads it (an absolute one from the root of the pod, which
    mounts the same storage at the same path); links elsewhere are left alone."""
    path, via = normalised(path), None
    for _ in range(MAX_LINKS):
        parts = Path(path).parts
        for depth in range(2, len(parts) + 1):
            prefix = os.path.join(*parts[:depth])
            below = any(lies_under(prefix, m) and normalised(m) != prefix for m in mounts)
            if below and os.path.islink(prefix):
                target = os.readlink(prefix)
                via = f"{prefix} -> {target}"
                path = normalised(os.path.join(os.path.dirname(prefix), target, *parts[depth:]))
                break
        else:
            return path, via
    return path, via  # a loop of links: judged where it stands


def unfollowed_note(paths: list[tuple[str, str]], mounts: list[str]) -> str | None:
    """A note naming the mounts that hold some of `paths` (field, value) but are not mounted here:
    links on those paths cannot be followed from this machine; None when every one could be."""
    absent = sorted(
        {m for _, value in paths for m in mounts if value and lies_under(value, m) and not os.path.isdir(m)}
    )
    if not absent:
        return None
    fields = " and ".join(dict.fromkeys(f for f, value in paths if any(lies_under(value, m) for m in absent)))
    return (
        f"{' and '.join(absent)} {'is' if len(absent) == 1 else 'are'} not mounted on this machine, so links on "
        f"{fields} were not followed: run check where the storage is mounted to judge them too"
    )


def outside_problem(field: str, value: str, mounts: list[str], where: str) -> str | None:
    """Why `field` (a path a job uses) is not on the mounted storage, or None."""
    normal = normalised(value) if value else value
    if value and os.path.isabs(value) and any(lies_under(value, m) for m in mounts):
        reached, via = followed_on_the_nodes(value, mounts)
        if via is None or any(lies_under(reached, m) for m in mounts):
            return None
        return (
            f"{field}={value!r} leads off the storage the job's nodes mount ({', '.join(mounts)}, {where}) through "
            f"the link {via}: on the nodes that is {reached}, inside the pod or instance, where nothing is kept or "
            f"shared; set {field} to a folder on the storage itself, or point that link under {mounts[0]}"
        )
    said = f"{field}={value!r}" + (
        f" (that is {normal})" if normal != value else ""
    )  # whole: a path cut short names nothing
    example = f"{mounts[0].rstrip('/')}/..." if mounts else "a path on the shared storage"
    if not mounts:
        return f"{where} mounts no shared storage, so {said} would vanish with the job; add the shared volume there"
    return (
        f"{said} lies outside the storage the job's nodes mount ({', '.join(mounts)}, {where}): what the job "
        f"keeps there would vanish with its pod or instance; set {field} under it ({example})"
    )


def launch_file_problems(cfg: Config, launch_mounts: dict[str, list[str]]) -> list[str]:
    """run.output_dir and data.dir against the volumes each launch file gives the job's nodes (the
    platforms' storage_mounts, for launch files whose nodes see nothing else, as copier refuses such
    answers). A platform whose start scripts also run outside it leaves its files out and refuses
    when its launch submits (require_on_storage)."""
    problems = []
    for where, mounts in launch_mounts.items():
        for field, value in (("run.output_dir", cfg.run.output_dir), ("data.dir", cfg.data.dir)):
            problem = outside_problem(field, value, mounts, where)
            if problem and problem not in problems:
                problems.append(problem)
    return problems


def launch_file_note(cfg: Config, launch_mounts: dict[str, list[str]]) -> str | None:
    """unfollowed_note for run.output_dir and data.dir against the launch files' mounts."""
    mounts = [mount for found in launch_mounts.values() for mount in found]
    paths = [("run.output_dir", cfg.run.output_dir), ("data.dir", cfg.data.dir)]
    return unfollowed_note(paths, list(dict.fromkeys(mounts)))


def require_on_storage(cfg: Config, mounts: list[str], where: str, copy: Path | None = None) -> None:
    """ConfigError for the first of run.output_dir, data.dir and the copy that lies off the mounts."""
    paths = [("run.output_dir", cfg.run.output_dir), ("data.dir", cfg.data.dir)]
    if copy is not None:
        paths.append(("the project's copy (--code-from-storage, beside run.output_dir)", str(copy)))
    for field, value in paths:
        problem = outside_problem(field, value, mounts, where)
        if problem:
            raise ConfigError(problem, key=field if field.startswith(("run.", "data.")) else "run.output_dir")


def require_writable_folder(what: str, folder: Path) -> None:
    """ConfigError where `folder` could not be made and written from here: under a file, or read-only
    (tried: a file made in the nearest folder that exists, and removed)."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{what} {folder} lies under {existing}, which is a file: set run.output_dir elsewhere")
    try:
        handle, probe = tempfile.mkstemp(prefix=".write-test-", dir=existing)
        os.close(handle)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(
            f"{what} {folder} cannot be written: {existing} refuses new files here ({exc.strerror}); mount the "
            "shared storage writable on this machine at the same path as on the nodes, or set run.output_dir on "
            "storage that is"
        ) from None
