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
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ..settings.config import ConfigError

FAILURE_FILE = "TRAIN_FAILURE_FILE"


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


def report(exc: ConfigError) -> int:
    """cli.py's handling of a ConfigError: hand it to the supervisor, or print it; the exit code."""
    if hand_over(str(exc)):
        return 0  # torchrun sees a finished rank and does not restart the group
    if not isinstance(exc, ReportedByRankZero):
        print(f"error: {exc}", file=sys.stderr, flush=True)
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
