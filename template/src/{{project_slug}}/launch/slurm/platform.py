"""`launch slurm`: submit launch/slurm/train.sbatch with sbatch; status, logs and cancel of the job.

    <package> launch slurm                                    # submit; prints the job id and its log files
    <package> launch slurm --wait schedule.max_steps=100      # block until the job ends, exit with its status
    <package> launch slurm --partition gpu --sbatch-arg=--nodes=4 --sbatch-arg=--qos=high
    <package> launch slurm --sbatch-arg=--gpus-per-node=0 --sbatch-arg=--cpus-per-task=1 run.device=cpu
    <package> launch slurm --dry-run                          # print the sbatch command and the script
    <package> launch slurm --launcher deepspeed               # launch/slurm/train-deepspeed.sbatch instead
    <package> launch slurm --action status                    # state, nodes, elapsed, requeues, exit code
    <package> launch slurm --action logs --follow             # the job's output file, as it grows
    <package> launch slurm --action cancel [--signal USR1]    # scancel; USR1: save, requeue, continue later

Config overrides (key=value) and --config become the script's arguments; train.sbatch hands them to
`<package> node` on every node (srun, one task per node), which starts torchrun. train-deepspeed.sbatch
(projects generated with strategy deepspeed) runs `deepspeed --launcher slurm`, one srun task per GPU
running `train`. Options given here
override the script's #SBATCH lines. Logs go to <run.output_dir>/slurm/<job name>-<job id>.out
and .err; the folder is created here because Slurm does not create it and a job without it fails
before its first line.

Preemption: both scripts carry --requeue and --signal=USR1@300 (the ranks save before the time limit
and the script requeues the job; launch/slurm/README.md). `--wait` waits for the job to end for good:
sbatch --wait (Slurm 22.05, measured) keeps waiting while a requeued job is pending or runs again,
and returns the final run's exit status; the end line counts the restarts.

Status reads `scontrol show job` (Slurm keeps a job there MinJobAge seconds, 300 by default, after it
ends), then `sacct` where the cluster keeps accounting, then what the project holds of it
(job_history.py: the state last seen, its log, its run folder). Every Slurm client's output is read
as partition.py's slurm_output reads it: bytes that are not UTF-8 do not break it.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from argparse import ArgumentParser, Namespace
from pathlib import Path

from ...planning import storage_paths
from ...runtime import process_exit
from ...settings import optional_parts
from ...settings.bounds import count_in, scheduler_option, signal_name, text_type
from ...settings.config import Config, ConfigError, project_root, under_root
from ...settings.optional_parts import DEEPSPEED_LAUNCHER as LAUNCHER
from .. import code_copy, job_history, jobs
from ..base import Platform, print_file, tail_lines
from ..jobs import Job
from .partition import SLURM_TEXT, partition_problem, requested, slurm_output

SLURM_TIME = re.compile(r"[0-9]{1,6}(:[0-5][0-9]){0,2}|[0-9]{1,4}-[0-9]{1,2}(:[0-5][0-9]){0,2}")
"""Slurm's --time formats: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (minutes and seconds below 60)."""
slurm_time = text_type(
    SLURM_TIME, "a Slurm time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS, e.g. 24:00:00"
)
slurm_name = text_type(
    re.compile(r"[A-Za-z0-9_.-]{1,64}"),
    "letters, digits, '_', '.' and '-' (a Slurm partition or account name), e.g. gpu",
)

SCRIPTS = {
    "torchrun": Path("launch") / "slurm" / "train.sbatch",
    LAUNCHER: Path("launch") / "slurm" / "train-deepspeed.sbatch",
}


def add_arguments(p: ArgumentParser) -> None:
    """Slurm's own options (the verbs and --name/--id/--follow/--dry-run are common to every platform)."""
    p.add_argument(
        "--launcher",
        choices=sorted(SCRIPTS),
        default="torchrun",
        help="torchrun: launch/slurm/train.sbatch, torchrun on every node (default); deepspeed: "
        "launch/slurm/train-deepspeed.sbatch, `deepspeed --launcher slurm` with one task per GPU",
    )
    p.add_argument(
        "--wait",
        action="store_true",
        help="wait for the job to end for good (sbatch --wait; requeues included) and exit with its exit status",
    )
    p.add_argument(
        "--partition", type=slurm_name, help="Slurm partition (default: the script's, else the cluster's default)"
    )
    p.add_argument("--account", type=slurm_name, help="account to charge (default: the script's, else yours)")
    p.add_argument(
        "--time",
        type=slurm_time,
        help="time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (default: the script's)",
    )
    p.add_argument(
        "--sbatch-arg",
        dest="sbatch_args",
        action="append",
        default=[],
        type=scheduler_option,
        metavar="OPTION",
        help="one more sbatch option, written with '=': --sbatch-arg=--nodes=4 (repeatable)",
    )
    p.add_argument(
        "--signal",
        type=signal_name,
        metavar="SIGNAL",
        help="cancel: send this signal instead of ending the job: USR1 saves, requeues and continues "
        "later (the scripts' preemption path); TERM saves and stops",
    )
    code_copy.add_arguments(p)


