"""`launch <platform>`: the one command that starts training on a platform.

    <package> launch devmachine                                   # one node, all its GPUs
    <package> launch devmachine --nnodes 2 --node-rank 0 --master-addr 10.0.0.1   # on node 0
    <package> launch devmachine --nnodes 2 --node-rank 1 --master-addr 10.0.0.1   # on node 1
    <package> launch devmachine --launcher deepspeed              # DeepSpeed's own launcher (launch_deepspeed.py)
    <package> launch kubeflow | slurm | tione [--dry-run]          # see launch/<platform>/README.md

Every platform module has add_arguments(parser) and launch(args, cfg, package) -> int; arguments
after the options (key=value) reach `train` as config overrides.
"""

from __future__ import annotations

import importlib
import os
from argparse import ArgumentParser, Namespace

from . import launch_deepspeed
from .config import Config, ConfigError
from .node import project_root, run_torchrun, train_entry
from .topology import Topology, default_nproc

PLATFORMS = {
    "devmachine": __name__,
    "kubeflow": f"{__package__}.launch_kubeflow",
    "tione": f"{__package__}.launch_tione",
    "slurm": f"{__package__}.launch_slurm",
}


def platform_module(name: str):
    return importlib.import_module(PLATFORMS[name])


def require_generated(platform: str) -> None:
    """Launch files exist only for the platforms chosen at generation time."""
    if not (project_root() / "launch" / platform).is_dir():
        raise ConfigError(
            f"this project has no launch/{platform}/: add the platform with "
            f"`copier update --data 'platforms=[..., {platform}]'` (list every platform you want)"
        )


def add_arguments(p: ArgumentParser) -> None:
    p.add_argument("--nnodes", type=int, help="nodes in the job (default: 1)")
    p.add_argument("--node-rank", type=int, help="this node's rank, 0 on the master")
    p.add_argument("--master-addr", help="address of node 0 (multi-node only)")
    p.add_argument("--master-port", type=int, default=29500)
    p.add_argument("--nproc-per-node", type=int, help="processes on this node (default: GPUs, or CPU cores)")
    p.add_argument("--wait-timeout", type=float, default=900, help="seconds a worker node waits for the master")
    p.add_argument("--debug", action="store_true", help="TRAIN_DEBUG=1: NCCL INFO logs, flight recorder dumps")
    launch_deepspeed.add_arguments(p)  # --launcher torchrun|deepspeed, --hostfile, --ds-launcher, --no-ssh


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
        nproc_per_node=args.nproc_per_node or default_nproc(cfg.cluster.gpus_per_node),
        master_addr=args.master_addr or "127.0.0.1",
        master_port=args.master_port,
    )


def launch(args: Namespace, cfg: Config, package: str) -> int:
    if args.launcher == "deepspeed":
        return launch_deepspeed.launch(args, cfg, package)
    launch_deepspeed.refuse_deepspeed_options(args)
    topo = devmachine_topology(args, cfg)
    if args.debug:
        os.environ["TRAIN_DEBUG"] = "1"
    return run_torchrun(topo, cfg, train_entry(package, args.config, args.overrides), args.dry_run, args.wait_timeout)


def run_launch(args: Namespace, cfg: Config, package: str) -> int:
    if args.platform != "devmachine":
        require_generated(args.platform)
    return platform_module(args.platform).launch(args, cfg, package)
