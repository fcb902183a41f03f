"""Preemption: SIGTERM or SIGUSR1 asks the job to save at the next logging step, then exit.

Who sends them: a container platform on pod deletion (SIGTERM, then SIGKILL after the grace
period), a batch scheduler before the time limit (a warning signal, USR1 as the launch scripts ask)
and on a cancel or requeue (SIGTERM), a cloud training service when a task is stopped, torchrun when
it is told to stop (it forwards the signal to every rank and kills them `cluster.stop_grace_seconds`
later).

A signal may reach only some ranks, so every rank sets a local flag and the ranks agree (one
all-reduce of two numbers on a CPU group) at each logging or checkpoint step (train.py): all of them
save the same step and leave together. Only those steps, which wait for the device anyway, hold the
agreement, so the steps between them keep the host queueing work ahead; the price is the reaction
time, at most logging.every_steps steps. Where steps are slow (a 13B model: a minute each) that
would outlast cluster.stop_grace_seconds, so each agreement also carries the slowest rank's seconds
per step, and all ranks agree again after stop_wait_steps steps (planning/estimates.py): fewer than
logging.every_steps when those would take over a quarter of the grace; the first agreement comes
after the run's first step, which times it. Every rank derives the same next step from the same
reduced numbers.
Rank 0 then records output_dir/preempted.json, which the node supervisor reads to exit with
EXIT_PREEMPTED instead of torchrun's generic failure.

A launcher killed with SIGKILL (the OOM killer, `kill -9`, a node agent) cannot pass a signal on,
and torchrun starts its ranks in sessions of their own: they would train on and hold the GPUs.
So each rank asks the kernel for SIGTERM when its launcher dies (follow_launcher): the ranks save
as above, and since nobody is left to kill them after cluster.stop_grace_seconds, they set an
alarm for it themselves (a peer on a dead node can hold a collective until its timeout).
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from ..planning.estimates import stop_wait_steps
from ..runtime import process_exit
from ..settings.optional_parts import OTHER_LAUNCHERS
from ..settings.stored_files import DamagedFile, read_json, warn

EXIT_PREEMPTED = 143
"""128 + SIGTERM: what a container platform or a batch scheduler shows for a job stopped by a signal,
and a code an operator's `restartPolicy: ExitCode` retries. preempted.json says a checkpoint was saved."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
MARKER = "preempted.json"
SUPERVISOR_PID = "TRAIN_SUPERVISOR_PID"
"""The node supervisor's pid (supervise.py), for the ranks below it."""
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_PR_SET_CHILD_SUBREAPER = 36
_launcher_pid: int | None = None
"""The parent pid this rank started under, once follow_launcher ran; another parent means it died."""


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value)
    except (OSError, AttributeError):
        pass  # not Linux: nothing changes


def signal_when_parent_dies(signum: int) -> None:
    """The kernel sends signum to this process when the thread that started it ends, even by SIGKILL
    (the launchers here start their children from their main thread)."""
    _prctl(_PR_SET_PDEATHSIG, signum)


def adopt_orphans(adopt: bool) -> None:
    """Whether processes below this one whose parent dies become this one's children instead of
    init's, so that it can wait for them (the ranks of a torchrun killed with SIGKILL, saving)."""
    _prctl(_PR_SET_CHILD_SUBREAPER, int(adopt))


def follow_launcher(env: Mapping[str, str]) -> None:
    """In a rank of torchrun (TORCHELASTIC_RUN_ID) or of another launcher under the supervisor: SIGTERM
    when the launcher dies. Called before torch is imported. A launcher that died before this has left
    the rank to the supervisor (a subreaper) or to init: then the rank ends at once, it has nothing new
    to save. Other processes (`train` from a shell, ranks mpirun or a scheduler started) are left alone."""
    global _launcher_pid
    if "TORCHELASTIC_RUN_ID" not in env and SUPERVISOR_PID not in env:
        return
    _launcher_pid = os.getppid()
    signal_when_parent_dies(signal.SIGTERM)
    adopted = str(_launcher_pid) == env.get(SUPERVISOR_PID) or (_launcher_pid == 1 and not _init_is_a_launcher())
    if adopted:
        os.kill(os.getpid(), signal.SIGTERM)


