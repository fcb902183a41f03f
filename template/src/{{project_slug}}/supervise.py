"""Runs torchrun as a child of `node` / `launch devmachine`, so a preemption ends with a clear
exit code and message instead of torchrun's traceback.

Stop signals (SIGTERM, SIGUSR1, SIGINT, SIGHUP) are passed to torchrun, which passes them to the
ranks (topology.STOP_SIGNALS) and gives them cluster.stop_grace_seconds to save. Kubernetes and a
shell's `kill` signal only this process, hence the forwarding. Slurm signals every process of a
step itself; forwarding there would hand torchrun a second signal while it shuts down, which
breaks its grace period, so under Slurm this process only ignores them.

Afterwards: preempted.json written during this run (preemption.py) -> exit 143 and a line that
says the checkpoint is saved; a failure a restart cannot fix, which a rank wrote to the file named
by TRAIN_FAILURE_FILE (unrecoverable.py) -> its one line and exit 1; otherwise torchrun's own status.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import unrecoverable
from .preemption import EXIT_PREEMPTED, read_marker

FORWARDED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)
FAILURE_GRACE = 20.0
"""Seconds the ranks get to end by themselves after one of them recorded a failure (they all do
when the failure is one every rank knows of); then the child is told to stop."""
_PR_SET_PDEATHSIG = 1


def _stop_with_parent() -> None:
    """In the child: SIGTERM when this supervisor dies (even by SIGKILL), so the ranks still save."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        pass  # not Linux: no parent-death signal, nothing else changes


def _wait_for_group(pgid: int, seconds: float) -> None:
    """Until no process of the group is left (the ranks finishing their save), at most `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        except PermissionError:
            pass
        time.sleep(0.2)


def _wait_ending_on_failure(child: subprocess.Popen, failure_file: str) -> int:
    """child's exit status; once a rank has recorded a failure, child gets FAILURE_GRACE seconds
    to end by itself before it is sent SIGTERM (its ranks would otherwise wait in a collective)."""
    recorded = None
    while True:
        try:
            return child.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            if recorded is None and unrecoverable.read(failure_file):
                recorded = time.monotonic()
            if recorded is not None and time.monotonic() - recorded > FAILURE_GRACE:
                child.send_signal(signal.SIGTERM)
                recorded = float("inf")  # once
        except InterruptedError:
            continue


def run_supervised(
    cmd: list[str], output_dir: str, forward_signals: bool, log=print, whole_group_seconds: float | None = None
) -> int:
    """Run cmd, pass stop signals on, return its status (EXIT_PREEMPTED after a preemption save).

    whole_group_seconds: send the signals to cmd's whole process group, and after cmd exits wait
    up to this long for the rest of the group. For launchers that do not pass signals on
    themselves (DeepSpeed's single-node runner dies on SIGTERM and leaves its ranks running)."""
    started = time.time()
    fd, failure_file = tempfile.mkstemp(prefix="train-failure-")
    os.close(fd)
    env = {**os.environ, unrecoverable.FAILURE_FILE: failure_file}
    # A new session keeps a terminal's Ctrl-C (sent to the whole foreground group) from reaching
    # torchrun twice: once from the terminal, once forwarded.
    child = subprocess.Popen(cmd, start_new_session=forward_signals, preexec_fn=_stop_with_parent, env=env)

    def on_signal(signum, frame):
        if not forward_signals:
            return
        try:
            if whole_group_seconds is not None:
                os.killpg(child.pid, signum)
            elif child.poll() is None:
                child.send_signal(signum)
        except ProcessLookupError:
            pass

    previous = {sig: signal.signal(sig, on_signal) for sig in FORWARDED}
    try:
        code = _wait_ending_on_failure(child, failure_file)
        if whole_group_seconds is not None and forward_signals:
            _wait_for_group(child.pid, whole_group_seconds)
        failure = unrecoverable.read(failure_file)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        Path(failure_file).unlink(missing_ok=True)
    if failure:
        print(f"error: {failure}", file=sys.stderr, flush=True)
        return 1
    record = read_marker(output_dir, since=started)
    if record is not None:
        log(
            f"preempted by {record['signal']} at step {record['step']}: checkpoint {record['checkpoint']} is saved; "
            f"run the same command again to resume (exit code {EXIT_PREEMPTED})"
        )
        return EXIT_PREEMPTED
    return code if code >= 0 else 128 - code  # killed by a signal: the shell's 128 + number
