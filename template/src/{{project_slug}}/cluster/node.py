"""`node`: the node launcher every platform's launch file calls on each node (or, for jobs that
start one task per GPU through MPI or the scheduler, in each rank).

    <package> node [key=value ...]        # inside a pod, a scheduler's job step, a cloud task, ...
    <package> node --dry-run              # print the topology table and the torchrun command

It reads the platform's variables (topology.py), prints one table, applies config/nccl.env
without overriding what the platform set, waits for the master's port on non-master nodes, and
runs torchrun under supervise.py (restarts, stop signals, the preempted exit code). Ranks
started one per GPU by mpirun or the scheduler become `train` (exec) directly.
"""

from __future__ import annotations

import argparse
import os
import sys

from ..settings.bounds import positive_float
from ..settings.config import Config
from ..settings.topology import TopologyError, default_nproc, detect, process_ranks, variables_looked_for
from ..training import run_lock
from .nccl_env import apply_nccl_env
from .torchrun import run_torchrun, train_entry

PACKAGE = __name__.partition(".")[0]


def run_node(
    cfg: Config,
    config: str | None,
    overrides: list[str],
    package: str,
    dry_run: bool,
    wait_timeout: float,
    debug: bool = False,
) -> int:
    if debug:
        os.environ["TRAIN_DEBUG"] = "1"
    topo = detect(os.environ, default_nproc(cfg.cluster.gpus_per_node), cfg.cluster.nodes)
    if topo is None:
        raise TopologyError(
            f"no platform variables found ({variables_looked_for()}); on a dev machine use "
            "`launch devmachine`, or export the variables your platform would set"
        )
    if topo.role == "ps":
        print(topo.table(), flush=True)
        print(
            "this is a PS-Worker parameter-server task: PyTorch data-parallel training has no parameter-server "
            "role, so there is nothing to run here; the worker tasks train. Exiting 0.",
            flush=True,
        )
        return 0
    if not topo.per_process:
        return run_torchrun(topo, cfg, train_entry(package, config, overrides), dry_run, wait_timeout)
    # One process per rank, started by mpirun or the scheduler: only the master needs to be named.
    if process_ranks(os.environ)[0] == 0:
        print(topo.table(), flush=True)
    if dry_run:
        return 0
    apply_nccl_env(log=lambda m: None)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = topo.master_addr, str(topo.master_port)
    identity = run_lock.job_identity(os.environ, topo)
    if identity:  # rank 0 holds run.output_dir under it: a requeue or restart of the job re-enters
        os.environ[run_lock.IDENTITY] = identity
    # exec `train`: the rank keeps its pid (its starter watches it and signals it) and shows as
    # `-m <package> train`, which debug-dump and a pod's preStop hook look for.
    cmd = [sys.executable, "-u", *train_entry(package, config, overrides)]  # -u: lines reach mpirun as printed
    os.execv(cmd[0], cmd)
    return 1  # not reached


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dry-run", action="store_true", help="print the topology and the command, do not run")
    p.add_argument(
        "--wait-timeout", type=positive_float, default=900, help="seconds a worker node waits for the master"
    )
    p.add_argument("--debug", action="store_true", help="TRAIN_DEBUG=1: NCCL INFO logs, flight recorder dumps")


def run(cfg: Config, args: argparse.Namespace) -> int:
    return run_node(cfg, args.config, args.overrides, PACKAGE, args.dry_run, args.wait_timeout, args.debug)
