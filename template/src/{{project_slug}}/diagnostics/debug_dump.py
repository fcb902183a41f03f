"""`<package> debug-dump`: the Python stack of every training rank on this machine, for a job that hangs.

    <package> debug-dump                     # all ranks here -> <run.output_dir>/debug-dump/<host>-<UTC time>/
    <package> debug-dump --locals            # also each frame's local variables
    <package> debug-dump --native            # also the C/C++ frames (NCCL, Gloo, CUDA) between the Python ones
    <package> debug-dump --pid 4242 --pid 4243 --out /tmp/dump    # these processes, into this folder
    PY_SPY=/shared/bin/py-spy <package> debug-dump                  # another py-spy than the one on PATH

Run it on every node of a hung job (ssh, or the platform's way into a running job's node: its
environment.py's RUN_ON_NODE). A training rank is a process whose command line is `python -m <package>
train` (the children of torchrun, or ranks that mpirun or a scheduler started); its RANK / LOCAL_RANK
come from /proc/<pid>/environ. `py-spy dump` reads
each stack from outside (ptrace): the rank needs no cooperation, which is the point when it hangs.
Writes rank<R>.txt per rank (every thread) and summary.txt / summary.json, and prints per rank the
innermost frame of this project's code and whether the rank waits in a collective: the ranks that
are NOT in a collective while the others are are the ones to look at. Also lists the NCCL flight
recorder dumps (TORCH_NCCL_DEBUG_INFO_TEMP_FILE) when there are any. Exit 0 when every rank was dumped.

local_ranks.py finds the ranks, rank_stacks.py reads where each one is; here py-spy runs and the files
and the summary are written. Each rank's identity (runtime/process_identity.py) is taken when it is
found and checked before and after its dump: a rank that ended meanwhile, its pid taken by another
process, is not attached to, and a stack read across such a change is not kept.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

from ..cluster.local_ranks import RankProcess, find_ranks, read_process
from ..runtime import process_identity
from ..settings.bounds import process_id
from .rank_stacks import render_threads, where

PACKAGE = __name__.partition(".")[0]
PY_SPY_TIMEOUT = 60  # seconds per process: a dump takes well under one; a stuck ptrace must not hang us too


class DumpError(Exception):
    """Nothing could be dumped at all (no ranks, no py-spy): printed as the message, exit 1."""


# ---------------------------------------------------------------------------------------------- dumping


def find_py_spy() -> str:
    """$PY_SPY when set (another build, a copy on shared storage), else py-spy on PATH or next to python."""
    path = os.environ.get("PY_SPY") or shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not os.access(path, os.X_OK):
        where = f"PY_SPY={path}" if os.environ.get("PY_SPY") else f"looked on PATH and next to {sys.executable}"
        raise DumpError(
            f"py-spy is not installed ({where}).\n"
            "  1. pip install py-spy                      # or: pip install -e '.[debug]' in this project\n"
            "  2. in the image it is installed by the Dockerfile; rebuild an older image: "
            f"{PACKAGE} image build"
        )
    return path


def permission_help(pid: int) -> str:
    return (
        f"py-spy may not attach to pid {pid} (ptrace permission denied).\n"
        "  1. run debug-dump as the user that runs the training, or as root\n"
        "  2. in a container, the container needs the SYS_PTRACE capability:\n"
        "       in a pod, the training container's securityContext:\n"
        "         securityContext:\n"
        "           capabilities:\n"
        '             add: ["SYS_PTRACE"]\n'
        "       docker run --cap-add SYS_PTRACE ...   |   podman run --cap-add SYS_PTRACE ...\n"
        "  3. on the host: kernel.yama.ptrace_scope must be 0 or 1 for a same-user dump "
        "(sysctl kernel.yama.ptrace_scope; `sudo sysctl -w kernel.yama.ptrace_scope=0`), 2 needs root, 3 forbids it"
    )


def py_spy_dump(py_spy: str, pid: int, local_vars: bool, native: bool) -> list[dict]:
    """py-spy's threads of pid (JSON form). Raises RuntimeError with what went wrong."""
    cmd = [py_spy, "dump", "--pid", str(pid), "--json"]
    if local_vars:
        cmd.append("--locals")
    if native:
        cmd.append("--native")
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=PY_SPY_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise RuntimeError(
            f"py-spy did not finish within {PY_SPY_TIMEOUT} s (the process is stopped in the kernel?)"
        ) from None
    if result.returncode == 0:
        try:
            return json.loads(result.stdout)
        except json.JSONDecodeError:
            raise RuntimeError(f"py-spy printed no JSON: {result.stdout[:500]}") from None
    message = (result.stderr.strip() or result.stdout.strip()).splitlines()
    first = next((line for line in message if line.strip() and not line.startswith("Stack backtrace")), "")
    text = " ".join(message).lower()
    if "permission" in text or "os error 1)" in text or "os error 13)" in text:
        raise PermissionError(f"{first}\n{permission_help(pid)}")
    if not Path(f"/proc/{pid}").exists():
        raise RuntimeError(f"process {pid} ended before it could be dumped")
    raise RuntimeError(first or f"py-spy exited {result.returncode}")


