"""One run per output folder: output_dir/run.lock names the run that writes there, and a second run
refuses to start, saying who holds it and how to remove a stale lock.

    {"job": "torchrun run 3f2a", "host": "gpu-07", "pid": 5120, "started": 1764000000.0, "command": "..."}

Who takes it: the node supervisor of node 0 (torchrun.py) before torchrun starts, held until torchrun
ends, across its restarts; the other nodes only check it. Global rank 0 of `train` takes it where
no supervisor did (torchrun, mpirun, a scheduler's own ranks or another launcher run by hand). A job
re-enters its own lock: a restart carries the same job identity (job_identity: the scheduler's job,
the platform's rendezvous address, torchrun's run id, or the supervisor that exports it to its
ranks). Another run is refused unless the holder is gone: on the same machine its process no longer
exists; elsewhere the lock's heartbeat (its mtime, touched every minute) is older than STALE_AFTER.
The lock file is created complete (written aside, then hard-linked into place, which fails when it
exists), so two runs starting at the same moment cannot both take it.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from ..settings.config import ConfigError
from ..settings.stored_files import DamagedFile, read_json
from ..settings.topology import platform_answers

LOCK_NAME = "run.lock"
IDENTITY = "TRAIN_JOB_IDENTITY"  # the supervisor's job identity, exported to the ranks it starts
HEARTBEAT = 60.0
STALE_AFTER = 600.0


class FolderInUse(ConfigError):
    """Another live run holds the output folder."""


def job_identity(env: Mapping[str, str], topo=None) -> str | None:
    """What stays the same across the restarts of one job and differs between jobs; None where
    nothing does (one process started by hand: the holder's own process is then its identity)."""
    if env.get(IDENTITY):
        return env[IDENTITY]
    for identity in platform_answers("job_identity", env, topo):  # a scheduler's job id, kept by a requeue
        return identity
    if topo is not None and (topo.nnodes > 1 or topo.platform != "devmachine"):
        # A restarted pod or instance, or the other nodes of a devmachine job, meet at the same address.
        return f"{topo.platform} job at {topo.master_addr}:{topo.master_port}"
    run_id = env.get("TORCHELASTIC_RUN_ID", "")
    if run_id and run_id != "none":  # torchrun's --rdzv-id (a fresh one per --standalone torchrun)
        return f"torchrun run {run_id}"
    return None


def _machine() -> str:
    """This machine and pid namespace: where a pid means the same process."""
    parts = [socket.gethostname()]
    for path in ("/proc/sys/kernel/random/boot_id", "/proc/self/ns/pid"):
        try:
            parts.append(os.readlink(path) if path.endswith("/pid") else Path(path).read_text().strip())
        except OSError:
            pass
    return " ".join(parts)


def _process_start(pid: int) -> str | None:
    """When process pid started (clock ticks since boot), or None if there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return ""


def _record(identity: str | None) -> dict:
    pid = os.getpid()
    return {
        "job": identity or f"pid {pid} on {socket.gethostname()}",
        "host": socket.gethostname(),
        "pid": pid,
        "pid_start": _process_start(pid),
        "machine": _machine(),
        "started": time.time(),
        "command": shlex.join(sys.argv),
    }


# The fields a lock (and job.json) may hold; one of another type makes the record damaged.
RECORD_FIELDS = {"job": str, "host": str, "pid": int, "pid_start": (str, None), "machine": str, "started": float}
RECORD_FIELDS.update(command=str)


def _read(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        return read_json(path, fix="it is taken as released", optional=RECORD_FIELDS)
    except DamagedFile:
        return None if not path.exists() else {}  # damaged: treated as a holder that is gone


def gone(record: dict, path: Path) -> str | None:
    """Why the holder of a lock is no longer running, or None while it may be."""
    if record.get("machine") == _machine():
        pid = int(record.get("pid") or 0)
        start = _process_start(pid) if pid > 0 else None
        if start is None:
            return f"its process {record.get('pid')} no longer exists"
        if start and record.get("pid_start") and start != record["pid_start"]:
            return f"its process {record.get('pid')} no longer exists (the pid is reused)"
        return None
    try:
        age = time.time() - path.stat().st_mtime
    except FileNotFoundError:
        return "it was released"
    if not record.get("pid") or age > STALE_AFTER:
        return f"its heartbeat stopped {age / 60:.0f} minutes ago"
    return None


def _refusal(record: dict, path: Path) -> FolderInUse:
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(record.get("started", 0)))
    try:
        beat = f"{time.time() - path.stat().st_mtime:.0f} s ago"
    except OSError:
        beat = "unknown"
    if record.get("machine") == _machine():
        way_out = "Wait for it to end or give this run another run.output_dir"  # the lock goes with its process
    else:
        way_out = (
            f"Wait for it to end or give this run another run.output_dir; if that run is gone, delete {path} "
            f"(taken over by itself once its heartbeat is {STALE_AFTER / 60:.0f} minutes old)"
        )
    return FolderInUse(
        f"{path.parent} is in use by another run: {record.get('job')} (pid {record.get('pid')} on "
        f"{record.get('host')}, started {started}, last heartbeat {beat}). {way_out}",
        key="run.output_dir",
    )


class RunLock:
    """A held (owned) lock, or a visit under another holder of the same job (not owned). job: this
    process's job identity."""

    def __init__(self, path: Path, record: dict, owned: bool, job: str, made_folder: bool = False):
        self.path, self.record, self.owned, self.job = path, record, owned, job
        self.made_folder = made_folder  # acquire created the output folder for this run
        self._stop = threading.Event()
        if owned:
            threading.Thread(target=self._beat, name="run-lock-heartbeat", daemon=True).start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT):
            if _read(self.path) != self.record:
                return  # broken as stale by someone else: theirs now
            try:
                os.utime(self.path)
            except OSError:
                pass

    def release(self) -> None:
        self._stop.set()
        if self.owned and _read(self.path) == self.record:
            self.path.unlink(missing_ok=True)
            if self.made_folder and not any(self.path.parent.iterdir()):
                self.path.parent.rmdir()  # a run refused before its first write leaves no empty folder
        self.owned = False

    def __enter__(self) -> RunLock:
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _create(path: Path, record: dict) -> bool:
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(record) + "\n")
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)


