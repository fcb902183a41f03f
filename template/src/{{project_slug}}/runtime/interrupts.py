"""SIGTERM and SIGHUP end a command as Ctrl-C does: a scheduler's stop, a `kill`, a closed terminal
or an ssh session that drops raise KeyboardInterrupt (Stopped) in the main thread, so every
`except BaseException` / `finally` that removes a temporary (export's partial folder, prepare-data's
staging, a launch's follow) runs, the command says it stopped in one line, and exits 128 + the
signal's number (143 for SIGTERM, 129 for SIGHUP, 130 for Ctrl-C), as a shell reports a process the
signal killed. `train` keeps its own handling: there SIGTERM asks for a checkpoint (preemption.py).
"""

from __future__ import annotations

import signal
import threading

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


def exit_code(exc: KeyboardInterrupt) -> int:
    """128 + the number of the signal that interrupted (Ctrl-C: SIGINT)."""
    return 128 + getattr(exc, "signum", signal.SIGINT)


def how(exc: KeyboardInterrupt) -> str:
    """'interrupted' for Ctrl-C, 'stopped by SIGTERM' for a caught signal."""
    signum = getattr(exc, "signum", None)
    return f"stopped by {signal.Signals(signum).name}" if signum else "interrupted"