def identify(process: RankProcess) -> dict:
    """The identity of the process found as `process`: its command line as found, so that a number
    taken by another process between finding and now does not pass for the rank."""
    identity = process_identity.record(process.pid)
    return {**identity, "cmdline": process.argv} if "start_ticks" in identity else identity


def dump_process(py_spy: str, process: RankProcess, identity: dict, local_vars: bool, native: bool) -> list[dict]:
    """py_spy_dump of the process identity names; RuntimeError (nothing attached, or the stack
    dropped) when its pid names another process before or after the dump."""
    before = process_identity.check(identity)
    if before.running is False:
        raise RuntimeError(f"ended before it could be dumped: {before.why}; nothing attached")
    threads = py_spy_dump(py_spy, process.pid, local_vars, native)
    after = process_identity.check(identity)
    if after.running is False:
        raise RuntimeError(f"ended while it was dumped: {after.why}; its stack is not kept")
    return threads


# ---------------------------------------------------------------------------------------------- context


def flight_recorder_dumps(ranks: list[RankProcess]) -> tuple[str | None, list[Path]]:
    """(TORCH_NCCL_DEBUG_INFO_TEMP_FILE, the dump files next to it): from the ranks' environment, else
    config/nccl-debug.env (what TRAIN_DEBUG=1 would set)."""
    temp_file = next(
        (p.env["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] for p in ranks if p.env.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")), None
    )
    if temp_file is None:
        from ..settings.config import project_root, read_env_file

        temp_file = read_env_file(project_root() / "config" / "nccl-debug.env").get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    if not temp_file:
        return None, []
    folder, prefix = Path(temp_file).parent, Path(temp_file).name
    try:
        files = sorted(p for p in folder.iterdir() if p.is_file() and p.name.startswith(prefix))
    except OSError:
        files = []
    return temp_file, files


def job_output_dir(ranks: list[RankProcess]) -> str | None:
    """run.output_dir named on the ranks' command lines (the job's override), when they agree."""
    named = {a.split("=", 1)[1] for p in ranks for a in p.argv if a.startswith("run.output_dir=")}
    return named.pop() if len(named) == 1 else None


def default_out(cfg, ranks: list[RankProcess], overrides: list[str]) -> Path:
    explicit = any(o.startswith("run.output_dir=") for o in overrides)
    base = cfg.run.output_dir if explicit else (job_output_dir(ranks) or cfg.run.output_dir)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path(base) / "debug-dump" / f"{socket.gethostname()}-{stamp}"


# ---------------------------------------------------------------------------------------------- command


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--pid",
        type=process_id,
        action="append",
        default=[],
        help=f"dump this process (repeatable) instead of every `-m {PACKAGE} train` process here",
    )
    p.add_argument(
        "--out",
        help="folder for the dumps (default: <run.output_dir>/debug-dump/<host>-<UTC time>/, "
        "run.output_dir as the running job named it)",
    )
    p.add_argument("--locals", dest="local_vars", action="store_true", help="also each frame's local variables")
    p.add_argument("--native", action="store_true", help="also C/C++ frames (NCCL, Gloo, CUDA calls); slower")


def ways_onto_a_node(package: str) -> str:
    """': ' and how each platform present runs debug-dump on a node of its running job, or ''."""
    from ..settings.topology import platform_environments

    command = f"{package} debug-dump"
    ways = [m.RUN_ON_NODE.format(command=command) for m in platform_environments() if hasattr(m, "RUN_ON_NODE")]
    return ": " + "; ".join(ways) if ways else ""