def log_dir(cfg: Config) -> Path:
    return under_root(cfg.run.output_dir) / "slurm"


SIGNAL_LEAD_SECONDS = 300  # the scripts' --signal=USR1@N for long jobs: see launch/slurm/README.md


def time_limit_seconds(text: str) -> int | None:
    """Slurm's time formats (MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS) in seconds; None if not one."""
    days, _, rest = text.rpartition("-") if "-" in text else ("0", "", text)
    try:
        parts = [int(x) for x in rest.split(":")]
        day_seconds = int(days) * 86400
    except ValueError:
        return None
    if "-" in text:  # D-HH[:MM[:SS]]
        parts += [0] * (3 - len(parts))
    elif len(parts) == 1:  # MM
        parts = [0, parts[0], 0]
    elif len(parts) == 2:  # MM:SS
        parts = [0, *parts]
    if len(parts) != 3:
        return None
    return day_seconds + parts[0] * 3600 + parts[1] * 60 + parts[2]


def signal_option(time_limit: str | None, sbatch_args: list[str]) -> list[str]:
    """A time limit given here replaces the script's: the USR1 warning then follows it (a quarter of a
    limit under 20 min, as the script does for the answered one), unless --signal is given too."""
    seconds = time_limit_seconds(time_limit) if time_limit else None
    if seconds is None or any(a.startswith("--signal") for a in sbatch_args):
        return []
    return [f"--signal=USR1@{min(SIGNAL_LEAD_SECONDS, seconds // 4)}"]


def sbatch_command(args: Namespace, cfg: Config, script: Path) -> list[str]:
    logs = log_dir(cfg)
    # --parsable: the first line of stdout is the job id, printed at once even with --wait.
    cmd = ["sbatch", "--parsable", f"--output={logs}/%x-%j.out", f"--error={logs}/%x-%j.err"]
    for flag in ("partition", "account", "time"):
        if getattr(args, flag):
            cmd.append(f"--{flag}={getattr(args, flag)}")
    if args.name:
        cmd.append(f"--job-name={args.name}")
    time_arg = next((a.partition("=")[2] for a in reversed(args.sbatch_args) if a.startswith("--time=")), args.time)
    cmd += signal_option(time_arg, args.sbatch_args)
    if args.wait:
        cmd.append("--wait")
    cmd += args.sbatch_args  # last: the user's options win over ours
    script_args = (["--config", args.config] if args.config else []) + list(args.overrides)
    return cmd + [str(script)] + script_args


def job_fields(job_id: str) -> dict[str, str]:
    """`scontrol show job` as a dict (JobState, Restarts, NumNodes, NodeList, RunTime, ExitCode, Reason,
    StdOut and StdErr with %x and %j expanded, ...); empty where scontrol does not know the job."""
    out = slurm_output(["scontrol", "show", "job", job_id])
    return parse_job_fields(out.stdout) if out is not None else {}


def parse_job_fields(text: str) -> dict[str, str]:
    """`scontrol show job`'s words KEY=VALUE as a dict (the first of each key; StdOut and StdErr whole)."""
    fields = {}
    for word in text.split():
        key, sep, value = word.partition("=")
        if sep and key not in fields:
            fields[key] = value
    for line in text.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key in ("StdOut", "StdErr"):  # alone on their lines, so a path may hold spaces
            fields[key] = value
    return fields


def final_job_fields(job_id: str, seconds: float = 60.0) -> dict[str, str]:
    """job_fields once Slurm has settled the final state: sbatch --wait returns while the job is still
    COMPLETING (epilog, nodes being freed). After `seconds`, as it is then."""
    deadline = time.monotonic() + seconds
    while (fields := job_fields(job_id)).get("JobState") in SETTLING and time.monotonic() < deadline:
        time.sleep(0.5)
    return fields


