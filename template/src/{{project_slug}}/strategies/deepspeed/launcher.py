"""`launch devmachine --launcher deepspeed`: DeepSpeed's own launcher (`deepspeed`, its runner)
instead of torchrun, on one machine or on several listed in a hostfile.

    <package> launch devmachine --launcher deepspeed                          # this machine, every GPU
    <package> launch devmachine --launcher deepspeed --nnodes 2               # from node 0: ssh (pdsh) to the
                                                                              #   hosts of launch/devmachine/hostfile
    <package> launch devmachine --launcher deepspeed --nnodes 2 --ds-launcher openmpi   # mpirun instead of pdsh
    <package> launch devmachine --launcher deepspeed --nnodes 2 --no-ssh --node-rank 1 --master-addr 10.0.0.1
                                                                              # on every node, no ssh (like torchrun)
    <package> launch devmachine --launcher deepspeed --dry-run                # print the deepspeed command only

The command is `python -m deepspeed.launcher.runner ...` (what the `deepspeed` script runs) with this
interpreter, `--module <package> train` and `--no_local_rank` (ranks read LOCAL_RANK from the
environment; a `--local_rank=N` argument would be taken for a config override). Hostfile lines are
MPI style, `<host> slots=<GPUs>`. With ssh, the hosts must accept passwordless ssh from node 0 and
hold this project and Python at the same paths. Processes started over ssh do not inherit this
shell's environment: the settings of config/nccl.env (as applied here), TRAIN_DEBUG and the master
address are written to <run.output_dir>/deepspeed_env and named by DS_ENV_FILE, which DeepSpeed's
runner passes on to every node (its `.deepspeed_env` mechanism).

Backends: pdsh (DeepSpeed's default, ssh) and openmpi (mpirun). Not offered: mvapich (its runner
gives the ranks no master address), mpich and impi (their own MPI stacks; use them through
`deepspeed` directly), slurm (`launch slurm --launcher deepspeed`).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import sys
from argparse import ArgumentParser, Namespace
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ...cluster.nccl_env import apply_nccl_env
from ...cluster.network import wait_for_master
from ...cluster.supervise import run_supervised
from ...cluster.torchrun import check_before_start, train_entry
from ...settings.config import Config, ConfigError, debug_requested, project_root, read_env_file, under_root
from ...settings.packages import require_package
from ...settings.topology import default_nproc

HOSTFILE = Path("launch") / "devmachine" / "hostfile"
# DeepSpeed's multi-node backends offered here, and the program each needs on node 0.
BACKENDS = {"pdsh": "pdsh", "openmpi": "ompi_info"}
_LINE = re.compile(r"(\S+)\s+slots=(\d+)\s*")


def add_arguments(p: ArgumentParser) -> None:
    """The options of `launch devmachine` that steer DeepSpeed's launcher (--launcher is the platform's)."""
    p.add_argument(
        "--hostfile",
        metavar="FILE",
        help=f"deepspeed, several nodes: '<host> slots=<GPUs>' lines (default: {HOSTFILE})",
    )
    p.add_argument(
        "--ds-launcher",
        choices=sorted(BACKENDS),
        default="pdsh",
        help="deepspeed, several nodes: how node 0 starts the others (default pdsh, i.e. ssh)",
    )
    p.add_argument(
        "--no-ssh",
        action="store_true",
        help="deepspeed, several nodes: run this on every node with --node-rank, as with torchrun",
    )


def refuse_deepspeed_options(args: Namespace) -> None:
    """The DeepSpeed-only options given without --launcher deepspeed would silently do nothing."""
    given = [
        flag
        for flag, on in (
            ("--hostfile", args.hostfile),
            ("--ds-launcher", args.ds_launcher != "pdsh"),
            ("--no-ssh", args.no_ssh),
        )
        if on
    ]
    if given:
        raise ConfigError(f"{', '.join(given)} belong to DeepSpeed's launcher: add --launcher deepspeed")


def read_hostfile(path: Path) -> list[tuple[str, int]]:
    """(host, slots) of every '<host> slots=<n>' line; '#' comments and blank lines are skipped."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(
            f"hostfile {path} cannot be read ({exc.strerror}): write one '<host> slots=<GPUs>' line "
            f"per node (example: {HOSTFILE}), or pass --hostfile"
        ) from None
    hosts: list[tuple[str, int]] = []
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.fullmatch(line)
        if not match or int(match.group(2)) < 1:
            raise ConfigError(f"{path}:{number}: {line!r} is not '<host> slots=<GPUs>' (e.g. node-0 slots=8)")
        if match.group(1) in dict(hosts):
            raise ConfigError(f"{path}:{number}: host {match.group(1)} is listed twice")
        hosts.append((match.group(1), int(match.group(2))))
    if not hosts:
        raise ConfigError(f"hostfile {path} lists no '<host> slots=<GPUs>' line")
    return hosts