def collect(args: argparse.Namespace, package: str = PACKAGE) -> list[RankProcess]:
    if args.pid:
        ranks = []
        for pid in args.pid:
            process = read_process(pid, package)
            if process is None:
                raise DumpError(f"no process {pid} on this machine (ps -p {pid})")
            ranks.append(process)
        return ranks
    ranks = find_ranks(package)
    if not ranks:
        raise DumpError(
            f"no training ranks on {socket.gethostname()}: looked in /proc for processes whose command line is "
            f"`python -m {package} train ...` (torchrun's children, or ranks started by mpirun or a scheduler).\n"
            f"  1. run debug-dump on the node (or in the container) where the ranks run{ways_onto_a_node(package)}\n"
            "  2. in a container, /proc shows only the container's processes: exec into the training container\n"
            f"  3. name the processes yourself: {package} debug-dump --pid PID [--pid PID ...] (ps -ef | grep train)"
        )
    return ranks


def run(cfg, args: argparse.Namespace) -> int:
    try:
        ranks = collect(args)
        identities = {process.pid: identify(process) for process in ranks}
        py_spy = find_py_spy()
    except DumpError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    out = Path(args.out) if args.out else default_out(cfg, ranks, getattr(args, "overrides", []))
    out.mkdir(parents=True, exist_ok=True)
    when = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    taken = {p.rank for p in ranks}
    summary, lines, failed = [], [], []
    print(f"dumping {len(ranks)} rank(s) on {socket.gethostname()} into {out}", flush=True)
    for process in ranks:
        # Two jobs on one machine share rank numbers: then the pid tells the files apart.
        duplicate = sum(1 for p in ranks if p.rank == process.rank) > 1
        name = f"rank{process.rank}" + (f"-pid{process.pid}" if duplicate else "")
        label = f"rank {process.rank} (local {process.local_rank}, pid {process.pid})"
        record = {
            "rank": process.rank,
            "local_rank": process.local_rank,
            "world_size": process.world_size,
            "pid": process.pid,
        }
        try:
            threads = dump_process(py_spy, process, identities[process.pid], args.local_vars, args.native)
        except (PermissionError, RuntimeError) as exc:
            failed.append(process)
            record["error"] = str(exc)
            lines += [f"{label}: NOT DUMPED: {exc}"]
            summary.append(record)
            continue
        (out / f"{name}.txt").write_text(render_threads(process, threads, when))
        info = where(threads, process.pid)
        record.update(info, file=f"{name}.txt")
        summary.append(record)
        state = f"waits in {info['waits_in']}" if info["waits_in"] else "not in a collective"
        lines += [
            f"{label}: {state}",
            f"    ours:      {info['ours'] or '(no frame of ' + PACKAGE + ')'}",
            f"    innermost: {info['innermost']}",
        ]
    waiting = [r["rank"] for r in summary if r.get("in_collective")]
    elsewhere = [r["rank"] for r in summary if "error" not in r and not r.get("in_collective")]
    if waiting and elsewhere:
        lines.append(
            f"ranks {waiting} wait in a collective for the others; look at rank(s) {elsewhere} first: "
            "they are somewhere else"
        )
    world = max((p.world_size for p in ranks), default=1)
    if len(taken) < world and not args.pid:
        lines.append(f"this machine runs {len(taken)} of {world} ranks: run debug-dump on the other nodes too")
    temp_file, dumps = flight_recorder_dumps(ranks)
    if dumps:
        lines.append(
            f"flight recorder dumps ({temp_file}*): read them all with "
            f"`torchfrtrace {Path(temp_file).parent} --prefix {Path(temp_file).name}`"
        )
        lines += [f"    {p}  ({p.stat().st_size} bytes)" for p in dumps]
    elif temp_file:
        lines.append(
            f"no flight recorder dumps at {temp_file}* (NCCL writes them when a collective times out "
            "with TORCH_NCCL_DUMP_ON_TIMEOUT=1)"
        )
    text = "\n".join(lines)
    print(text, flush=True)
    (out / "summary.txt").write_text(f"debug-dump on {socket.gethostname()} at {when}\n{text}\n")
    (out / "summary.json").write_text(
        json.dumps(
            {
                "host": socket.gethostname(),
                "time": when,
                "ranks": summary,
                "flight_recorder": {"temp_file": temp_file, "files": [str(p) for p in dumps]},
            },
            indent=2,
        )
        + "\n"
    )
    print(f"stacks of every thread: {out}/rank<R>.txt", flush=True)
    if failed:
        print(f"error: {len(failed)} of {len(ranks)} rank(s) not dumped (see above)", file=sys.stderr)
        return 1
    return 0
