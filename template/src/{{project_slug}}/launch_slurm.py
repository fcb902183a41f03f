"""`launch slurm`: submit launch/slurm/train.sbatch with sbatch.

    <package> launch slurm                                    # submit; prints the job id and its log files
    <package> launch slurm --wait schedule.max_steps=100      # block until the job ends, exit with its status
    <package> launch slurm --partition gpu --sbatch-arg=--nodes=4 --sbatch-arg=--qos=high
    <package> launch slurm --sbatch-arg=--gpus-per-node=0 --sbatch-arg=--cpus-per-task=1 run.device=cpu
    <package> launch slurm --dry-run                          # print the sbatch command and the script
    <package> launch slurm --launcher deepspeed               # launch/slurm/train-deepspeed.sbatch instead

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
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from argparse import ArgumentParser, Namespace
from pathlib import Path

from .config import Config, ConfigError
from .node import project_root

SCRIPTS = {
    "torchrun": Path("launch") / "slurm" / "train.sbatch",
    "deepspeed": Path("launch") / "slurm" / "train-deepspeed.sbatch",
}
SCRIPT = SCRIPTS["torchrun"]


def add_arguments(p: ArgumentParser) -> None:
    p.add_argument("--launcher", choices=sorted(SCRIPTS), default="torchrun",
                   help="torchrun: launch/slurm/train.sbatch, torchrun on every node (default); deepspeed: "
                        "launch/slurm/train-deepspeed.sbatch, `deepspeed --launcher slurm` with one task per GPU")
    p.add_argument("--wait", action="store_true",
                   help="wait for the job to end for good (sbatch --wait; requeues included) and exit with its "
                        "exit status")
    p.add_argument("--partition", help="Slurm partition (default: the script's, else the cluster's default)")
    p.add_argument("--account", help="account to charge (default: the script's, else yours)")
    p.add_argument("--time", help="time limit, HH:MM:SS or D-HH:MM:SS (default: the script's)")
    p.add_argument("--sbatch-arg", dest="sbatch_args", action="append", default=[], metavar="OPTION",
                   help="one more sbatch option, written with '=': --sbatch-arg=--nodes=4 (repeatable)")


def log_dir(cfg: Config) -> Path:
    out = Path(cfg.run.output_dir)
    return (out if out.is_absolute() else project_root() / out) / "slurm"


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
    time_arg = next((a.partition("=")[2] for a in reversed(args.sbatch_args) if a.startswith("--time=")), args.time)
    cmd += signal_option(time_arg, args.sbatch_args)
    if args.wait:
        cmd.append("--wait")
    cmd += args.sbatch_args  # last: the user's options win over ours
    script_args = (["--config", args.config] if args.config else []) + list(args.overrides)
    return cmd + [str(script)] + script_args


def job_fields(job_id: str) -> dict[str, str]:
    """JobState, Restarts, StdOut and StdErr of a job from `scontrol show job` (paths with %x and %j
    expanded); empty where scontrol cannot say. No sacct: it needs the accounting database many clusters lack."""
    try:
        out = subprocess.run(["scontrol", "show", "job", job_id], check=False, capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    fields = {}
    for word in out.stdout.split():
        if word.startswith(("JobState=", "Restarts=")):
            key, _, value = word.partition("=")
            fields[key] = value
    for line in out.stdout.splitlines():
        key, sep, value = line.strip().partition("=")
        if sep and key in ("StdOut", "StdErr"):  # alone on their lines, so a path may hold spaces
            fields[key] = value
    return fields


def tail(path: str, lines: int = 20) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def script_path(launcher: str) -> Path:
    """The batch script for the launcher, relative to the project root; ConfigError naming the fix."""
    relative = SCRIPTS[launcher]
    if not (project_root() / relative).is_file():
        if launcher == "deepspeed":
            raise ConfigError(
                f"{relative} is missing: it is generated for projects with strategy deepspeed. Fixes: 1) `copier "
                "update --data strategy=deepspeed` generates it; 2) `launch slurm` (torchrun on every node) trains "
                "with any strategy, run.strategy=deepspeed included"
            )
        raise ConfigError(f"{relative} is missing: restore it with `copier update` (or `git checkout {relative}`)")
    return relative


def launch(args: Namespace, cfg: Config, package: str) -> int:
    root = project_root()
    relative = script_path(getattr(args, "launcher", "torchrun"))
    script = root / relative
    cmd = sbatch_command(args, cfg, relative)
    if args.dry_run:
        print(f"$ cd {shlex.quote(str(root))} && {shlex.join(cmd)}")
        print(f"--- {relative}")
        print(script.read_text(), end="")
        return 0
    if shutil.which("sbatch") is None:
        raise ConfigError(
            "sbatch is not on PATH: run this on a Slurm login node (or `module load slurm` there); "
            "`launch slurm --dry-run` prints what would be submitted"
        )
    logs = log_dir(cfg)
    try:
        logs.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the log folder {logs} ({exc.strerror}); run.output_dir must lie on "
                          "storage this node can write and every compute node can reach") from None
    print("$ " + shlex.join(cmd), flush=True)
    # From the project root: the job's SLURM_SUBMIT_DIR, where the script finds config/ and src/.
    proc = subprocess.Popen(cmd, cwd=root, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    first = proc.stdout.readline().strip()
    job_id = first.split(";")[0]
    if not job_id.isdigit():
        code = proc.wait()  # sbatch's own error went to stderr already
        if code == 0:
            print(f"sbatch printed no job id: {first!r}", file=sys.stderr)
        return code or 1
    fields = job_fields(job_id)
    stdout = fields.get("StdOut") or str(logs / f"<job name>-{job_id}.out")
    stderr = fields.get("StdErr") or str(logs / f"<job name>-{job_id}.err")
    print(f"submitted job {job_id}\n  log:    {stdout}\n  errors: {stderr}", flush=True)
    if not args.wait:
        print(f"  follow: tail -f {shlex.quote(stdout)}    status: squeue -j {job_id}    cancel: scancel {job_id}\n"
              f"  save now and continue later: scancel --signal=USR1 {job_id}")
        return proc.wait()
    try:
        code = proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        print(f"\nstopped waiting; job {job_id} goes on (scancel {job_id} to end it)", file=sys.stderr)
        return 130
    end = job_fields(job_id)
    state, restarts = end.get("JobState", ""), int(end.get("Restarts", "0") or 0)
    print(f"job {job_id} ended: exit {code}" + (f", {state}" if state else "")
          + (f", after {restarts} requeue(s)" if restarts else ""), flush=True)
    if code != 0:
        print(f"--- last lines of {stderr}\n{tail(stderr)}", file=sys.stderr)
    return code
