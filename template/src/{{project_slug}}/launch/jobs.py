"""Job records: what `launch <platform>` submitted, when, from where, with which image and code (the
commit, and the copy on shared storage it runs with --code-from-storage).

    <project>/.jobs/<platform>.jsonl          one JSON object per submission, newest last

`launch <platform> --action status|logs|cancel` without --id/--name acts on the newest record of
that platform; with them, on the newest record that matches (or, with none, on the job named).
The project folder, not run.output_dir, holds them: a cluster job's output_dir lies on storage
the submitting machine usually does not mount. `git status` ignores .jobs/ (.gitignore).
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..settings.config import project_root
from ..settings.stored_files import read_json_lines, shape_problem, warn

FOLDER = ".jobs"


@dataclass
class Job:
    platform: str
    id: str
    """What the platform calls it: a scheduler's job id, namespace/name of a cluster resource, a
    cloud task id, host:pid of a dev-machine launch."""
    name: str = ""
    submitted: str = ""
    """UTC, ISO 8601."""
    by: str = ""
    """user@host that submitted it."""
    where: str = ""
    """The cluster: an API server, a scheduler's cluster, a cloud region, or the dev machine."""
    image: str = ""
    commit: str = ""
    """git commit of the project when submitted ('-dirty': with uncommitted changes), '' outside git."""
    command: list[str] = field(default_factory=list)
    """The launch command's arguments (options and config overrides)."""
    code_copy: str = ""
    """The project's copy on shared storage the job runs (launch --code-from-storage); '' for the image's code."""
    extra: dict = field(default_factory=dict)
    """What the platform needs to find the job again (a resource's kind and namespace, log paths, ...)."""

    def describe(self) -> str:
        parts = [f"{self.platform} job {self.id}" + (f" ({self.name})" if self.name and self.name != self.id else "")]
        if self.submitted:
            parts.append(f"submitted {self.submitted} by {self.by or '?'} to {self.where or '?'}")
        if self.image:
            parts.append(f"image {self.image}")
        if self.commit:
            parts.append(f"code {self.commit}")
        if self.code_copy:
            parts.append(f"run from {self.code_copy}")
        return "; ".join(parts)


def code_version(root: Path | None = None) -> str:
    """HEAD of the project's git checkout, '-dirty' when files differ from it; '' outside git."""
    root = root or project_root()
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return ""
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def new_job(platform: str, job_id: str, **fields) -> Job:
    """A Job stamped with now, this user and host, the project's commit and this command's arguments."""
    return Job(
        platform=platform,
        id=str(job_id),
        submitted=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        by=f"{getpass.getuser()}@{socket.gethostname()}",
        commit=code_version(),
        command=sys.argv[1:],
        **fields,
    )


def records_path(platform: str) -> Path:
    return project_root() / FOLDER / f"{platform}.jsonl"


def record(job: Job) -> Path | None:
    """Append the job to its platform's records; a read-only project only loses the record (said)."""
    path = records_path(job.platform)
    try:
        path.parent.mkdir(exist_ok=True)
        with open(path, "a+b") as f:  # appends at the end wherever it reads
            end = f.seek(0, os.SEEK_END)
            f.seek(max(end - 1, 0))
            # After a line cut short (no newline at its end), the record starts a line of its own.
            lead = b"\n" if end and f.read(1) != b"\n" else b""
            f.write(lead + json.dumps(asdict(job)).encode() + b"\n")
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        print(f"note: job not recorded in {path} ({exc.strerror}); pass --id {job.id} to the other actions")
        return None
    return path


# What a record holds, checked on reading: a record edited by hand or written by a newer version
# with a field of another type is skipped (said), not acted on.
RECORD_KEYS = {"platform": str, "id": str}
RECORD_OPTIONAL = {name: str for name in ("name", "submitted", "by", "where", "image", "commit", "code_copy")}
RECORD_OPTIONAL.update(command=list, extra=dict)


def read_records(platform: str, extra: dict | None = None) -> list[Job]:
    """Every record of the platform, oldest first; a line that is not a job (a torn write, bytes
    that are not text, JSON of another shape, an `extra` field of another type than the platform's
    `extra` names) is skipped with a warning naming file:line."""

    def extra_problem(data: dict) -> str | None:
        problem = shape_problem(data.get("extra", {}), None, extra)
        return problem and f"in 'extra', {problem}"

    records, warnings = read_json_lines(records_path(platform), RECORD_KEYS, RECORD_OPTIONAL, extra_problem)
    for warning in warnings:
        warn(warning)
    known = set(Job.__dataclass_fields__)
    return [Job(**{k: v for k, v in data.items() if k in known}) for data in records]


def find(platform: str, job_id: str | None = None, name: str | None = None, extra: dict | None = None) -> Job | None:
    """The newest record with this id and/or name (both None: the newest of all); extra: the types
    of the platform's `extra` fields."""
    for job in reversed(read_records(platform, extra)):
        if (job_id is None or job.id == job_id) and (name is None or job.name == name):
            return job
    return None
