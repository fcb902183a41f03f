"""The interface every platform module implements, and the options all of them share.

    <package> launch <platform> [--dry-run] [key=value ...]          # submit (--dry-run: the exact request)
    <package> launch <platform> --action status|logs|cancel [--id ID | --name NAME] [--follow]

A platform is a subclass of Platform in launch/<platform>/platform.py: `submit` starts the job and
records it (jobs.py), `dry_run` prints what submit would send and nothing else, `status`, `logs` and
`cancel` act on a Job (the newest record by default). `job_named` turns --id/--name into a Job when
no record matches: a job submitted elsewhere can be watched too. Adding a platform is one folder
(launch/__init__.py finds it by its PLATFORM): its platform.py, its environment.py (the rows of
settings/topology.py for its variables), its README part (README.md.jinja) and its tests.
"""

from __future__ import annotations

import sys
import time
from argparse import ArgumentParser, BooleanOptionalAction, Namespace
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

from ..settings.bounds import job_name
from ..settings.config import Config, ConfigError
from . import jobs
from .job_history import LogWatcher
from .jobs import Job

ACTIONS = ("submit", "status", "logs", "cancel")


def add_common_arguments(p: ArgumentParser) -> None:
    p.add_argument(
        "--action",
        choices=ACTIONS,
        default="submit",
        help="submit the job (default), or print its status, show its logs, cancel it",
    )
    p.add_argument(
        "--id",
        dest="job_id",
        metavar="ID",
        help="status/logs/cancel: the job to act on (default: the last one this project submitted)",
    )
    p.add_argument("--name", type=job_name, help="submit: the new job's name; status/logs/cancel: pick the job by name")
    p.add_argument(
        "--follow",
        action=BooleanOptionalAction,
        default=False,
        help="logs: keep printing new lines until the job ends (Ctrl-C stops watching, not the job)",
    )
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the exact request (command line, manifest or API request) and submit nothing",
    )


class Platform:
    """One platform's verbs. Subclasses set `name` and override what they support."""

    name: ClassVar[str]
    action_options: ClassVar[dict[str, tuple[str, tuple[str, ...]]]] = {}
    """{dest: (option, the actions it serves)} of the platform's own options that only some actions
    read; given with another action it is refused, not ignored."""
    extra_fields: ClassVar[dict] = {}
    """The types of what the platform keeps in a job record's `extra`: a record with another is skipped."""
    needs_launch_files: ClassVar[bool] = True
    """Whether the project must hold launch/<name>/ (generated only for the chosen platforms)."""

    def __init__(self, cfg: Config, args: Namespace, package: str):
        self.cfg, self.args, self.package = cfg, args, package

    @staticmethod
    def add_arguments(p: ArgumentParser) -> None:
        """The platform's own options (the common ones come from add_common_arguments)."""

    # --- the verbs -------------------------------------------------------------------------------
    def dry_run(self) -> int:
        raise NotImplementedError

    def submit(self) -> int:
        raise NotImplementedError

    def status(self, job: Job) -> int:
        raise NotImplementedError

    def logs(self, job: Job) -> int:
        raise NotImplementedError

    def cancel(self, job: Job) -> int:
        raise NotImplementedError

    # --- finding the job -------------------------------------------------------------------------
    def job_named(self, job_id: str | None, name: str | None) -> Job | None:
        """A Job for --id/--name when no record matches (None: the platform cannot find it by that)."""
        return Job(self.name, job_id) if job_id else None

    def default_job(self) -> Job | None:
        """The job to act on when none was recorded or named (a platform may name one: its manifest's); None: refuse."""
        return None

    def pick_job(self) -> Job:
        job_id, name = self.args.job_id, self.args.name
        job = jobs.find(self.name, job_id, name, self.extra_fields)
        if job is None and (job_id or name):
            job = self.job_named(job_id, name)
        if job is None and not (job_id or name):
            job = self.default_job()
        if job is None:
            given = " ".join(f"{flag} {value}" for flag, value in (("--id", job_id), ("--name", name)) if value)
            if given:
                raise ConfigError(
                    f"no {self.name} job {given} recorded in {jobs.records_path(self.name)}; "
                    f"pass the id the platform gave it (--id)"
                )
            raise ConfigError(
                f"no {self.name} job submitted from this project yet (none recorded in "
                f"{jobs.records_path(self.name)}): submit one with `{self.package} launch {self.name}`, "
                "or pass --id of a job submitted elsewhere"
            )
        return job

    def hint(self, job: Job) -> str:
        """The three follow-up commands, printed after a submission."""
        pick = f" --id {job.id}" if jobs.find(self.name, extra=self.extra_fields) != job else ""
        return "\n".join(
            f"  {action + ':':<8} {self.package} launch {self.name} --action {action}{pick}"
            + (" --follow" if action == "logs" else "")
            for action in ("status", "logs", "cancel")
        )


COMMON_ACTION_OPTIONS = {"job_id": ("--id", ("status", "logs", "cancel")), "follow": ("--follow", ("logs",))}


def require_options_for(platform: Platform) -> None:
    """An option the action does not read (`--id` with a submit, `--follow` with status) is a
    mistake to name, not a value to drop without a word."""
    action = platform.args.action
    for dest, (option, actions) in {**COMMON_ACTION_OPTIONS, **platform.action_options}.items():
        if action not in actions and getattr(platform.args, dest, None) not in (None, False):
            raise ConfigError(
                f"{option} is for --action {'/'.join(actions)}, not {action}; leave it out or add --action {actions[0]}"
            )


def run(platform: Platform) -> int:
    """Carry out args.action on the platform."""
    require_options_for(platform)
    action = platform.args.action
    if action == "submit":
        return platform.dry_run() if platform.args.dry_run else platform.submit()
    job = platform.pick_job()
    if platform.args.dry_run:
        print(f"would {action} {job.describe()}")
        return 0
    return getattr(platform, action)(job)


# --- shared by the platforms whose logs are files -------------------------------------------------


def tail_lines(path: Path, count: int) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-count:])
    except OSError:
        return ""


def print_file(
    path: Path, follow: bool, running: Callable[[], bool], poll_seconds: float = 2.0, watcher: LogWatcher | None = None
) -> None:
    """Print a log file; with follow, keep printing what is appended while running() says so (and
    once more after it ends, for the last lines). A file that does not exist yet is waited for.
    The watcher, if given, sees every chunk printed."""
    offset = 0
    while True:
        alive = running() if follow else False
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                chunk = f.read()
                offset += len(chunk)
        except FileNotFoundError:
            chunk = b""
        if chunk:
            text = chunk.decode("utf-8", errors="replace")
            sys.stdout.write(text)
            sys.stdout.flush()
            if watcher is not None:
                watcher.feed(text)
        if not alive:
            return
        time.sleep(poll_seconds)
