"""Failures a restart cannot fix (a mistake in the settings, a checkpoint of another model or of
other data, an output folder in use, a full disk): one line, printed once, and the end of the job,
not torchrun restarting the ranks into the same failure.

torchrun restarts a worker group that failed, whatever the exit code, so under the node supervisor
the ranks do not fail. The supervisor (supervise.py) names a path in a fresh temporary folder of its
machine in TRAIN_FAILURE_FILE; a rank that meets such a failure writes its message there (cli.py,
through `report`: the first rank's message wins) and exits 0. The supervisor sees the message
(`recorded`), gives torchrun a grace period to end by itself, stops it, and raises the message as
its own ConfigError. Run any other way (`train` alone, torchrun by hand), the rank prints the
message and exits 1 as usual.

    raise ConfigError("...")                     # on every rank that finds the mistake
    raise_on_every_rank(message, info.is_main)   # a failure rank 0 found and shared: it alone prints

A ConfigError (SaveFailed among them) is such a failure by definition. So is an OSError that says our
own folder cannot be written (`unwritable`: permission, a read-only or full disk, a file where a folder
should be): a restart would retrain to the same write and fail again. Any other error is left to
torchrun's restarts, as a crash it may outlive.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..settings.config import ConfigError

FAILURE_FILE = "TRAIN_FAILURE_FILE"

# EEXIST: mkdir(exist_ok=True) met a file where a folder should be.
UNWRITABLE = {
    errno.EACCES,
    errno.EPERM,
    errno.EROFS,
    errno.ENOSPC,
    errno.EDQUOT,
    errno.ENOTDIR,
    errno.EISDIR,
    errno.EEXIST,
}


class SharedFailure(ConfigError):
    """A failure every rank raises at the same point, after the collective that shared it: no rank
    is left waiting in another, so they can end together as after a finished run (train.py)."""


class ReportedByRankZero(SharedFailure):
    """The failure rank 0 prints for the whole job, raised on the other ranks (which stay quiet)."""


def raise_on_every_rank(message: str, is_main: bool, key: str | None = None):
    raise (SharedFailure if is_main else ReportedByRankZero)(message, key=key)


def hand_over(message: str) -> bool:
    """In a rank: record a failure for the supervisor, which prints it once and ends the job.
    False when there is no supervisor to tell (the caller prints it and fails)."""
    path = os.environ.get(FAILURE_FILE)
    if not path:
        return False
    own = f"{path}.{os.getpid()}"
    try:
        with open(own, "w") as f:
            f.write(message)
        try:
            os.link(own, path)  # complete or absent, never half written; the first rank's message wins
        except FileExistsError:
            pass
        finally:
            os.unlink(own)
    except OSError:  # no such folder: a rank on another machine than its supervisor
        return False
    return True


def unwritable(exc: OSError, folders: list[Path]) -> ConfigError | None:
    """The one-line failure for an OSError writing inside one of `folders` (run.output_dir,
    data.dir), which no restart fixes; None for any other OSError."""
    if exc.errno not in UNWRITABLE or not exc.filename:
        return None
    where = Path(os.fsdecode(exc.filename)).absolute()
    folder = next((f for f in folders if where == f or f in where.parents), None)
    if folder is None:
        return None
    if exc.errno in (errno.EEXIST, errno.ENOTDIR):
        fix = "a file stands where a folder should be on that path: move it away"
    else:
        fix = f"make {where.parent} a folder you can write, with room"
    return ConfigError(
        f"cannot write {where}: {exc.strerror} (inside {folder}); a restart would fail the same way: "
        f"{fix} (or choose another folder), then run the same command to resume"
    )


def path_mistake(exc: OSError) -> ConfigError | None:
    """The one line for a path the system cannot even look up (too long, a loop of links): a
    mistake in what was typed, which no retry fixes; None for any other OSError."""
    if exc.errno not in (errno.ENAMETOOLONG, errno.ELOOP) or not exc.filename:
        return None
    name = os.fsdecode(exc.filename)
    shown = name if len(name) <= 80 else f"{name[:60]}... ({len(name)} characters)"
    return ConfigError(f"cannot use the path {shown}: {exc.strerror}; give a shorter path without a loop of links")


def unusable_path(exc: BaseException, folders: list[Path]) -> ConfigError | None:
    """path_mistake or unwritable for an OSError (no restart fixes either); None for anything else.
    A rank that meets one while the others wait in a collective shares it, so none waits for it."""
    if not isinstance(exc, OSError):
        return None
    return path_mistake(exc) or unwritable(exc, folders)


def recorded_by_a_rank() -> bool:
    """In a rank: whether a rank already handed a failure to the supervisor (which ends the job)."""
    path = os.environ.get(FAILURE_FILE)
    return bool(path) and recorded(path) is not None


def report(exc: ConfigError) -> int:
    """cli.py's handling of a ConfigError: hand it to the supervisor, or print it; the exit code."""
    if hand_over(str(exc)):
        return 0  # torchrun sees a finished rank and does not restart the group
    if not isinstance(exc, ReportedByRankZero):
        sys.stderr.write(f"error: {exc}\n")  # one write: another process's line cannot split it
        sys.stderr.flush()
    return 1


@contextmanager
def failure_file() -> Iterator[str]:
    """In a supervisor: the path its ranks record a failure in, for TRAIN_FAILURE_FILE (in a fresh
    folder of this machine, removed afterwards)."""
    folder = tempfile.mkdtemp(prefix="train-failure-")
    try:
        yield os.path.join(folder, "message")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def recorded(path: str | Path) -> str | None:
    """The failure a rank recorded at path, or None."""
    try:
        return Path(path).read_text()
    except OSError:
        return None