def _init_is_a_launcher() -> bool:
    """Whether pid 1 is torchrun or another launcher itself (a container started with it)."""
    try:
        cmdline = Path("/proc/1/cmdline").read_bytes()
    except OSError:
        return True  # cannot tell: do not end a rank that may be fine
    names = ("torch", *OTHER_LAUNCHERS, __name__.partition(".")[0])
    return any(name.encode() in cmdline for name in names)


def launcher_gone() -> bool:
    return _launcher_pid is not None and os.getppid() != _launcher_pid


class StopRequest:
    """Catches STOP_SIGNALS in this process; `agreed()` tells every rank whether any rank got one."""

    def __init__(self, grace_seconds: float = 0, every_steps: int = 1):
        """Collective when a process group exists (every rank constructs it at the same point).
        grace_seconds: once the launcher is gone, how long the save may take before SIGALRM ends the
        rank; with every_steps (logging.every_steps), how often the ranks agree (stop_wait_steps)."""
        import torch.distributed as dist

        self.signal_name: str | None = None
        self.grace_seconds = grace_seconds
        self.every_steps = every_steps
        self.next_agreement = math.inf  # start() and then each agreement set it
        self._since: tuple[float, int] | None = None
        self.alarm_set = False
        # The flag travels over a CPU (Gloo) group: reading it waits for the other ranks, never for the GPU.
        self.group = None
        if dist.is_initialized() and dist.get_backend() != "gloo":
            self.group = dist.new_group(backend="gloo")
            process_exit.joined_group(self.group)
        if threading.current_thread() is threading.main_thread():  # a platform's trainer may run us in a thread
            for sig in STOP_SIGNALS:
                signal.signal(sig, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        self.signal_name = signal.Signals(signum).name
        if launcher_gone() and not self.alarm_set:
            # SIGALRM's default action ends the process even inside a collective that never returns.
            signal.alarm(max(1, math.ceil(self.grace_seconds)))
            self.alarm_set = True

    def start(self, step: int) -> None:
        """The loop begins at `step`. The ranks first agree after its first step, which times it: a
        first logging step ten minute-long steps away would leave a stop unheard until then."""
        self._since = (time.monotonic(), step)
        self.next_agreement = step + 1

    def due(self, step: int) -> bool:
        """Whether `step` is one the ranks agree at besides logging and checkpoint steps (slow steps)."""
        return step >= self.next_agreement

    def agreed(self, step: int) -> bool:
        """Collective: True on every rank when any rank caught a stop signal. Every rank has to call
        it at the same steps: train.py calls it at logging and checkpoint steps, and where due()."""
        import torch  # here, not at the top: the launchers read the marker without torch
        import torch.distributed as dist

        now = time.monotonic()
        since, first = self._since or (now, step)
        seconds_per_step = (now - since) / (step - first) if step > first else 0.0
        flags = torch.tensor([1.0 if self.signal_name else 0.0, seconds_per_step], dtype=torch.float64)
        if dist.is_initialized():
            dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.group)
        stopped, slowest = flags.tolist()
        self._since = (now, step)
        self.next_agreement = step + stop_wait_steps(slowest, self.every_steps, self.grace_seconds)
        return bool(stopped)


def marker_path(output_dir: str | Path) -> Path:
    return Path(output_dir) / MARKER


def clear_marker(output_dir: str | Path) -> None:
    marker_path(output_dir).unlink(missing_ok=True)


def write_marker(output_dir: str | Path, step: int, signal_name: str | None, checkpoint: str) -> None:
    path = marker_path(output_dir)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(
        json.dumps(
            {"step": step, "signal": signal_name or "from another rank", "checkpoint": checkpoint, "time": time.time()}
        )
        + "\n"
    )
    os.replace(tmp, path)


MARKER_KEYS = {"step": int, "signal": str, "checkpoint": str, "time": float}


def read_marker(output_dir: str | Path, since: float) -> dict | None:
    """The record of a preemption save that happened after `since` (a time.time() value)."""
    path = marker_path(output_dir)
    if not path.is_file():
        return None
    try:
        record = read_json(path, fix="the stop is reported as a failure", keys=MARKER_KEYS)
    except DamagedFile as exc:
        warn(str(exc))
        return None
    return record if record["time"] >= since else None
