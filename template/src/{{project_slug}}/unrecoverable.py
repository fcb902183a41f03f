"""Failures a restart cannot fix (a mistake in the settings, an output folder in use, a full disk):
one line and the end of the job, not torchrun restarting the ranks into the same failure.

torchrun restarts a worker group that failed, whatever the exit code. So under the node supervisor
(supervise.py, which sets TRAIN_FAILURE_FILE for its child) a rank that meets such a failure
writes its message to that file and exits 0: torchrun sees a finished group and stops, and the
supervisor prints the message and exits 1. Run any other way (`train` alone, torchrun by hand), the
rank exits 1 as usual.

    raise ConfigError("...")                     # on every rank that finds the mistake
    raise_on_every_rank(message, info.is_main)   # a failure rank 0 found and shared: it alone prints
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from .config import ConfigError

FAILURE_FILE = "TRAIN_FAILURE_FILE"


class ReportedByRankZero(ConfigError):
    """The failure rank 0 prints for the whole job, raised on the other ranks (which stay quiet)."""


def raise_on_every_rank(message: str, is_main: bool, key: str | None = None):
    raise (ConfigError if is_main else ReportedByRankZero)(message, key=key)


def report(exc: ConfigError) -> int:
    """cli.py's handling of a ConfigError: print it, record it for a supervisor; the exit code."""
    if not isinstance(exc, ReportedByRankZero):
        print(f"error: {exc}", file=sys.stderr, flush=True)
    path = os.environ.get(FAILURE_FILE)
    if not path:
        return 1
    tmp = Path(f"{path}.{os.getpid()}")
    try:
        tmp.write_text(str(exc) + "\n")
        os.replace(tmp, path)  # every rank writes the same line; a reader never sees half of one
    except OSError:
        return 1  # no record: fail as usual (torchrun may then restart the group)
    return 0


def read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text().strip() or None
    except OSError:
        return None
