"""Runs torchrun as a child of `node` / `launch devmachine`, so a preemption ends with a clear
exit code and message instead of torchrun's traceback.

Stop signals (SIGTERM, SIGUSR1, SIGINT, SIGHUP) are passed to torchrun, which passes them to the
ranks (topology.STOP_SIGNALS) and gives them cluster.stop_grace_seconds to save. Kubernetes and a
shell's `kill` signal only this process, hence the forwarding. Slurm signals every process of a
step itself; forwarding there would hand torchrun a second signal while it shuts down, which
breaks its grace period, so under Slurm this process only ignores them.

A failure no restart can fix (a ConfigError in a rank: a checkpoint of another model or of other
data, a tokenizer without BERT's tokens, run.device=cuda without a GPU, an output folder in use, a
full disk) would meet every restart torchrun makes under --max-restarts. The ranks hand it to this
supervisor instead of failing (unrecoverable.py, TRAIN_FAILURE_FILE); it gives torchrun
FAILURE_GRACE_SECONDS to end by itself (every rank usually meets the same failure), then stops it,
and raises the message as its own ConfigError: one line, printed once, exit 1. Most mistakes never
get that far: torchrun.check_before_start finds them before torchrun starts.

Afterwards: preempted.json written during this run (preemption.py) -> exit 143 and a line that
says the checkpoint is saved; otherwise torchrun's own status.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import time

from . import unrecoverable
from .config import ConfigError
from .preemption import EXIT_PREEMPTED, read_marker

FORWARDED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1
FAILURE_GRACE_SECONDS = 10.0
"""After a rank records a failure, how long torchrun may take to end by itself before it is stopped
(ranks that did not meet the failure may be waiting for the others in a collective)."""


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


def _wait_ending_on_failure(child: subprocess.Popen, failure_path: str, whole_group: bool) -> int:
    """child's exit status. Once a rank has recorded a failure, child gets FAILURE_GRACE_SECONDS to
    end by itself, then SIGTERM: torchrun stops the ranks still waiting for the one that failed;
    DeepSpeed's runner does not, so with whole_group its whole process group is signalled."""
    stop_at = None
    while True:
        try:
            return child.wait(timeout=0.5)
        except (InterruptedError, subprocess.TimeoutExpired):
            pass
        if stop_at is None and unrecoverable.recorded(failure_path) is not None:
            stop_at = time.monotonic() + FAILURE_GRACE_SECONDS
        elif stop_at is not None and time.monotonic() > stop_at:
            stop_at = float("inf")  # once
            try:
                if whole_group:
                    os.killpg(child.pid, signal.SIGTERM)
                else:
                    child.terminate()
            except ProcessLookupError:
                pass


def run_supervised(
    cmd: list[str], output_dir: str, forward_signals: bool, log=print, whole_group_seconds: float | None = None
) -> int:
    """Run cmd, pass stop signals on, return its status (EXIT_PREEMPTED after a preemption save).
    A failure a rank handed over (unrecoverable.py) is raised here as a ConfigError.

    whole_group_seconds: send the signals to cmd's whole process group, and after cmd exits wait
    up to this long for the rest of the group. For launchers that do not pass signals on
    themselves (DeepSpeed's single-node runner dies on SIGTERM and leaves its ranks running)."""
    started = time.time()
    whole_group = whole_group_seconds is not None and forward_signals
    with unrecoverable.failure_file() as failure_path:
        # A new session keeps a terminal's Ctrl-C (sent to the whole foreground group) from reaching
        # torchrun twice: once from the terminal, once forwarded.
        child = subprocess.Popen(
            cmd,
            env={**os.environ, unrecoverable.FAILURE_FILE: failure_path},
            start_new_session=forward_signals,
            preexec_fn=_stop_with_parent,
        )

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
            code = _wait_ending_on_failure(child, failure_path, whole_group)
            if whole_group:
                _wait_for_group(child.pid, whole_group_seconds)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        failure = unrecoverable.recorded(failure_path)
    if failure is not None:
        raise ConfigError(failure)
    record = read_marker(output_dir, since=started)
    if record is not None:
        log(
            f"preempted by {record['signal']} at step {record['step']}: checkpoint {record['checkpoint']} is saved; "
            f"run the same command again to resume (exit code {EXIT_PREEMPTED})"
        )
        return EXIT_PREEMPTED
    return code if code >= 0 else 128 - code  # killed by a signal: the shell's 128 + number
