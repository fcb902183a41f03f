"""`launch devmachine`: torchrun on this machine (or on several, started by hand), in the foreground.

    <package> launch devmachine                                   # one node, all its GPUs
    <package> launch devmachine --nnodes 2 --node-rank 0 --master-addr 10.0.0.1   # on node 0
    <package> launch devmachine --nnodes 2 --node-rank 1 --master-addr 10.0.0.1   # on node 1
    <package> launch devmachine --launcher <name>                 # a strategy's own launcher, where the project holds one
    <package> launch devmachine --action status                   # from another shell: step, loss, tok/s, alive?
    <package> launch devmachine --action logs [--rank 1] [--follow]   # a rank's own log file
    <package> launch devmachine --action cancel                   # SIGTERM: the ranks save, then stop

The run is the job: it is recorded (jobs.py) as <host>:<pid of this launcher> with its output_dir,
and the launcher's identity (runtime/process_identity.py: its start time, the boot, its command line):
status and cancel act on the pid only while it is still that process. A record written before
identities were kept is taken for its launcher where the live process runs the recorded command and
started before the record was written.
torchrun writes every rank's output to <output_dir>/logs/<host>/<run id>/attempt_<n>/<local rank>/
as well as to the terminal (lines there start with [default<local rank>]:).
"""

from __future__ import annotations

import calendar
import os
import signal
import socket
import time
from argparse import ArgumentParser, Namespace
from functools import partial
from pathlib import Path

from ...cluster.torchrun import run_torchrun, train_entry
from ...runtime import process_identity
from ...settings import optional_parts
from ...settings.bounds import count, count_in, host, node_count, non_negative_int, positive_float, tcp_port
from ...settings.config import Config, ConfigError, under_root
from ...settings.topology import Topology, default_nproc
from .. import job_history, jobs
from ..base import Platform, print_file
from ..jobs import Job


def devmachine_topology(args: Namespace, cfg: Config) -> Topology:
    nnodes = args.nnodes or 1  # several dev machines are always named explicitly (argparse refuses 0)
    if nnodes > 1 and args.node_rank is None:
        raise ConfigError(f"--nnodes {nnodes}: pass --node-rank (0 on the master node, 1..{nnodes - 1} on the others)")
    if nnodes > 1 and not args.master_addr:
        raise ConfigError("--nnodes > 1: pass --master-addr with the address of node 0 (`hostname -i` there)")
    node_rank = args.node_rank or 0
    if not 0 <= node_rank < nnodes:
        raise ConfigError(f"--node-rank {node_rank} must be between 0 and {nnodes - 1} for --nnodes {nnodes}")
    return Topology(
        platform="devmachine",
        nnodes=nnodes,
        node_rank=node_rank,
        nproc_per_node=args.nproc_per_node or default_nproc(cfg.cluster.gpus_per_node),  # argparse refuses 0
        master_addr=args.master_addr or "127.0.0.1",
        master_port=args.master_port,
    )


def rank_logs_dir(output_dir: str | Path, host: str | None = None) -> Path:
    """Where torchrun writes this machine's per-rank logs."""
    return under_root(output_dir) / "logs" / (host or socket.gethostname())