def script_path(launcher: str) -> Path:
    """The batch script for the launcher, relative to the project root; ConfigError naming the fix."""
    relative = SCRIPTS[launcher]
    if not (project_root() / relative).is_file():
        if launcher == LAUNCHER and not optional_parts.has_deepspeed():
            raise optional_parts.without_deepspeed("launch slurm --launcher deepspeed", key=None)
        if launcher == LAUNCHER:
            raise ConfigError(
                f"{relative} is missing: it is generated for projects with strategy deepspeed. Fixes: 1) `copier "
                "update --data strategy=deepspeed` generates it; 2) `launch slurm` (torchrun on every node) trains "
                "with any strategy, run.strategy=deepspeed included"
            )
        raise ConfigError(f"{relative} is missing: restore it with `copier update` (or `git checkout {relative}`)")
    return relative


# Job states in which a job may still write to its log; SETTLING the ones after its last step ended.
SETTLING = {"COMPLETING", "STAGE_OUT"}
ACTIVE = SETTLING | set(
    "PENDING CONFIGURING RUNNING REQUEUED REQUEUE_FED REQUEUE_HOLD RESIZING SUSPENDED STOPPED SIGNALING".split()
)


def accounting_fields(job_id: str) -> dict[str, str]:
    """The job's line in `sacct` (clusters with accounting keep jobs after scontrol forgets them); {} without."""
    out = slurm_output(["sacct", "-j", job_id, "-X", "-n", "-P", "-o", ",".join(ACCOUNTING_COLUMNS)])
    return parse_accounting(out.stdout) if out is not None and out.returncode == 0 else {}


ACCOUNTING_COLUMNS = ("JobID", "JobName", "State", "NNodes", "NodeList", "Elapsed", "ExitCode")


def parse_accounting(text: str) -> dict[str, str]:
    """The last of sacct's `-P` lines that is a job's (every column, a state), as a dict; {} without
    (a warning line, a line cut short)."""
    rows = [line.split("|") for line in text.splitlines()]
    jobs = [row for row in rows if len(row) == len(ACCOUNTING_COLUMNS) and row[2].split()]
    return dict(zip(ACCOUNTING_COLUMNS, jobs[-1])) if jobs else {}


def state_words(state: dict[str, str]) -> str | None:
    """A job's state as a record keeps it: RUNNING, or CANCELLED exit 143:0 once it ended."""
    name = state.get("JobState")
    if not name:
        return None
    return name if name in ACTIVE else f"{name} exit {state.get('ExitCode', '?')}"


def require_slurm(program: str) -> None:
    if shutil.which(program) is None:
        raise ConfigError(
            f"{program} is not on PATH: run this on a Slurm login node (or `module load slurm` there); "
            "`launch slurm --dry-run` prints what would be submitted"
        )


def cluster_name() -> str:
    """ClusterName of `scontrol show config`, else this login node's host name."""
    out = slurm_output(["scontrol", "show", "config"])
    found = re.search(r"^ClusterName\s*=\s*(\S+)", out.stdout if out is not None else "", re.M)
    return found.group(1) if found else socket.gethostname()