@dataclass(frozen=True)
class Plan:
    mode: str
    """'local' (this machine), 'ssh' (node 0 starts the others) or 'no-ssh' (run on every node)."""
    nnodes: int
    node_rank: int
    hosts: tuple[tuple[str, int], ...]
    master_addr: str
    master_port: int

    def describe(self) -> str:
        if self.mode == "local":
            return f"deepspeed launcher: this machine, {self.hosts[0][1]} process(es), master port {self.master_port}"
        listed = ", ".join(f"{h} slots={s}" for h, s in self.hosts)
        how = "starts every node from here" if self.mode == "ssh" else f"this is node {self.node_rank}"
        return (
            f"deepspeed launcher: {self.nnodes} node(s) ({listed}), {how}; master {self.master_addr}:{self.master_port}"
        )


def resolve_hostfile(args: Namespace) -> Path:
    path = Path(args.hostfile) if args.hostfile else HOSTFILE
    return path if path.is_absolute() else (Path.cwd() / path if args.hostfile else project_root() / path)


def plan_launch(args: Namespace, cfg: Config) -> Plan:
    """Where the processes go, from the options and (several nodes) the hostfile."""
    listed, path = [], resolve_hostfile(args)
    if args.hostfile or (args.nnodes or 1) > 1:
        listed = read_hostfile(path)
    nnodes = args.nnodes or max(len(listed), 1)
    if nnodes == 1:  # DeepSpeed itself launches one node locally, whatever host the hostfile names
        if args.no_ssh or args.node_rank:
            raise ConfigError("--no-ssh and --node-rank apply to several nodes: add --nnodes N and a hostfile")
        nproc = args.nproc_per_node or default_nproc(cfg.cluster.gpus_per_node)
        return Plan("local", 1, 0, (("localhost", nproc),), "127.0.0.1", args.master_port)
    if nnodes > len(listed):
        raise ConfigError(f"--nnodes {nnodes} but {path} lists {len(listed)} host(s): add a line per node")
    hosts = tuple((host, args.nproc_per_node or slots) for host, slots in listed[:nnodes])
    master = args.master_addr or hosts[0][0]  # rank 0 runs on the first host
    if args.no_ssh:
        if args.node_rank is None or not 0 <= args.node_rank < nnodes:
            raise ConfigError(
                f"--no-ssh: pass --node-rank (0 on {hosts[0][0]}, the first host, up to {nnodes - 1}) "
                "and run the same command on every node"
            )
        return Plan("no-ssh", nnodes, args.node_rank, hosts, master, args.master_port)
    if args.node_rank:
        raise ConfigError(
            f"--node-rank {args.node_rank}: with ssh, run this once, on the first host of {path} "
            f"({hosts[0][0]}); it starts every node. Or pass --no-ssh and run it on every node"
        )
    if args.ds_launcher != "pdsh" and (nnodes != len(listed) or args.nproc_per_node):
        # DeepSpeed's MPI backends take the hostfile as it is (no --num_nodes/--num_gpus).
        raise ConfigError(
            f"--ds-launcher {args.ds_launcher} starts every host of {path} with its slots: list exactly "
            "the nodes to use there, their slots as processes, and drop --nnodes/--nproc-per-node"
        )
    return Plan("ssh", nnodes, 0, hosts, master, args.master_port)


def runner_command(plan: Plan, args: Namespace, package: str) -> list[str]:
    """The deepspeed runner's command line for the plan."""
    cmd = [sys.executable, "-m", "deepspeed.launcher.runner"]
    if plan.mode == "local":
        nproc = plan.hosts[0][1]
        visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        # With --num_gpus DeepSpeed drops CUDA_VISIBLE_DEVICES and takes GPUs 0..n-1: name the visible ones.
        cmd += ["--include", f"localhost:{','.join(visible[:nproc])}"] if visible else ["--num_gpus", str(nproc)]
        cmd += ["--master_port", str(plan.master_port)]
    else:
        cmd += ["--hostfile", str(resolve_hostfile(args))]
        if plan.mode == "no-ssh":
            cmd += ["--no_ssh", "--node_rank", str(plan.node_rank)]
        else:
            cmd += ["--launcher", args.ds_launcher]
        if plan.mode == "no-ssh" or args.ds_launcher == "pdsh":
            cmd += ["--num_nodes", str(plan.nnodes)]
            if args.nproc_per_node:
                cmd += ["--num_gpus", str(args.nproc_per_node)]
        cmd += ["--master_addr", plan.master_addr, "--master_port", str(plan.master_port)]
    entry = train_entry(package, args.config, args.overrides)  # ["-m", package, "train", ...]
    return cmd + ["--no_local_rank", "--module", *entry[1:]]


