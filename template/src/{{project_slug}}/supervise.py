"""Runs torchrun as a child of `node` / `launch devmachine`, so a preemption ends with a clear
exit code and message instead of torchrun's traceback.

Stop signals (SIGTERM, SIGUSR1, SIGINT, SIGHUP) are passed to torchrun, which passes them to the
ranks (topology.STOP_SIGNALS) and gives them cluster.stop_grace_seconds to save. Kubernetes and a
shell's `kill` signal only this process, hence the forwarding. Slurm signals every process of a
step itself; forwarding there would hand torchrun a second signal while it shuts down, which
breaks its grace period, so under Slurm this process only ignores them.

A mistake no restart can fix (a ConfigError in a rank: a checkpoint of another model, a
tokenizer without BERT's tokens, run.device=cuda without a GPU) would meet every restart torchrun
makes under --max-restarts, and each would print it. torchrun restarts on any failing rank, so the
ranks do not fail: they get TRAIN_FATAL_ERROR_FILE, a path in a fresh temporary folder of this
node, where cli.py writes the message (the first rank's wins, through an atomic link) before the
rank exits 0. This supervisor sees the file, gives torchrun FATAL_GRACE_SECONDS to end by itself
(every rank usually meets the same mistake), then stops it, and raises the message as its own
ConfigError: one line, printed once, exit 1. Most such mistakes never get that far:
torchrun.check_before_start finds them before torchrun starts.

Afterwards: preempted.json written during this run (preemption.py) -> exit 143 and a line that
says the checkpoint is saved; otherwise torchrun's own status.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import tempfile
import time

from .config import ConfigError
from .preemption import EXIT_PREEMPTED, read_marker

FORWARDED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)
_PR_SET_PDEATHSIG = 1
FATAL_ERROR_FILE = "TRAIN_FATAL_ERROR_FILE"
FATAL_GRACE_SECONDS = 10.0
"""After a rank reports a mistake, how long torchrun may take to end by itself before it is stopped
(ranks that did not meet the mistake may be waiting for the others in a collective)."""


def hand_to_supervisor(message: str) -> bool:
    """In a rank: record a mistake no restart can fix for the supervisor, which prints it once and
    ends the job. False when there is no supervisor to tell (the caller prints it and fails)."""
    path = os.environ.get(FATAL_ERROR_FILE)
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


def run_supervised(
    cmd: list[str], output_dir: str, forward_signals: bool, log=print, whole_group_seconds: float | None = None
) -> int:
    """Run cmd, pass stop signals on, return its status (EXIT_PREEMPTED after a preemption save).

    whole_group_seconds: send the signals to cmd's whole process group, and after cmd exits wait
    up to this long for the rest of the group. For launchers that do not pass signals on
    themselves (DeepSpeed's single-node runner dies on SIGTERM and leaves its ranks running)."""
    started = time.time()
    fatal_dir = tempfile.mkdtemp(prefix="train-fatal-")
    fatal_file = os.path.join(fatal_dir, "error")
    # A new session keeps a terminal's Ctrl-C (sent to the whole foreground group) from reaching
    # torchrun twice: once from the terminal, once forwarded.
    child = subprocess.Popen(
        cmd,
        env={**os.environ, FATAL_ERROR_FILE: fatal_file},
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
    stop_at = None  # when a reported mistake has given torchrun long enough to end by itself
    try:
        while True:
            try:
                code = child.wait(timeout=0.5)
                break
            except (InterruptedError, subprocess.TimeoutExpired):
                pass
            if stop_at is None and os.path.exists(fatal_file):
                stop_at = time.monotonic() + FATAL_GRACE_SECONDS
            elif stop_at is not None and time.monotonic() > stop_at:
                # torchrun stops the ranks still waiting for the reporting one; DeepSpeed's runner
                # does not, so its whole group is signalled
                if whole_group_seconds is not None and forward_signals:
                    os.killpg(child.pid, signal.SIGTERM)
                else:
                    child.terminate()
                stop_at = float("inf")
        if whole_group_seconds is not None and forward_signals:
            _wait_for_group(child.pid, whole_group_seconds)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        try:
            with open(fatal_file) as f:
                fatal = f.read()
        except OSError:
            fatal = None
        shutil.rmtree(fatal_dir, ignore_errors=True)
    if fatal is not None:
        raise ConfigError(fatal)
    record = read_marker(output_dir, since=started)
    if record is not None:
        log(
            f"preempted by {record['signal']} at step {record['step']}: checkpoint {record['checkpoint']} is saved; "
            f"run the same command again to resume (exit code {EXIT_PREEMPTED})"
        )
        return EXIT_PREEMPTED
    return code if code >= 0 else 128 - code  # killed by a signal: the shell's 128 + number
