"""Which process a recorded pid names: the pid with its start time, the machine's boot and the command line.

    identity = record(os.getpid())     # {"pid": 4242, "start_ticks": 3301, "boot_id": "c4f0...", "cmdline": [...]}
    verdict = check(identity)          # later, maybe after the process ended and its number was reused
    verdict.running                    # True: that same process; False: it ended; None: cannot tell
    verdict.why                        # "pid 4242 is now another process (started ..., `sleep 300`)"
    send_signal(identity, signal.SIGTERM)   # only when check() says running; the verdict either way

A pid alone is not an identity: numbers wrap, and a restarted container numbers from 1 again. Linux
counts a process's start in clock ticks since boot (field 22 of /proc/<pid>/stat); with the boot id
(/proc/sys/kernel/random/boot_id) the pair is never given to two processes, so a signal is sent only
to a process whose pair matches the record.

A record that holds the pid alone (written before start times were kept) is checked with what its
writer knew: the process must have started no later than the record was written (a number reused
afterwards belongs to a process started later) and, where given, its command line must end with the
recorded command. Without the record's time there is no telling: running is None.
"""

from __future__ import annotations

import os
import shlex
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..settings.stored_files import shape_problem

SHAPE = {"pid": int, "start_ticks": int, "boot_id": str, "cmdline": list}
CLOCK_SLACK_SECONDS = 2.0
"""How far a start computed from clock ticks and a record's time in whole seconds may disagree."""


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, start in clock ticks since boot) of pid, or None when there is no such process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()  # the name may hold ")"
    except OSError:
        return None
    return fields[0], int(fields[19])  # fields 3 and 22 of proc(5)


EXEC_SETTLE_SECONDS = 1.0
"""How long an empty command line is read again: a process caught inside exec() (a child whose spawn
has just returned) has no arguments yet, and a kernel thread never has any."""


def _cmdline(pid: int) -> list[str]:
    deadline = time.monotonic() + EXEC_SETTLE_SECONDS
    while True:
        try:
            raw = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return []
        argv = [part.decode(errors="replace") for part in raw.split(b"\0") if part]
        stat = None if argv else _stat(pid)
        if argv or stat is None or stat[0] in "ZX" or time.monotonic() > deadline:
            return argv
        time.sleep(0.01)


def record(pid: int) -> dict:
    """What names pid's process now; {"pid": pid} alone where /proc cannot tell (not Linux, no such pid)."""
    stat, boot_id = _stat(pid), _boot_id()
    if stat is None or boot_id is None:
        return {"pid": pid}
    return {"pid": pid, "start_ticks": stat[1], "boot_id": boot_id, "cmdline": _cmdline(pid)}


def started_at(start_ticks: int) -> float | None:
    """A start in clock ticks since boot as seconds since the epoch (None where /proc/stat has no btime)."""
    try:
        lines = Path("/proc/stat").read_text().splitlines()
        boot = next(float(line.split()[1]) for line in lines if line.startswith("btime "))
    except (OSError, StopIteration, IndexError, ValueError):
        return None
    return boot + start_ticks / os.sysconf("SC_CLK_TCK")


def _command(argv: list[str], limit: int = 120) -> str:
    text = shlex.join(argv) if argv else "?"
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass(frozen=True)
class Verdict:
    running: bool | None
    """True: pid is still the recorded process; False: that process ended; None: there is no telling."""
    why: str
    """What pid is now, as a phrase starting "pid N"."""


def _another(pid: int, start_ticks: int, argv: list[str]) -> Verdict:
    when = started_at(start_ticks)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(when)) if when is not None else "?"
    return Verdict(False, f"pid {pid} is now another process (started {started}, `{_command(argv)}`)")


def check(recorded: Mapping, written_at: float | None = None, command_tail: Sequence[str] = ()) -> Verdict:
    """Whether the process `recorded` (from record()) still runs. written_at (seconds since the epoch)
    and command_tail (what the command line ends with) serve a record that holds the pid alone."""
    pid = recorded.get("pid")
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0:
        return Verdict(None, f"the record names no process (pid {pid!r})")
    stat = _stat(pid)
    if stat is None or stat[0] in "ZX":  # a zombie has ended; only its parent has not read its status yet
        return Verdict(False, f"pid {pid} has exited")
    start_ticks = stat[1]
    argv = _cmdline(pid)
    if set(recorded) - {"pid"}:
        problem = shape_problem(dict(recorded), SHAPE)
        if problem:
            return Verdict(None, f"pid {pid} runs `{_command(argv)}`; its recorded identity {problem}")
        if recorded["boot_id"] != _boot_id():
            return Verdict(False, f"pid {pid} was recorded under another boot of this machine (it restarted since)")
        if recorded["start_ticks"] != start_ticks:
            return _another(pid, start_ticks, argv)
        if recorded["cmdline"] != argv:
            return Verdict(False, f"pid {pid} now runs another program (`{_command(argv)}`)")
        return Verdict(True, f"pid {pid} is the recorded process")
    # The pid alone: a record from before start times were kept.
    if command_tail and argv[-len(command_tail) :] != list(command_tail):
        return _another(pid, start_ticks, argv)
    started = started_at(start_ticks)
    if written_at is None or started is None:
        return Verdict(
            None,
            f"pid {pid} runs `{_command(argv)}`, and its record holds no start time to tell whether it is the same",
        )
    if started > written_at + CLOCK_SLACK_SECONDS:
        return _another(pid, start_ticks, argv)
    return Verdict(True, f"pid {pid} started before its record was written")


def send_signal(
    recorded: Mapping, signum: int, written_at: float | None = None, command_tail: Sequence[str] = ()
) -> Verdict:
    """Send signum to the recorded process where check() says it still runs; the verdict either way
    (running None or False: nothing was sent). Through a pidfd where the kernel has them (Linux 5.3):
    opened before the check, it holds the process checked, so one that ends in between is not
    replaced by a newcomer with its number. PermissionError: another user's process."""
    pid = recorded.get("pid")
    pidfd = None
    if isinstance(pid, int) and pid > 0 and hasattr(os, "pidfd_open"):
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            return Verdict(False, f"pid {pid} has exited")
        except OSError:
            pidfd = None  # an older kernel, or a sandbox without the call: os.kill below
    try:
        verdict = check(recorded, written_at, command_tail)
        if verdict.running:
            try:
                if pidfd is not None:
                    signal.pidfd_send_signal(pidfd, signum)
                else:
                    os.kill(pid, signum)
            except ProcessLookupError:
                return Verdict(False, f"pid {pid} has exited")
        return verdict
    finally:
        if pidfd is not None:
            os.close(pidfd)