class Slurm(Platform):
    name = "slurm"
    action_options = {"signal": ("--signal", ("cancel",)), "wait": ("--wait", ("submit",))}
    extra_fields = {"script": str, "stdout": str, "stderr": str, **job_history.RUN_FIELDS}
    add_arguments = staticmethod(add_arguments)

    def _command(self) -> tuple[Path, list[str]]:
        relative = script_path(getattr(self.args, "launcher", "torchrun"))
        return relative, sbatch_command(self.args, self.cfg, relative)

    def _partition_problem(self, relative: Path, cmd: list[str]) -> str | None:
        """What no node of the job's partition can hold (sinfo), before sbatch refuses it in its own words."""
        options, notes = cmd[1 : cmd.index(str(relative))], []
        problem = partition_problem(requested((project_root() / relative).read_text(), options), notes=notes)
        for note in notes:  # sinfo said something no node holds: sbatch judges the request itself
            print(f"warning: {note}", file=sys.stderr)
        return problem

    def _code_copy(self) -> Path | None:
        """The project's copy on shared storage the job runs from (None: the checkout, as submitted)."""
        from_storage, _ = code_copy.ready_image(self.args)
        if self.args.image:
            raise ConfigError(
                "--image: on Slurm the nodes' Python is the image; choose it with PYTHON=/path/to/python in the "
                "environment of `launch slurm` (sbatch passes it on)"
            )
        if not from_storage:
            return None
        # Written from here at submit: a dry run refuses what the submission would fail on.
        storage_paths.require_writable_folder(
            "the project's copy", code_copy.copy_project(self.cfg, dry_run=True).parent
        )
        return code_copy.copy_project(self.cfg, dry_run=self.args.dry_run)

    def dry_run(self) -> int:
        relative, cmd = self._command()
        problem = self._partition_problem(relative, cmd)
        if problem:
            print(f"warning: {problem}", file=sys.stderr)
        copy = self._code_copy()
        if copy is None:
            print(f"$ cd {shlex.quote(str(project_root()))} && {shlex.join(cmd)}")
        else:
            print(f"note: submitting copies the project to {copy}", file=sys.stderr)
            print(f"$ cd {shlex.quote(str(copy))} && CODE_COPY={shlex.quote(str(copy))} {shlex.join(cmd)}")
        print(f"--- {relative}")
        print((project_root() / relative).read_text(), end="")
        return 0

    def submit(self) -> int:
        args, cfg, root = self.args, self.cfg, project_root()
        relative, cmd = self._command()
        require_slurm("sbatch")
        problem = self._partition_problem(relative, cmd)
        if problem:
            raise ConfigError(problem)
        copy = self._code_copy()
        logs = log_dir(cfg)
        try:
            logs.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(
                f"cannot create the log folder {logs} ({exc.strerror}); run.output_dir must lie on "
                "storage this node can write and every compute node can reach"
            ) from None
        print("$ " + shlex.join(cmd), flush=True)
        # From the project root (or its copy): the job's SLURM_SUBMIT_DIR, where the script finds config/
        # and src/. CODE_COPY tells the script to run the copy's node start (sbatch passes the environment on).
        env = {**os.environ, "CODE_COPY": str(copy)} if copy else None
        proc = subprocess.Popen(cmd, cwd=copy or root, env=env, stdout=subprocess.PIPE, **SLURM_TEXT)
        assert proc.stdout is not None
        first = proc.stdout.readline().strip()
        job_id = first.split(";")[0]
        if count_in(job_id) is None:
            code = proc.wait()  # sbatch's own error went to stderr already
            if code == 0:
                print(f"sbatch printed no job id: {first!r}", file=sys.stderr)
            return code or 1
        fields = job_fields(job_id)
        stdout = fields.get("StdOut") or str(logs / f"<job name>-{job_id}.out")
        stderr = fields.get("StdErr") or str(logs / f"<job name>-{job_id}.err")
        job = jobs.new_job(
            self.name,
            job_id,
            name=fields.get("JobName", args.name or ""),
            where=cluster_name(),
            code_copy=str(copy or ""),
            extra={
                "script": str(relative),
                "stdout": stdout,
                "stderr": stderr,
                **job_history.run_fields(cfg, under_root(cfg.run.output_dir)),
            },
        )
        jobs.record(job)
        print(f"submitted job {job_id}\n  log:    {stdout}\n  errors: {stderr}", flush=True)
        if not args.wait:
            print(self.hint(job))
            print(f"  save now and continue later: {self.package} launch slurm --action cancel --signal USR1")
            return proc.wait()
        try:
            code = proc.wait()
        except KeyboardInterrupt as exc:
            proc.terminate()
            print(
                f"\nstopped waiting; job {job_id} goes on (`{self.package} launch slurm --action cancel` ends it)",
                file=sys.stderr,
            )
            return process_exit.interrupted_code(exc)
        end = final_job_fields(job_id)
        state, restarts = end.get("JobState", ""), count_in(end.get("Restarts", "0")) or 0
        print(
            f"job {job_id} ended: exit {code}"
            + (f", {state}" if state else "")
            + (f", after {restarts} requeue(s)" if restarts else ""),
            flush=True,
        )
        if code != 0:
            print(f"--- last lines of {stderr}\n{tail_lines(Path(stderr), 20)}", file=sys.stderr)
        return code

    def job_named(self, job_id: str | None, name: str | None) -> Job | None:
        if job_id:
            return Job(self.name, job_id)
        if name:  # the newest of this user's jobs with that name
            require_slurm("squeue")
            out = slurm_output(["squeue", "--me", "-h", "-n", name, "-o", "%i"])
            if out is None:
                raise ConfigError(
                    f"squeue did not answer within 30 s for the job named {name}; try again, or pass its --id"
                )
            ids = out.stdout.split()
            return Job(self.name, ids[-1], name=name) if ids else None
        return None

    def _state(self, job: Job) -> dict[str, str]:
        """What Slurm says of the job now, in scontrol's field names; {} when it has forgotten it."""
        fields = job_fields(job.id)
        if fields.get("JobId") == job.id:
            return fields
        account = accounting_fields(job.id)
        if not account:
            return {}
        return {
            "JobId": job.id,
            "JobName": account["JobName"],
            "JobState": account["State"].split()[0],
            "NumNodes": account["NNodes"],
            "NodeList": account["NodeList"],
            "RunTime": account["Elapsed"],
            "ExitCode": account["ExitCode"],
            "Restarts": "?",
        }

    def status(self, job: Job) -> int:
        require_slurm("scontrol")
        if job.submitted:
            print(job.describe())
        state = self._state(job)
        if not state:
            log = job.extra.get("stdout")
            return job_history.answer_from_records(
                job,
                f"Slurm no longer knows job {job.id}: it ended more than MinJobAge ago on a cluster without "
                "accounting, or the id is mistyped (`squeue --me` lists your jobs)",
                log=Path(log) if log else None,
                # Records before output_dir was kept: the log lies in <output_dir>/slurm/.
                output_dir=job_history.run_folder(job, Path(log).parent.parent if log else None),
            )
        reason = state.get("Reason", "None")
        ended = state.get("JobState") not in ACTIVE
        print(f"  state:    {state.get('JobState')}" + (f" ({reason})" if reason not in ("None", "") else ""))
        print(f"  nodes:    {state.get('NumNodes', '?')} {state.get('NodeList', '')}".rstrip())
        print(
            f"  elapsed:  {state.get('RunTime', '?')}" + (f" of {state['TimeLimit']}" if state.get("TimeLimit") else "")
        )
        print(f"  requeued: {state.get('Restarts', '0')} time(s)")
        if ended:
            print(f"  exit:     {state.get('ExitCode', '?')} (code:signal)")
        print(f"  log:      {state.get('StdOut') or job.extra.get('stdout', '?')}")
        job_history.remember(job, "status", state_words(state))
        return 0

    def logs(self, job: Job) -> int:
        require_slurm("scontrol")
        state = self._state(job)
        out = state.get("StdOut") or job.extra.get("stdout")
        err = state.get("StdErr") or job.extra.get("stderr")
        if not out:
            raise ConfigError(
                f"job {job.id}: Slurm does not know it and this project has no record of its log "
                f"files; look in {log_dir(self.cfg)}"
            )

        def running() -> bool:
            state.clear()
            state.update(self._state(job))
            return state.get("JobState") in ACTIVE

        watcher = job_history.LogWatcher()
        print(f"--- {out}", file=sys.stderr, flush=True)
        try:
            print_file(Path(out), self.args.follow, running, watcher=watcher)
        except KeyboardInterrupt as exc:
            return process_exit.interrupted_code(exc)
        finally:
            job_history.remember(job, "logs", state_words(state), watcher)
        if err and err != out and Path(err).is_file() and Path(err).stat().st_size:
            print(f"--- {err}", file=sys.stderr, flush=True)
            print_file(Path(err), False, running)
        return 0

    def cancel(self, job: Job) -> int:
        require_slurm("scancel")
        state = self._state(job).get("JobState")
        if state is None:  # plain scancel exits 0 for an id it does not know
            raise ConfigError(
                f"Slurm does not know job {job.id}: check the id (`squeue --me` lists your jobs); a job "
                "that ended long ago needs no cancel"
            )
        if state not in ACTIVE:
            print(f"job {job.id} has ended already ({state}); nothing to cancel")
            return 0
        cmd = ["scancel", *([f"--signal={self.args.signal}"] if self.args.signal else []), job.id]
        print("$ " + shlex.join(cmd), flush=True)
        result = slurm_output(cmd, timeout=60)
        if result is None:
            raise ConfigError(
                f"scancel {job.id} did not answer within 60 s: the job may or may not have been told; "
                f"`{self.package} launch slurm --action status --id {job.id}` says where it stands"
            )
        if result.returncode != 0:
            raise ConfigError(f"scancel {job.id} failed: {result.stderr.strip() or result.stdout.strip()}")
        if self.args.signal:
            sent = f"SIG{self.args.signal.upper().removeprefix('SIG')}"
            print(f"sent {sent} to job {job.id}'s steps")
        else:
            sent = "scancel"
            print(f"cancelled job {job.id}: its ranks get SIGTERM, save at the next step, and the job ends CANCELLED")
        job_history.remember(job, "cancel", f"{sent} sent while {state}")
        return 0


PLATFORM = Slurm
