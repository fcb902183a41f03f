"""How a process ends.

A stop signal as Ctrl-C (stop_like_ctrl_c, every command but `train`): SIGTERM, SIGHUP and SIGQUIT (a
scheduler's stop, a `kill`, a closed terminal, an ssh session that drops, Ctrl-\\) raise KeyboardInterrupt
(Stopped) in the main thread, so every `except BaseException` / `finally` that removes a temporary
(export's partial folder, prepare-data's staging, a launch's follow) runs, the command says it stopped
in one line, and exits 128 + the signal's number (143 for SIGTERM, 129 for SIGHUP, 130 for Ctrl-C), as
a shell reports a process the signal killed. Only the first stop counts: a second one while the first
cleans up, or while the process exits, is let pass. `train` keeps its own: there SIGTERM asks for a
checkpoint (preemption.py).

A rank that joined a process group (end): its exit hooks run and its output is flushed, then it
leaves without the interpreter's finalization, after a crash too (crash: the traceback, exit 1). A
Gloo process group's destructor joins its worker threads, and a worker finishing a collective may be
dropping the last reference to a tensor owned by Python, for which it needs the GIL. Destroyed on the
main thread, which holds the GIL, the group never ends: when the last DistributedDataParallel (which
keeps the group past destroy_process_group) was freed with a failure's traceback, a rank that had
handed its failure over hung there, deaf to SIGTERM, until torchrun killed it (seen about once in 30
two-process runs on a loaded machine). Destroyed by the interpreter's finalization, the worker takes
the GIL of an interpreter being torn down and the process aborts ("terminate called without an
active exception", exit -6) after a run that finished and saved. So every group a rank joins is held
here (joined_group) until os._exit ends the process: no group is ever destroyed. Processes that never
joined a group exit the ordinary way.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from typing import NoReturn

_joined_group = False
_groups: list = []  # every process group joined, referenced until os._exit: none is ever destroyed


def joined_group(*groups) -> None:
    """Called with each process group this process joins (runtime/distributed.py: the world's, and
    those made beside it): from now on it ends by `end` or `crash`, and the groups outlive everything."""
    global _joined_group
    _joined_group = True
    _groups.extend(groups)


def crash(exc: BaseException) -> NoReturn:
    """A joined process's end for an exception main did not handle: the traceback as the interpreter
    prints it and exit 1 (sys.exit's code for a SystemExit), without finalization. Called inside the
    `except`, while the traceback still holds what it references: nothing is freed before the end."""
    if isinstance(exc, SystemExit):  # sys.exit(code): its code, as the interpreter would end
        if exc.code is None or isinstance(exc.code, int):
            end(exc.code)
        print(exc.code, file=sys.stderr)
        end(1)
    sys.excepthook(type(exc), exc, exc.__traceback__)
    end(1)


def in_group() -> bool:
    return _joined_group


def end(code: int | None) -> NoReturn:
    """The process's end with exit code `code` (None: 0), as `raise SystemExit(code)` would. A stop
    signal from here on finds nothing left to stop: the exit hooks run undisturbed."""
    global _stopping
    _stopping = True
    _ignore_stops()
    if not _joined_group:
        raise SystemExit(code)
    atexit._run_exitfuncs()  # noqa: SLF001 - what finalization would run first, with the interpreter whole
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing more can reach it
            pass
    os._exit(code or 0)


CAUGHT = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
_stopping = False  # a stop signal was raised: the clean-up it started is under way


class Stopped(KeyboardInterrupt):
    """Raised by a caught stop signal; `signum` says which."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum, frame) -> None:
    """The first stop signal interrupts; the ones after it (a second Ctrl-C, a scheduler's repeated
    SIGTERM) change nothing, so that they cannot break into the clean-up of the first (a partial folder
    half removed) or into the exit hooks (an "Exception ignored in atexit" traceback)."""
    global _stopping
    if _stopping:
        return
    _stopping = True
    raise Stopped(signum)


def stop_like_ctrl_c() -> None:
    """From now on CAUGHT, and Ctrl-C where it is not ignored (a job started in the background),
    raise Stopped in the main thread (elsewhere signals cannot be caught), once."""
    if threading.current_thread() is threading.main_thread():
        for sig in CAUGHT:
            signal.signal(sig, _raise_stopped)
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _raise_stopped)


def _ignore_stops() -> None:
    """The signals stop_like_ctrl_c caught, ignored: the interpreter's finalization gives a handler of
    ours back to the default (a signal then would kill the process during torch's teardown, exit -15
    instead of its code) but leaves an ignored signal ignored."""
    if threading.current_thread() is threading.main_thread():
        for sig in (*CAUGHT, signal.SIGINT):
            if signal.getsignal(sig) is _raise_stopped:
                signal.signal(sig, signal.SIG_IGN)


def reader_gone() -> int:
    """The exit code, once the reader of our output has gone (`<package> plan | head -1`): stdout is
    pointed at /dev/null, so that what is left in its buffer is not flushed into the closed pipe at
    exit (a second BrokenPipeError, with a traceback), and the code is a shell's for a process that
    SIGPIPE ended, as a tool in C would end."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 128 + signal.SIGPIPE


def interrupted_code(exc: KeyboardInterrupt) -> int:
    """128 + the number of the signal that interrupted (Ctrl-C: SIGINT)."""
    return 128 + getattr(exc, "signum", signal.SIGINT)


def how(exc: KeyboardInterrupt) -> str:
    """'interrupted' for Ctrl-C, 'stopped by SIGTERM' for a caught signal."""
    signum = getattr(exc, "signum", signal.SIGINT)
    return "interrupted" if signum == signal.SIGINT else f"stopped by {signal.Signals(signum).name}"
