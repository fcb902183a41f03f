"""torchrun on this node: the one place its command line is built and run (under supervise.py).

    from .torchrun import run_torchrun, torchrun_command, train_entry
    run_torchrun(topology, cfg, train_entry(package, None, ["schedule.max_steps=100"]), dry_run=False,
                 wait_timeout=900)

Used by `node` (every platform's launch file) and `launch devmachine`.
"""

from __future__ import annotations

import os
import shlex
import socket
import sys
from collections.abc import Callable
from pathlib import Path

from ..settings.config import Config, debug_requested
from ..settings.topology import Topology, platform_max_restarts
from ..training import run_lock
from .nccl_env import apply_nccl_env
from .network import address_towards, wait_for_master
from .supervise import run_supervised

STOP_SIGNALS = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
"""Signals torchrun forwards to the ranks: its defaults plus SIGUSR1 (a batch scheduler's time-limit warning)."""

ORDERED_RENDEZVOUS = "c10d-ordered"
"""rendezvous.py's c10d backend: group ranks follow the platform's node ranks (global rank 0 on node 0)."""


def torchrun_command(
    topo: Topology,
    entry: list[str],
    max_restarts: int = 0,
    grace_seconds: int = 30,
    log_dir: str | None = None,
    local_addr: str | None = None,
) -> list[str]:
    """torchrun arguments for this node; `entry` is the module and its arguments.

    max_restarts: torchrun restarts all of this node's ranks after one fails (and the other nodes'
    agents follow through the rendezvous); they resume from the latest checkpoint.
    grace_seconds: after a stop signal, how long the ranks may take to save before SIGKILL.
    log_dir: every rank's output also goes to a file there (per attempt and local rank).
    local_addr: how the other nodes reach this one (multi-node): the node that gets global rank 0
    hands it to every rank as MASTER_ADDR; without it torchrun uses the host name, which other
    machines often cannot resolve."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(topo.nproc_per_node),
        "--max-restarts",
        str(max_restarts),
        "--signals-to-handle",
        STOP_SIGNALS,
        "--shutdown-timeout",
        str(grace_seconds),
    ]
    if log_dir:
        cmd += ["--log-dir", log_dir, "--redirects", "3", "--tee", "3"]
    if topo.nnodes == 1 and not topo.min_nnodes:
        # Standalone: c10d on a free local port, nothing to collide with on a shared box.
        return cmd + ["--standalone"] + entry
    if local_addr:
        cmd += ["--local-addr", local_addr]
    if topo.min_nnodes:
        # Elastic: c10d rendezvous hosted at the master, any node count between min and max.
        return (
            cmd
            + [
                "--nnodes",
                f"{topo.min_nnodes}:{topo.nnodes}",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"{topo.master_addr}:{topo.master_port}",
            ]
            + entry
        )
    # c10d rendezvous (not static): after a failure every node's agent re-joins the next round, so
    # restarts work across nodes. Node 0's agent hosts the store at master_addr:master_port. Plain
    # c10d numbers the nodes by address and pid, so global rank 0 (logs, checkpoints) could run on
    # any node: rendezvous.py's backend numbers them by the platform's node rank instead.
    cmd[1:3] = ["-m", f"{__package__}.rendezvous"]
    return (
        cmd
        + [
            "--nnodes",
            str(topo.nnodes),
            "--rdzv-backend",
            ORDERED_RENDEZVOUS,
            "--rdzv-endpoint",
            f"{topo.master_addr}:{topo.master_port}",
            "--rdzv-conf",
            f"is_host={'true' if topo.node_rank == 0 else 'false'},node_rank={topo.node_rank}",
        ]
        + entry
    )


def train_entry(package: str, config: str | None, overrides: list[str]) -> list[str]:
    entry = ["-m", package, "train"]
    if config:
        entry += ["--config", config]
    return entry + overrides


def check_before_start(cfg: Config, world_size: int | None) -> None:
    """Mistakes every rank would hit at once, reported before torchrun starts: the rules, meta.json, the tokenizer and the token shards (enough tokens for a sequence). What only
    a rank can find (a checkpoint's compatibility, the GPUs it sees) ends the job through
    supervise.py instead of being restarted into."""
    from ..data.tokens import TokenData, load_tokenizer, read_meta, require_shards
    from ..models.family import family
    from ..planning.rules import require_valid

    require_valid(cfg, world_size)  # run.output_dir was checked by cli.py (runtime/output_paths.py)
    data_dir = Path(cfg.data.dir)
    meta = read_meta(data_dir)
    load_tokenizer(data_dir / meta["tokenizer"])
    for split in ("train", "val"):
        require_shards(data_dir, meta, split)
        if family(cfg.model.arch).causal:  # masked-LM sequences are checked by their ranks (the family's data)
            TokenData.open(data_dir, split, cfg.model.sequence_len)


def run_torchrun(
    topo: Topology,
    cfg: Config,
    entry: list[str],
    dry_run: bool,
    wait_timeout: float,
    log_dir: str | None = None,
    on_start: Callable[[], None] | None = None,
) -> int:
    """torchrun for this node under the supervisor. log_dir: every rank's output also goes to a file
    there (always under TRAIN_DEBUG=1, at <output_dir>/logs/<host>). on_start: called once the
    checks passed and the output folder is held, just before torchrun starts (a refused launch is no job)."""
    if cfg.run.debug:
        os.environ["TRAIN_DEBUG"] = "1"  # the ranks and apply_nccl_env read it
    # A platform's job may name its own restart budget (an elastic job's).
    restarts = platform_max_restarts(os.environ) or cfg.cluster.max_restarts
    if log_dir is None and debug_requested():
        log_dir = str(Path(cfg.run.output_dir) / "logs" / socket.gethostname())
    local_addr = address_towards(topo.master_addr) if topo.nnodes > 1 else None
    cmd = torchrun_command(topo, entry, restarts, cfg.cluster.stop_grace_seconds, log_dir, local_addr)
    print(topo.table(), flush=True)
    print("$ " + shlex.join(cmd), flush=True)
    if dry_run:
        return 0
    check_before_start(cfg, None if topo.min_nnodes else topo.nnodes * topo.nproc_per_node)
    # The output folder is held here, across torchrun's restarts, until the job ends; the ranks
    # inherit the job's identity and enter. Node 0 takes it, the others only check it (and refuse
    # at once when another run holds it, as node 0 does).
    identity = run_lock.job_identity(os.environ, topo) or f"launch pid {os.getpid()} on {socket.gethostname()}"
    with run_lock.acquire(cfg.run.output_dir, identity, write=topo.node_rank == 0, take_over_job=True):
        os.environ[run_lock.IDENTITY] = identity
        if on_start is not None:
            on_start()
        apply_nccl_env()
        if topo.nnodes > 1 and topo.node_rank != 0:
            wait_for_master(topo.master_addr, topo.master_port, wait_timeout, log=lambda m: print(m, flush=True))
        # Each attempt's ranks get a fresh store of their own rather than the agent's, whose keys outlive
        # an attempt (pytorch/pytorch#135712: restarted ranks read the dead ranks' addresses). Under
        # plain torchrun, which shares it, runtime/distributed.py starts each attempt's group in a
        # namespace of its own.
        os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
        if log_dir:
            print(f"every rank's output also goes to {log_dir}/<run>/attempt_<n>/<local rank>/", flush=True)
        return run_supervised(
            cmd,
            cfg.run.output_dir,
            forward_signals=not topo.signals_every_process,
            log=lambda m: print(m, flush=True),
            grace_seconds=cfg.cluster.stop_grace_seconds,
        )
