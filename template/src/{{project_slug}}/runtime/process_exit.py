"""How a process that joined a process group ends: its exit hooks run and its output is flushed, then
it leaves without the interpreter's finalization.

Why: torch's DistributedDataParallel keeps a reference to its Gloo process group that outlives
destroy_process_group, so the group's worker threads are still alive when the interpreter finalizes.
A worker that drops the last reference to a tensor owned by Python then takes the GIL of an
interpreter being torn down, and the process aborts ("terminate called without an active
exception", exit -6) after a run that finished and saved: its launcher reports a failed job. Seen
once in about 40 two-process CPU runs on a loaded machine. The rank has nothing left to do at that
point, so it skips finalization (os._exit) once atexit's hooks have run, as the interpreter would.
Processes that never joined a group exit the ordinary way.
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import NoReturn

_joined_group = False


def joined_group() -> None:
    """Called once this process is in a process group (runtime/distributed.py)."""
    global _joined_group
    _joined_group = True


def end(code: int | None) -> NoReturn:
    """The process's end with exit code `code` (None: 0), as `raise SystemExit(code)` would."""
    if not _joined_group:
        raise SystemExit(code)
    atexit._run_exitfuncs()  # noqa: SLF001 - what finalization would run first, with the interpreter whole
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(code or 0)