def _break(path: Path, record: dict) -> None:
    """Remove a stale lock, unless someone replaced it meanwhile (then put theirs back)."""
    aside = path.with_name(f".{path.name}.stale-{os.getpid()}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    if _read(aside) != record:
        try:
            os.link(aside, path)
        except FileExistsError:
            pass
    aside.unlink(missing_ok=True)


def acquire(output_dir: str | Path, identity: str | None, write: bool = True, take_over_job: bool = False) -> RunLock:
    """Hold output_dir for this job, or FolderInUse naming the live holder of another job.

    write=False: only check (the supervisors of nodes other than 0). take_over_job: become the holder
    even where a live process of this same job holds it (a restarted supervisor: the other one
    belongs to the attempt that ended)."""
    path = Path(output_dir) / LOCK_NAME
    made_folder = write and not path.parent.exists()
    if write:
        path.parent.mkdir(parents=True, exist_ok=True)
    mine = _record(identity)
    for _ in range(10):
        if write and _create(path, mine):
            return RunLock(path, mine, owned=True, job=mine["job"], made_folder=made_folder)
        held = _read(path)
        if held is None:
            if not write:
                return RunLock(path, {}, owned=False, job=mine["job"])
            continue
        reason = gone(held, path) if held else "its lock file is unreadable"
        if held.get("job") == mine["job"] and not (write and (take_over_job or reason)):
            return RunLock(path, held, owned=False, job=mine["job"])  # the job's own holder is alive: enter
        if reason is None and held.get("job") != mine["job"]:
            raise _refusal(held, path)
        if not write:
            return RunLock(path, held, owned=False, job=mine["job"])
        if held.get("job") != mine["job"]:
            print(f"taking over {path} from {held.get('job')}: {reason}", file=sys.stderr, flush=True)
        _break(path, held)
    raise _refusal(_read(path) or {}, path)


# The job that last started training in a folder: a restart of that job continues its own run even
# under checkpoint.resume=false (which refuses only an earlier run of another job).
JOB_RECORD = "job.json"


def record_job(output_dir: str | Path, job: str) -> None:
    path = Path(output_dir) / JOB_RECORD
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps({"job": job, "host": socket.gethostname(), "started": time.time()}) + "\n")
    os.replace(tmp, path)


def last_job(output_dir: str | Path) -> str | None:
    return (_read(Path(output_dir) / JOB_RECORD) or {}).get("job")
