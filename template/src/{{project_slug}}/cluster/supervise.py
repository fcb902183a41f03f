"""Runs torchrun as a child of `node` / `launch devmachine`, so a preemption ends with a clear
exit code and message instead of torchrun's traceback.

Stop signals (SIGTERM, SIGUSR1, SIGINT, SIGHUP) are passed to torchrun, which passes them to the
ranks (torchrun.STOP_SIGNALS) and gives them cluster.stop_grace_seconds to save. A container's
stop and a shell's `kill` signal only this process, hence the forwarding. A batch scheduler may
signal every process of a job step itself (Topology.signals_every_process); forwarding there would
hand torchrun a second signal while it shuts down, which breaks its grace period, so there this
process only ignores them.

A failure no restart can fix (a ConfigError in a rank: a checkpoint of another model or of other
data, a tokenizer without the special tokens its family needs, run.device=cuda without a GPU, an
output folder in use, a full disk) would meet every restart torchrun makes under --max-restarts. The ranks hand it to this
supervisor instead of failing (unrecoverable.py, TRAIN_FAILURE_FILE); it gives torchrun
FAILURE_GRACE_SECONDS to end by itself (every rank usually meets the same failure), then stops it,
and raises the message as its own ConfigError: one line, printed once, exit 1. Most mistakes never
get that far: torchrun.check_before_start finds them before torchrun starts.

A torchrun killed with SIGKILL signals nobody: its ranks, in sessions of their own, would train on.
The kernel sends them SIGTERM instead (preemption.follow_launcher), and torchrun SIGTERM when this
supervisor dies. While torchrun runs, this process adopts whatever it leaves behind (a child
subreaper): it waits for those ranks to save, logs how each ended, and SIGKILLs any still running
cluster.stop_grace_seconds + FAILURE_GRACE_SECONDS later, as torchrun would have.

Afterwards: preempted.json written during this run (preemption.py) -> exit 143 and a line that
says the checkpoint is saved; otherwise torchrun's own status.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import subprocess
import time
from pathlib import Path

from ..runtime import unrecoverable
from ..settings.config import ConfigError
from ..training.preemption import EXIT_PREEMPTED, SUPERVISOR_PID, adopt_orphans, read_marker, signal_when_parent_dies

FORWARDED = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT, signal.SIGHUP)
FAILURE_GRACE_SECONDS = 10.0
"""After a rank records a failure, how long torchrun may take to end by itself before it is stopped
(ranks that did not meet the failure may be waiting for the others in a collective)."""


def _stop_with_parent(supervisor_pid: int) -> None:
    """In the child: SIGTERM when this supervisor dies (even by SIGKILL), so the ranks still save.
    A supervisor that died before the request took effect leaves the child to init: it ends at once."""
    signal_when_parent_dies(signal.SIGTERM)
    if os.getppid() != supervisor_pid:
        os._exit(EXIT_PREEMPTED)


def signal_group(leader: subprocess.Popen, signum: int) -> bool:
    """Send signum to the process group `leader` leads; whether it was sent. Until the leader is
    reaped its number is held, and after that for as long as the group has members; once they are
    gone the number is free, and a new process given it that leads a group of its own (a shell, a
    daemon) owns that group. So once the leader is reaped, a process holding its number means the
    group is no longer this one: nothing is sent."""
    if leader.returncode is not None and Path(f"/proc/{leader.pid}").exists():
        return False
    try:
        os.killpg(leader.pid, signum)
    except ProcessLookupError:
        return False
    return True


def _wait_for_group(leader: subprocess.Popen, seconds: float) -> None:
    """Until no process of the leader's group is left (the ranks finishing their save), at most `seconds`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if not signal_group(leader, 0):
                return
        except PermissionError:
            pass
        time.sleep(0.2)


def _children() -> set[int]:
    pids: set[int] = set()
    for task in Path(f"/proc/{os.getpid()}/task").glob("*"):
        try:
            pids.update(int(pid) for pid in (task / "children").read_text().split())
        except OSError:
            pass
    return pids


def _end_orphans(own: set[int], seconds: float, log) -> None:
    """Wait for the processes this one adopted (children not in `own`) to end, at most `seconds`,
    then SIGKILL those left, as torchrun would have. Each one's end is logged."""
    deadline = time.monotonic() + seconds
    killed = False
    while orphans := _children() - own:
        for pid in orphans:
            try:
                ended, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                continue
            if not ended:
                continue
            if os.WIFSIGNALED(status):
                how = f"by signal {os.WTERMSIG(status)} ({signal.strsignal(os.WTERMSIG(status))})"
            else:
                how = f"with exit code {os.WEXITSTATUS(status)}"
            log(f"process {pid}, left behind by the launcher, ended {how}")
        if time.monotonic() > deadline and not killed:
            killed = True
            for pid in _children() - own:  # children not reaped yet: their numbers cannot be reused
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        time.sleep(0.2)


def _wait_ending_on_failure(child: subprocess.Popen, failure_path: str, whole_group: bool) -> int:
    """child's exit status. Once a rank has recorded a failure, child gets FAILURE_GRACE_SECONDS to
    end by itself, then SIGTERM: torchrun stops the ranks still waiting for the one that failed;
    a launcher that does not is run with whole_group, and its whole process group is signalled."""
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
                    os.killpg(child.pid, signal.SIGTERM)  # child is not reaped yet: the group is its own
                else:
                    child.terminate()
            except ProcessLookupError:
                pass


def run_supervised(
    cmd: list[str],
    output_dir: str,
    forward_signals: bool,
    log=print,
    whole_group_seconds: float | None = None,
    grace_seconds: float = 30,
) -> int:
    """Run cmd, pass stop signals on, return its status (EXIT_PREEMPTED after a preemption save).
    A failure a rank handed over (unrecoverable.py) is raised here as a ConfigError.

    whole_group_seconds: send the signals to cmd's whole process group, and after cmd exits wait
    up to this long for the rest of the group. For launchers that do not pass signals on
    themselves (one that dies on SIGTERM and leaves its ranks running).
    grace_seconds: how long ranks left by a launcher that was killed may take to save (they get
    SIGTERM from the kernel, preemption.follow_launcher); this process waits for them."""
    started = time.time()
    own_children = _children()
    adopt_orphans(True)
    whole_group = whole_group_seconds is not None and forward_signals
    with unrecoverable.failure_file() as failure_path:
        # A new session keeps a terminal's Ctrl-C (sent to the whole foreground group) from reaching
        # torchrun twice: once from the terminal, once forwarded.
        child = subprocess.Popen(
            cmd,
            env={**os.environ, unrecoverable.FAILURE_FILE: failure_path, SUPERVISOR_PID: str(os.getpid())},
            start_new_session=forward_signals,
            preexec_fn=functools.partial(_stop_with_parent, os.getpid()),
        )

        def on_signal(signum, frame):
            if not forward_signals:
                return
            if whole_group_seconds is not None:
                signal_group(child, signum)
            else:
                child.send_signal(signum)  # Popen sends nothing once it has reaped the child

        previous = {sig: signal.signal(sig, on_signal) for sig in FORWARDED}
        try:
            code = _wait_ending_on_failure(child, failure_path, whole_group)
            if code < 0 or whole_group:  # the launcher died: its ranks, saving, are this process' children now
                _end_orphans(own_children, grace_seconds + FAILURE_GRACE_SECONDS, log)
            if whole_group:  # where no process can adopt (not Linux)
                _wait_for_group(child, whole_group_seconds)
        finally:
            adopt_orphans(False)
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
