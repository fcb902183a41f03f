"""How a process ends.

A stop signal as Ctrl-C (stop_like_ctrl_c, every command but `train`): SIGTERM and SIGHUP (a
scheduler's stop, a `kill`, a closed terminal, an ssh session that drops) raise KeyboardInterrupt
(Stopped) in the main thread, so every `except BaseException` / `finally` that removes a temporary
(export's partial folder, prepare-data's staging, a launch's follow) runs, the command says it stopped
in one line, and exits 128 + the signal's number (143 for SIGTERM, 129 for SIGHUP, 130 for Ctrl-C), as
a shell reports a process the signal killed. `train` keeps its own: there SIGTERM asks for a
checkpoint (preemption.py).

A rank that joined a process group (end): its exit hooks run and its output is flushed, then it
leaves without the interpreter's finalization. torch's DistributedDataParallel keeps a reference to
its Gloo process group that outlives destroy_process_group, so the group's worker threads are still
alive when the interpreter finalizes; a worker that drops the last reference to a tensor owned by
Python then takes the GIL of an interpreter being torn down, and the process aborts ("terminate
called without an active exception", exit -6) after a run that finished and saved: its launcher
reports a failed job. Seen once in about 40 two-process CPU runs on a loaded machine. Processes that
never joined a group exit the ordinary way.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
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


CAUGHT = (signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """Raised by a caught stop signal; `signum` says which."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum, frame) -> None:
    raise Stopped(signum)


def stop_like_ctrl_c() -> None:
    """From now on CAUGHT raise Stopped in the main thread (elsewhere signals cannot be caught)."""
    if threading.current_thread() is threading.main_thread():
        for sig in CAUGHT:
            signal.signal(sig, _raise_stopped)


def interrupted_code(exc: KeyboardInterrupt) -> int:
    """128 + the number of the signal that interrupted (Ctrl-C: SIGINT)."""
    return 128 + getattr(exc, "signum", signal.SIGINT)


def how(exc: KeyboardInterrupt) -> str:
    """'interrupted' for Ctrl-C, 'stopped by SIGTERM' for a caught signal."""
    signum = getattr(exc, "signum", None)
    return f"stopped by {signal.Signals(signum).name}" if signum else "interrupted"
