"""`doctor`: is this node ready for multi-node training, and does NCCL really use the RDMA network?

    <package> doctor                          # on a node: a pod, a cloud task, a batch allocation, a dev box
    <package> doctor --net-loopback           # one node: P2P/SHM off, so the local GPUs talk through the NIC
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 -m <package> doctor
                                              # every rank of a job: inter-node transports (or one process
                                              #   per GPU started by mpirun or the scheduler)
    <package> doctor --nccl-log runs/logs/    # only analyse the NCCL logs of an earlier job (TRAIN_DEBUG=1)

One table, a verdict per line (ok / warn / FAIL / n/a), exit 1 on any FAIL: GPUs, the fabric that
config/nccl.env describes (NCCL_IB_DISABLE=0: RDMA expected), RDMA devices (/sys/class/infiniband and
`ibv_devinfo`), whether NCCL_IB_HCA selects any of them, the socket interfaces, /dev/shm, the memlock
limit; then a short all-reduce: NCCL on GPUs with NCCL_DEBUG=INFO, whose log tells which transport NCCL
chose (nccl_log.py reads it), or Gloo between two processes on CPU; both report the bus bandwidth as
nccl-tests define it. The settings are those the node launcher applies: config/nccl.env, with what the
environment (the platform) already set winning; after the table doctor lists each NCCL setting in effect
and its source (environment, config/nccl.env, NCCL's default).

The node checks are node_checks.py (fabric.py: the settings and what they promise; rdma.py: the
RDMA ports), the all-reduce allreduce_bench.py, the log analysis nccl_log.py and nccl_verdict.py.
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import tempfile
import textwrap
from pathlib import Path

from ..cluster.nccl_env import apply_nccl_env
from ..settings.bounds import count, positive_float
from ..settings.config import Config, ConfigError, project_root
from . import FAIL, NA, WARN, Check
from .allreduce_bench import describe_result, job_allreduce, local_allreduce
from .fabric import Expectation, InEffect, Settings, check_fabric, expectation, load_settings, settings_in_effect
from .nccl_log import LogError, merge, parse, read_logs
from .nccl_verdict import assess, connection_table
from .node_checks import check_node, gpu_info

MIB = 1 << 20


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--nccl-log",
        action="append",
        default=[],
        metavar="FILE_OR_DIR",
        help="only analyse these NCCL logs of an earlier job (repeatable; a folder = every file in it)",
    )
    p.add_argument(
        "--nccl-env",
        metavar="FILE",
        help="the fabric settings to check against (default: config/nccl.env of the project)",
    )
    p.add_argument(
        "--fabric",
        choices=["infiniband", "roce", "tcp"],
        help="judge against this fabric instead of NCCL_IB_DISABLE (logs from another cluster)",
    )
    p.add_argument("--no-allreduce", action="store_true", help="only the node checks, no all-reduce")
    p.add_argument(
        "--size-mb", type=positive_float, help="all-reduce message size in MiB (default: 256 on GPUs, 16 on CPU)"
    )
    p.add_argument("--iters", type=count, default=5, help="timed all-reduces after one warm-up (default: 5)")
    p.add_argument("--nproc", type=count, help="local processes for the all-reduce (default: one per GPU; 2 on CPU)")
    p.add_argument(
        "--net-loopback",
        action="store_true",
        help="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0: local GPUs exchange data "
        "through the network, so one node tests its RDMA path",
    )
    p.add_argument("--timeout", type=positive_float, default=300, help="seconds the all-reduce may take (default: 300)")
    p.add_argument("--log-dir", help="where the workers' NCCL logs are kept (default: a new temporary folder)")


_QUOTED = re.compile(r"`[^`]*`")
_KEEP = "\x00"  # stands for a space inside a quote while wrapping


def wrap_keeping_quotes(text: str, width: int) -> list[str]:
    """Lines of at most `width` (a longer quote gets a line of its own): a `quoted` command or log
    line is never split, so it can be copied or searched for whole."""
    held = _QUOTED.sub(lambda m: m.group(0).replace(" ", _KEEP), text)
    lines = textwrap.wrap(held, width=width, break_on_hyphens=False, break_long_words=False)
    return [line.replace(_KEEP, " ") for line in lines] or [""]


def print_table(title: str, checks: list[Check], notes: list[str] = ()) -> None:
    width = max((len(c.name) for c in checks), default=5)
    print(title)
    print(f"{'check':<{width}}  {'verdict':<7}  detail")
    indent = " " * (width + 11)
    for c in checks:
        lines = wrap_keeping_quotes(c.detail, max(60, 118 - len(indent)))
        print(f"{c.name:<{width}}  {c.verdict:<7}  {lines[0]}")
        for line in lines[1:]:
            print(indent + line)
    for note in notes:
        print(f"note: {note}")


def print_settings(rows: list[InEffect]) -> None:
    """The NCCL settings the ranks get and where each came from (environment, config/nccl.env, NCCL)."""
    print("NCCL settings in effect (source: the environment = the platform or your shell, which wins):")
    name_width = max(len(r.name) for r in rows)
    value_width = min(max(len(r.value) for r in rows), 40)
    for r in rows:
        note = f" ({r.note})" if r.note else ""
        print(f"  {r.name:<{name_width}}  {r.value:<{value_width}}  {r.source}{note}")


def final_verdict(checks: list[Check]) -> int:
    failed = [c.name for c in checks if c.verdict == FAIL]
    warned = [c.name for c in checks if c.verdict == WARN]
    summary = f"{len(warned)} warning(s)" + (f" ({', '.join(warned)})" if warned else "")
    if failed:
        print(f"doctor: FAIL - {len(failed)} check(s) failed ({', '.join(failed)}); {summary}", flush=True)
        return 1
    print(f"doctor: {'warn' if warned else 'ok'} - no check failed; {summary}", flush=True)
    return 0


def nccl_env_path(args: argparse.Namespace) -> Path:
    """The fabric settings to judge by: a file given with --nccl-env must exist (a missing project's
    config/nccl.env means NCCL's defaults)."""
    if not args.nccl_env:
        return project_root() / "config" / "nccl.env"
    path = Path(args.nccl_env)
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise ConfigError(f"--nccl-env {args.nccl_env} {what}; give a KEY=VALUE file such as config/nccl.env")
    return path


def analyse_logs(args: argparse.Namespace, settings: Settings, expect: Expectation) -> int:
    try:
        logs = read_logs(args.nccl_log)
    except LogError as exc:
        raise ConfigError(str(exc)) from None
    job = merge(logs)
    checks = [check_fabric(settings, expect, args.fabric), *assess(job, expect)]
    print_table(f"doctor: NCCL logs of an earlier job, judged against {expect.source or 'no fabric'}", checks)
    if len(logs) > 1:
        print("per file:")
        for log in logs:
            nets = ", ".join(sorted(log.networks)) or "no `Using network` line"
            print(f"  {log.sources[0]}: {log.lines} NCCL lines, {nets}, {len(log.connections)} connections")
    rows = connection_table(job)
    if rows:
        print("connections (sender -> receiver, direction, transport, channels):")
        print("\n".join("  " + r for r in rows))
    return final_verdict(checks)


def nccl_checks(texts: list[tuple[str, str]], expect: Expectation) -> list[Check]:
    checks = assess(merge([parse(text, name) for name, text in texts]), expect)
    return [c for c in checks if c.name != "NCCL log" or c.verdict == FAIL]


def run(cfg: Config, args: argparse.Namespace) -> int:
    settings = load_settings(nccl_env_path(args))
    expect = expectation(settings, args.fabric)
    if args.nccl_log:
        return analyse_logs(args, settings, expect)
    in_effect = settings_in_effect(settings)  # read before apply_nccl_env adds the file's values

    from ..settings.topology import process_ranks

    rank, local_rank, world = process_ranks(os.environ)
    gpus, why = gpu_info()
    notes: list[str] = []
    checks = check_node(cfg, settings, expect, args.fabric, gpus, why) if local_rank == 0 else []
    try:  # as the node launcher does: config/nccl.env under what the platform set
        apply_nccl_env(log=notes.append, values=settings.file)
    except OSError as exc:
        notes.append(f"config/nccl-debug.env not fully applied: {exc}")
    title = (
        f"doctor on {socket.gethostname()}"
        + (f" (rank {rank} of {world})" if world > 1 else "")
        + f"; fabric: {expect.source}"
    )

    if args.no_allreduce:
        if local_rank != 0:  # one table per node
            return 0
        print_table(title, checks, notes)
        print_settings(in_effect)
        return final_verdict(checks)

    backend = "nccl" if gpus else "gloo"
    nbytes = int((args.size_mb or (256 if gpus else 16)) * MIB)
    extra = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"} if gpus else {}
    if args.net_loopback and gpus:
        extra.update(NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1", NCCL_NVLS_ENABLE="0")
    elif args.net_loopback:
        notes.append("--net-loopback ignored: it steers NCCL, and without GPUs the all-reduce runs on Gloo")
    log_dir = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="doctor-"))
    log_dir.mkdir(parents=True, exist_ok=True)

    if world > 1:
        os.environ.update(extra)
        _set_master(cfg)
        result, error, texts = job_allreduce(backend, nbytes, args.iters, args.timeout, local_rank, rank, log_dir)
    else:
        nproc = args.nproc or (len(gpus) if gpus else 2)
        if gpus and not 2 <= nproc <= len(gpus):
            checks.append(
                Check(
                    "all-reduce",
                    NA,
                    (
                        f"{len(gpus)} GPU(s) here, {nproc} process(es) asked: an all-reduce needs 2 to {len(gpus)}; run "
                        "doctor under torchrun (or one process per GPU) across nodes instead"
                    ),
                )
            )
            print_table(title, checks, notes)
            print_settings(in_effect)
            return final_verdict(checks)
        result, error, logs = local_allreduce(nproc, backend, nbytes, args.iters, args.timeout, extra, log_dir)
        texts = [(str(p), p.read_text(errors="replace")) for p in logs]

    checks.append(describe_result(result) if result else Check("all-reduce", FAIL, error))
    if gpus:
        checks += nccl_checks(texts, expect)
        notes.append(f"NCCL logs in {log_dir} (read them again with --nccl-log {log_dir})")
    else:
        for name in ("NCCL version", "NCCL network", "NCCL transports", "GPUDirect RDMA"):
            checks.append(Check(name, NA, "no GPU: the all-reduce ran on Gloo"))
    if rank == 0 or local_rank == 0:
        print_table(title, checks, notes)
        print_settings(in_effect)
        return final_verdict(checks)
    return 1 if any(c.verdict == FAIL for c in checks) else 0


def _set_master(cfg: Config) -> None:
    """MASTER_ADDR/PORT for ranks mpirun or a scheduler started, found as the node launcher finds them."""
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        return
    from ..settings.topology import default_nproc, detect

    topo = detect(os.environ, default_nproc(cfg.cluster.gpus_per_node), cfg.cluster.nodes)
    if topo is None:
        raise ConfigError(
            "doctor runs as one rank of several but MASTER_ADDR/MASTER_PORT are not set and no platform "
            "variables name a master; start it with torchrun, mpirun or the scheduler's one process per GPU"
        )
    os.environ.setdefault("MASTER_ADDR", topo.master_addr)
    os.environ.setdefault("MASTER_PORT", str(topo.master_port))
