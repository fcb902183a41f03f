"""`node`: the node launcher every platform's launch file calls on each node (or, for MPI and
srun one-task-per-GPU jobs, in each rank).

    <package> node [key=value ...]        # inside a Kubeflow pod, TI-ONE task, Slurm step, ...
    <package> node --dry-run              # print the topology table and the torchrun command

It reads the platform's variables (topology.py), prints one table, applies config/nccl.env
without overriding what the platform set, waits for the master's port on non-master nodes, and
runs torchrun under supervise.py (restarts, stop signals, the preempted exit code). Ranks
started by mpirun/srun one per GPU become `train` (exec) directly.
"""

from __future__ import annotations

import os
import shlex
import socket
import sys
from pathlib import Path

from .config import Config, debug_requested
from .supervise import run_supervised
from .topology import (Topology, TopologyError, address_towards, default_nproc, detect, torchrun_command,
                       wait_for_master)


def project_root() -> Path:
    """The folder holding config/ (the working directory in the image, else the source checkout)."""
    here = Path.cwd()
    return here if (here / "config").is_dir() else Path(__file__).resolve().parents[2]


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines; '#' starts a comment; blank lines are skipped."""
    values = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                key, sep, value = line.partition("=")
                if sep:
                    values[key.strip()] = value.strip().strip("'\"")
    return values


def interface_matches(spec: str, names: list[str]) -> bool:
    """Whether an NCCL/Gloo interface spec (prefixes, '=' exact, '^' exclude) selects any interface."""
    if spec.startswith("^"):
        return True
    exact, items = spec.startswith("="), spec.lstrip("=").split(",")
    return any(n == i if exact else n.startswith(i) for n in names for i in items if i)


def apply_nccl_env(log=print, values: dict[str, str] | None = None) -> None:
    """Fabric settings from config/nccl.env (or `values` read from it elsewhere); a value the
    platform already injected wins (TI-ONE's HCC machines, for one, set their own NCCL_IB_*
    values). An interface this machine lacks (a laptop has no eth0) is skipped with a note rather
    than breaking every collective."""
    kept, missing = [], []
    interfaces = [name for _, name in socket.if_nameindex()]
    if values is None:
        values = read_env_file(project_root() / "config" / "nccl.env")
    for key, value in values.items():
        if key in os.environ:
            if os.environ[key] != value:
                kept.append(key)
            continue
        if key.endswith("_SOCKET_IFNAME") and not interface_matches(value, interfaces):
            missing.append(f"{key}={value}")
            continue
        os.environ[key] = value
    if debug_requested():
        debug = read_env_file(project_root() / "config" / "nccl-debug.env")
        os.environ.update(debug)
        dump_dir = os.path.dirname(debug.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "")) or "."
        try:
            os.makedirs(dump_dir, exist_ok=True)
        except OSError as exc:
            log(f"cannot create {dump_dir} for flight-recorder dumps ({exc.strerror}); is the shared storage mounted?")
        log(f"TRAIN_DEBUG=1: {', '.join(f'{k}={v}' for k, v in debug.items())}")
    if kept:
        log(f"kept the platform's {', '.join(sorted(kept))} over config/nccl.env")
    if missing:
        log(f"not applied: {', '.join(missing)} (no such interface here; this machine has {', '.join(interfaces)})")


def train_entry(package: str, config: str | None, overrides: list[str]) -> list[str]:
    entry = ["-m", package, "train"]
    if config:
        entry += ["--config", config]
    return entry + overrides


def check_before_start(cfg: Config, world_size: int | None) -> None:
    """Mistakes every rank would hit at once, reported before torchrun starts: under
    --max-restarts torchrun would otherwise restart the ranks into the same error several times."""
    from .data import read_meta
    from .rules import require_valid

    require_valid(cfg, world_size)
    read_meta(Path(cfg.data.dir))


def run_torchrun(topo: Topology, cfg: Config, entry: list[str], dry_run: bool, wait_timeout: float) -> int:
    if cfg.run.debug:
        os.environ["TRAIN_DEBUG"] = "1"  # the ranks and apply_nccl_env read it
    # An elastic PyTorchJob names its own restart budget (elasticPolicy.maxRestarts).
    restarts = int(os.environ.get("PET_MAX_RESTARTS") or cfg.cluster.max_restarts)
    log_dir = str(Path(cfg.run.output_dir) / "logs" / socket.gethostname()) if debug_requested() else None
    local_addr = address_towards(topo.master_addr) if topo.nnodes > 1 else None
    cmd = torchrun_command(topo, entry, restarts, cfg.cluster.stop_grace_seconds, log_dir, local_addr)
    print(topo.table(), flush=True)
    print("$ " + shlex.join(cmd), flush=True)
    if dry_run:
        return 0
    check_before_start(cfg, None if topo.min_nnodes else topo.nnodes * topo.nproc_per_node)
    apply_nccl_env()
    if topo.nnodes > 1 and topo.node_rank != 0:
        wait_for_master(topo.master_addr, topo.master_port, wait_timeout, log=lambda m: print(m, flush=True))
    # Restarted ranks must not share the agent's rendezvous store: its keys outlive an attempt and
    # the new ranks would read the dead ranks' addresses (pytorch/pytorch#135712: "Connection
    # refused" after a restart). Each attempt then gets a fresh store of its own.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    if log_dir:
        print(f"TRAIN_DEBUG=1: every rank's output also goes to {log_dir}/<run>/attempt_<n>/<local rank>/", flush=True)
    return run_supervised(cmd, cfg.run.output_dir, forward_signals=topo.platform != "slurm",
                          log=lambda m: print(m, flush=True))


def run_node(cfg: Config, config: str | None, overrides: list[str], package: str, dry_run: bool,
             wait_timeout: float, debug: bool = False) -> int:
    if debug:
        os.environ["TRAIN_DEBUG"] = "1"
    topo = detect(os.environ, default_nproc(cfg.cluster.gpus_per_node), cfg.cluster.nodes)
    if topo is None:
        raise TopologyError(
            "no platform variables found (PET_*, SLURM_*, TI-ONE's, OMPI_COMM_WORLD_*); on a dev machine use "
            "`launch devmachine`, or export the variables your platform would set"
        )
    if topo.role == "ps":
        print(topo.table(), flush=True)
        print("this is a PS-Worker parameter-server task: PyTorch data-parallel training has no parameter-server "
              "role, so there is nothing to run here; the worker tasks train. Exiting 0.", flush=True)
        return 0
    if not topo.per_process:
        return run_torchrun(topo, cfg, train_entry(package, config, overrides), dry_run, wait_timeout)
    # One process per rank, started by mpirun or srun: only the master needs to be named.
    if int(os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("SLURM_PROCID", "0"))) == 0:
        print(topo.table(), flush=True)
    if dry_run:
        return 0
    apply_nccl_env(log=lambda m: None)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = topo.master_addr, str(topo.master_port)
    # exec `train`: the rank keeps its pid (mpirun and srun watch it and signal it) and shows as
    # `-m <package> train`, which debug-dump and the MPIJob preStop hook look for.
    cmd = [sys.executable, "-u", *train_entry(package, config, overrides)]  # -u: lines reach mpirun as printed
    os.execv(cmd[0], cmd)
    return 1  # not reached