def submitted_at(job: Job) -> float | None:
    """When the record was written, in seconds since the epoch (None when it does not say)."""
    try:
        return calendar.timegm(time.strptime(job.submitted, "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return None


class DevMachine(Platform):
    name = "devmachine"
    extra_fields = {"how": str, "launcher": dict, **job_history.RUN_FIELDS}
    needs_launch_files = False  # torchrun needs nothing generated; launch/devmachine/ only holds scripts

    @staticmethod
    def add_arguments(p: ArgumentParser) -> None:
        p.add_argument("--nnodes", type=node_count, help="nodes in the job (default: 1)")
        p.add_argument("--node-rank", type=non_negative_int, help="this node's rank, 0 on the master")
        p.add_argument("--master-addr", type=host, help="address of node 0 (multi-node only)")
        p.add_argument("--master-port", type=tcp_port, default=29500)
        p.add_argument("--nproc-per-node", type=count, help="processes on this node (default: GPUs, or CPU cores)")
        p.add_argument(
            "--wait-timeout", type=positive_float, default=900, help="seconds a worker node waits for the master"
        )
        p.add_argument("--debug", action="store_true", help="TRAIN_DEBUG=1: NCCL INFO logs, flight recorder dumps")
        p.add_argument(
            "--rank", type=non_negative_int, default=0, help="logs: the local rank whose log to show (default 0)"
        )
        p.add_argument(
            "--launcher",
            choices=("torchrun", *optional_parts.OTHER_LAUNCHERS),
            default="torchrun",
            help="torchrun (default), or a strategy's own launcher program (a hostfile, ssh or MPI)",
        )
        for launcher in optional_parts.launchers_present():
            launcher.add_arguments(p)  # its own options (a hostfile, how it reaches the other nodes)

    def dry_run(self) -> int:
        return self._start(dry_run=True)

    def submit(self) -> int:
        return self._start(dry_run=False)

    def _start(self, dry_run: bool) -> int:
        args, cfg = self.args, self.cfg
        if args.debug:
            os.environ["TRAIN_DEBUG"] = "1"
        if args.launcher != "torchrun":
            launcher = optional_parts.launcher(args.launcher)
            plan = launcher.plan_launch(args, cfg)
            on_start = partial(self._record, f"{args.launcher} launcher, {plan.describe()}")
            return launcher.launch(plan, args, cfg, self.package, dry_run, on_start=on_start)
        optional_parts.refuse_launcher_options(args)
        topo = devmachine_topology(args, cfg)
        return run_torchrun(
            topo,
            cfg,
            train_entry(self.package, args.config, args.overrides),
            dry_run,
            args.wait_timeout,
            log_dir=str(rank_logs_dir(cfg.run.output_dir)),
            # Recorded once the checks passed and the folder is held: a refused launch is no job.
            on_start=partial(
                self._record,
                f"torchrun, {topo.nnodes} node(s) x {topo.nproc_per_node} process(es), node {topo.node_rank}",
            ),
        )

    def _record(self, how: str) -> None:
        host = socket.gethostname()
        jobs.record(
            jobs.new_job(
                self.name,
                f"{host}:{os.getpid()}",
                name=self.args.name or host,
                where=host,
                extra={
                    "how": how,
                    "launcher": process_identity.record(os.getpid()),
                    **job_history.run_fields(self.cfg, under_root(self.cfg.run.output_dir)),
                },
            )
        )

    # --- status, logs, cancel: the run's own files and processes ----------------------------------
    def job_named(self, job_id: str | None, name: str | None) -> Job | None:
        return None  # a run is found by its record only

    def _pid_here(self, job: Job) -> int | None:
        """The launcher's pid when the job ran on this machine, else None."""
        host, _, pid = job.id.rpartition(":")
        return count_in(pid) if host == socket.gethostname() else None

    @staticmethod
    def _launcher(job: Job, pid: int) -> dict:
        """The launcher's identity as recorded, for pid (the id names it); the pid alone in older records."""
        return {**(job.extra.get("launcher") or {}), "pid": pid}

    def _verdict(self, job: Job, pid: int) -> process_identity.Verdict:
        return process_identity.check(self._launcher(job, pid), submitted_at(job), job.command)

    def _running(self, job: Job) -> bool:
        pid = self._pid_here(job)
        return pid is not None and self._verdict(job, pid).running is True

    def status(self, job: Job) -> int:
        from ...cluster.local_ranks import descends_from, find_ranks

        output_dir = job_history.run_folder(job, under_root(self.cfg.run.output_dir))
        print(job.describe())
        pid = self._pid_here(job)
        if pid is None:
            print(f"  process: on {job.id.rpartition(':')[0]}, not this machine: run this there to see it")
        elif (verdict := self._verdict(job, pid)).running:
            ranks = [rank for rank in find_ranks(self.package) if descends_from(rank.pid, pid)]  # this run's only
            print(f"  process: running (launcher pid {pid}; {len(ranks)} training process(es) on this machine)")
        elif verdict.running is False:
            print(f"  process: not running (launcher {verdict.why})")
        else:
            print(f"  process: unknown ({verdict.why})")
        max_steps = job.extra.get("max_steps") or self.cfg.schedule.max_steps
        lines = job_history.run_lines(output_dir, max_steps)
        if not any(line.startswith("latest: ") for line in lines):
            print(f"  latest: no step logged yet in {output_dir}/metrics.jsonl")
        for line in lines:
            print(f"  {line}")
        return 0

    def logs(self, job: Job) -> int:
        output_dir = job.extra.get("output_dir") or self.cfg.run.output_dir
        host = job.id.rpartition(":")[0]
        root = rank_logs_dir(output_dir, host)
        attempts = sorted(root.glob("*/attempt_*"), key=lambda p: p.stat().st_mtime)
        if not attempts:
            raise ConfigError(
                f"no per-rank logs under {root}: the run has not started its ranks yet, ran on "
                "another machine, or used another --launcher (its output is the terminal's)"
            )
        folder = attempts[-1] / str(self.args.rank)
        if not folder.is_dir():
            ranks = sorted(p.name for p in attempts[-1].iterdir())
            raise ConfigError(f"--rank {self.args.rank}: {attempts[-1]} holds local ranks {', '.join(ranks)}")
        for stream in ("stderr", "stdout"):
            path = folder / f"{stream}.log"
            print(f"--- {path}", flush=True)
            print_file(path, self.args.follow and stream == "stdout", lambda: self._running(job))
        return 0

    def cancel(self, job: Job) -> int:
        pid = self._pid_here(job)
        if pid is None:
            raise ConfigError(f"{job.id} ran on another machine: run this there, or press Ctrl-C in its terminal")
        launcher = self._launcher(job, pid)
        try:
            verdict = process_identity.send_signal(launcher, signal.SIGTERM, submitted_at(job), job.command)
        except PermissionError:
            raise ConfigError(f"{job.id}: pid {pid} belongs to another user; run the cancel as that user") from None
        if verdict.running is None:
            raise ConfigError(
                f"{job.id}: {verdict.why}; nothing signalled: if it is this run, stop it with `kill -TERM {pid}`"
            )
        if not verdict.running:
            print(f"job {job.id} ended: {verdict.why}; nothing signalled")
            return 0
        print(
            f"sent SIGTERM to {job.id}: the ranks save a checkpoint at the next step and exit 143; "
            "the same launch command resumes from it"
        )
        return 0


PLATFORM = DevMachine
