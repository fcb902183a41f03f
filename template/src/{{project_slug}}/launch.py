"""`launch <platform>`: the one command that starts training on a platform.

    <package> launch devmachine                                   # one node, all its GPUs
    <package> launch devmachine --nnodes 2 --node-rank 0 --master-addr 10.0.0.1   # on node 0
    <package> launch devmachine --nnodes 2 --node-rank 1 --master-addr 10.0.0.1   # on node 1
    <package> launch devmachine --dry-run                         # print the command only

Arguments after the options (key=value) are passed to `train` as config overrides.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from argparse import Namespace

from .config import Config, ConfigError
from .topology import Topology, torchrun_command


def default_nproc(cfg: Config) -> int:
    """One process per GPU; without GPUs, one per CPU core up to gpus_per_node."""
    import torch  # here, not at the top: --dry-run and errors should not wait for CUDA's import

    if torch.cuda.is_available():
        return torch.cuda.device_count()
    return max(1, min(cfg.cluster.gpus_per_node, os.cpu_count() or 1))


def devmachine_topology(args: Namespace, cfg: Config) -> Topology:
    nnodes = args.nnodes or 1  # several dev machines are always named explicitly
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
        nproc_per_node=args.nproc_per_node or default_nproc(cfg),
        master_addr=args.master_addr or "127.0.0.1",
        master_port=args.master_port,
    )


def run_launch(args: Namespace, cfg: Config, package: str) -> int:
    topo = devmachine_topology(args, cfg)
    entry = ["-m", package, "train"]
    if args.config:
        entry += ["--config", args.config]
    entry += args.overrides
    cmd = torchrun_command(topo, entry=entry)
    print(topo.table(), flush=True)
    print("$ " + shlex.join(cmd), flush=True)
    if args.dry_run:
        return 0
    return subprocess.call(cmd)