def remote_env(plan: Plan) -> dict[str, str]:
    """What every node's ranks need from this shell: config/nccl.env (and config/nccl-debug.env
    under TRAIN_DEBUG) as applied here, TRAIN_DEBUG, and the master (the mpirun backend passes none).
    Before apply_nccl_env (a dry run) the files' values stand in for the applied ones."""
    root = project_root() / "config"
    files = read_env_file(root / "nccl.env")
    if debug_requested():
        files.update(read_env_file(root / "nccl-debug.env"))
    values = {name: os.environ.get(name, value) for name, value in files.items()}
    if "TRAIN_DEBUG" in os.environ:
        values["TRAIN_DEBUG"] = os.environ["TRAIN_DEBUG"]
    return {**values, "MASTER_ADDR": plan.master_addr, "MASTER_PORT": str(plan.master_port)}


def write_remote_env(cfg: Config, values: dict[str, str]) -> Path:
    """KEY=VALUE lines for DS_ENV_FILE (DeepSpeed splits each line at its first '=', no comments)."""
    path = under_root(cfg.run.output_dir) / "deepspeed_env"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{key}={value}\n" for key, value in values.items()))
    except OSError as exc:
        raise ConfigError(f"cannot write {path} ({exc.strerror}): run.output_dir must be writable here") from None
    return path


def launch(
    plan: Plan, args: Namespace, cfg: Config, package: str, dry_run: bool, on_start: Callable[[], None] | None = None
) -> int:
    """Run DeepSpeed's runner for the plan (plan_launch) under the supervisor; dry_run: print it only.
    on_start: called once the checks passed, just before the runner starts."""
    cmd = runner_command(plan, args, package)
    print(plan.describe(), flush=True)
    print("$ " + shlex.join(cmd), flush=True)
    if dry_run:
        if plan.mode == "ssh":
            print("passed to every node (DS_ENV_FILE): " + " ".join(f"{k}={v}" for k, v in remote_env(plan).items()))
        return 0
    require_package("deepspeed", "deepspeed", "--launcher deepspeed")
    if plan.mode == "ssh" and shutil.which(BACKENDS[args.ds_launcher]) is None:
        raise ConfigError(
            f"--ds-launcher {args.ds_launcher} needs `{BACKENDS[args.ds_launcher]}` on this node's PATH. Fixes: "
            "1) install it (pdsh: `apt-get install pdsh`; openmpi: `apt-get install openmpi-bin`); 2) another "
            "--ds-launcher; 3) --no-ssh with --node-rank on every node"
        )
    check_before_start(cfg, sum(slots for _, slots in plan.hosts))
    if on_start is not None:
        on_start()
    apply_nccl_env()
    if plan.mode == "ssh":
        # After apply_nccl_env: what it skipped (an interface this node lacks) is not passed on either.
        applied = {k: v for k, v in remote_env(plan).items() if k in os.environ or k.startswith("MASTER_")}
        os.environ["DS_ENV_FILE"] = str(write_remote_env(cfg, applied))
    if plan.mode == "no-ssh" and plan.node_rank != 0:
        wait_for_master(plan.master_addr, plan.master_port, args.wait_timeout, log=lambda m: print(m, flush=True))
    # DeepSpeed's single-node runner dies on SIGTERM and leaves its ranks running: the supervisor
    # signals the runner's whole process group instead (ranks included; they save at the next step,
    # within the 30 s DeepSpeed's launch.py gives them) and waits for all of it.
    return run_supervised(
        cmd,
        cfg.run.output_dir,
        forward_signals=True,
        log=lambda m: print(m, flush=True),
        whole_group_seconds=cfg.cluster.stop_grace_seconds,
        grace_seconds=cfg.cluster.stop_grace_seconds,
    )
