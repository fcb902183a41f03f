"""Node-level topology: which platform started this node, how many nodes, which one this is,
processes per node, and where the master is (torchrun.py turns a Topology into the torchrun command).

Every platform describes a node in its own words. Each platform folder the project holds maps its
variables to one Topology in its environment.py: ROWS, rows of `Platform` (the variables that identify
it and a reader). mpirun's row is here, since any platform may start ranks with it (OMPI_COMM_WORLD_*:
one process per GPU, already started); a platform started by hand (`launch devmachine`) needs none.
An environment.py may also answer, where its platform has something to say (each is optional):

  process_rank_names(env)   the variables naming this process's rank, local rank and world size,
                            where the platform starts one process per rank itself
  max_restarts(env)         the restart budget the platform's job names, else None
  job_identity(env, topo)   what stays the same across the restarts of one of its jobs (run_lock.py)
  RUN_ON_NODE               how to run a command on a node of its running job (debug-dump's advice)
  storage_mounts(root)      the storage its launch files mount on its nodes (planning/check.py)
  site_problems(cfg)        its launch files against the site, where this machine can ask (check)

The helpers the readers share (whole numbers, ports, ranks, MPI hostfiles) are here. Ambiguous (two
platforms' variables at once) or contradictory variables raise TopologyError naming them. No torch
import here: the node launcher starts before any GPU work.
"""

from __future__ import annotations

import math
import os
import re
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .bounds import MAX_COUNT
from .config import ConfigError

DEFAULT_PORT = 29500


class TopologyError(ConfigError):
    """The platform's variables do not describe one consistent job."""


@dataclass(frozen=True)
class Topology:
    platform: str
    nnodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    min_nnodes: int | None = None
    """Elastic jobs (a node count given as min:max): torchrun waits for min..nnodes nodes."""
    per_process: bool = False
    """Ranks were started by MPI or the scheduler (one per GPU): run `train` directly, no torchrun."""
    role: str = "worker"
    """'ps' for PS-Worker parameter servers, which PyTorch training has no use for."""
    signals_every_process: bool = False
    """The scheduler signals every process of the job itself (a batch scheduler's step): the node
    launcher only ignores stop signals, as forwarding them would signal torchrun twice."""

    def table(self) -> str:
        nodes = f"{self.min_nnodes}..{self.nnodes}" if self.min_nnodes else str(self.nnodes)
        rows = [
            ("platform", self.platform + (" (one process per rank, no torchrun)" if self.per_process else "")),
            ("nodes", nodes),
            ("node rank", self.node_rank),
            ("processes per node", self.nproc_per_node),
            ("master", f"{self.master_addr}:{self.master_port}"),
            ("hostname", socket.gethostname()),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def default_nproc(gpus_per_node: int) -> int:
    """One process per visible GPU; without GPUs, one per CPU core up to gpus_per_node."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip():
        return len([d for d in visible.split(",") if d.strip()])
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
        gpus = out.stdout.count("GPU ") if out.returncode == 0 else 0
    except (OSError, subprocess.TimeoutExpired):
        gpus = 0
    return gpus or max(1, min(gpus_per_node, os.cpu_count() or 1))


# ---------------------------------------------------------------------------------------------
# Readers: one per platform, env -> Topology

SET_BY_JOB = "the platform sets it: fix the job's settings (or the value exported by hand)"


def whole_number(env: Mapping[str, str], name: str, least: int = 0, most: int = MAX_COUNT) -> int:
    """A whole-number variable from `least` (1 for a count of nodes or GPUs) to `most` (MAX_NODES
    for a count of nodes), in ASCII digits (int() would also read other scripts' digits)."""
    value = env.get(name, "")
    if not digits(value) or not least <= int(value) <= most:
        shown = repr(value) if len(value) <= 40 else f"{value[:20]!r}... ({len(value)} characters)"
        raise TopologyError(
            f"{name}={shown} must be a whole number of at least {least} and at most {most}; {SET_BY_JOB}"
        )
    return int(value)


def digits(text: str) -> bool:
    return re.fullmatch(r"[0-9]{1,40}", text.strip()) is not None


def port_of(env: Mapping[str, str], name: str) -> int:
    if name not in env:
        return DEFAULT_PORT
    port = env[name].strip()
    if digits(port) and 0 < int(port) < 65536:
        return int(port)
    raise TopologyError(f"{name}={port if digits(port) else repr(env[name])} is not a port (1-65535); {SET_BY_JOB}")


def require(env: Mapping[str, str], platform: str, *names: str) -> None:
    missing = [n for n in names if not env.get(n)]
    if missing:
        raise TopologyError(f"{platform}: {', '.join(missing)} not set; the platform injects it, or export it by hand")


def check_rank(platform: str, rank_name: str, rank: int, size_name: str, size: int) -> None:
    if size < 1:
        raise TopologyError(f"{platform}: {size_name}={size} must be at least 1; {SET_BY_JOB}")
    if not 0 <= rank < size:
        raise TopologyError(
            f"{platform}: {rank_name}={rank} is not in 0..{size - 1} ({size_name}={size}); {SET_BY_JOB}"
        )


def mpi_hosts(env: Mapping[str, str]) -> list[tuple[str, int]]:
    """(host, slots) from NODE_IP_SLOT_LIST ('ip:n,ip:n') or the OpenMPI hostfile ('host slots=n')."""
    if env.get("NODE_IP_SLOT_LIST"):
        hosts = []
        for item in env["NODE_IP_SLOT_LIST"].split(","):
            host, _, slots = item.strip().rpartition(":")
            if not host or not digits(slots) or not 1 <= int(slots) <= MAX_COUNT:
                raise TopologyError(f"NODE_IP_SLOT_LIST item {item!r} must be ip:slots, slots at least 1; {SET_BY_JOB}")
            hosts.append((host, int(slots)))
        return hosts
    path = env.get("OMPI_MCA_orte_default_hostfile", "/etc/mpi/hostfile")
    try:
        text = open(path).read()
    except OSError as exc:
        raise TopologyError(
            f"MPI hostfile {path} (OMPI_MCA_orte_default_hostfile) cannot be read: {exc.strerror}"
        ) from None
    # Entries are separated by newlines or, as some platforms write the file, by spaces on one line.
    hosts = [(host, int(slots)) for host, slots in re.findall(r"(\S+)\s+slots=(\d+)", text)]
    if not hosts or min(slots for _, slots in hosts) < 1:
        raise TopologyError(f"MPI hostfile {path} must list 'host slots=N' entries with N at least 1")
    return hosts


def read_openmpi(env: Mapping[str, str], nproc: int, nnodes_default: int) -> Topology:
    """One process per GPU started by mpirun: ranks come from OpenMPI, the master is the first host."""
    rank, size = whole_number(env, "OMPI_COMM_WORLD_RANK"), whole_number(env, "OMPI_COMM_WORLD_SIZE", 1)
    check_rank("openmpi", "OMPI_COMM_WORLD_RANK", rank, "OMPI_COMM_WORLD_SIZE", size)
    local_size = whole_number(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1) if env.get("OMPI_COMM_WORLD_LOCAL_SIZE") else size
    if env.get("MASTER_ADDR"):
        master = env["MASTER_ADDR"]
    elif (
        env.get("NODE_IP_SLOT_LIST") or env.get("OMPI_MCA_orte_default_hostfile") or os.path.exists("/etc/mpi/hostfile")
    ):
        master = mpi_hosts(env)[0][0]
    else:
        raise TopologyError("openmpi: set MASTER_ADDR (e.g. mpirun -x MASTER_ADDR=<first host>) or NODE_IP_SLOT_LIST")
    return Topology(
        "openmpi",
        math.ceil(size / local_size),
        rank // local_size,
        local_size,
        master,
        port_of(env, "MASTER_PORT"),
        per_process=True,
    )


@dataclass(frozen=True)
class Platform:
    name: str
    signature: tuple[str, ...]
    """Variables whose presence (all of them) identifies the platform."""
    read: Callable[[Mapping[str, str], int, int], Topology]
    unless: tuple[str, ...] = ()
    """Variables whose presence means another row owns this environment."""

    def matches(self, env: Mapping[str, str]) -> bool:
        return all(env.get(v) for v in self.signature) and not any(env.get(v) for v in self.unless)


OPENMPI = Platform("openmpi", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), read_openmpi)


def platform_environments() -> list:
    """launch/<platform>/environment.py of each platform the project holds, imported."""
    from .packages import platform_modules  # imported when asked, not with this module

    return platform_modules("environment")


def platform_answers(hook: str, *args) -> list:
    """What each platform present answers to the optional `hook` of its environment.py, None
    answers left out."""
    answers = (getattr(module, hook)(*args) for module in platform_environments() if hasattr(module, hook))
    return [answer for answer in answers if answer is not None]


def rows() -> list[Platform]:
    """mpirun's row, and the rows of the platforms the project holds (launch/<platform>/environment.py)."""
    return [OPENMPI, *(row for module in platform_environments() for row in getattr(module, "ROWS", []))]


def variables_looked_for() -> str:
    """The variables by which each row is known, by platform: what `node` looked for and did not find."""
    named: dict[str, tuple[str, ...]] = {}
    for row in rows():
        named.setdefault(row.name, row.signature)
    return "; ".join(f"{name}: {' and '.join(signature)}" for name, signature in named.items())


def detect(env: Mapping[str, str], nproc_default: int, nnodes_default: int = 1) -> Topology | None:
    """The Topology the environment describes, or None where no platform variables are set.
    The defaults fill what a platform does not say (GPUs per node, a node count it leaves out)."""
    found = {p.name: p for p in rows() if p.matches(env)}
    if len(found) > 1:
        described = "; ".join(f"{name} ({', '.join(p.signature)})" for name, p in found.items())
        raise TopologyError(
            f"variables of several platforms are set: {described}. Unset the ones that do not belong to "
            "this job (often left over in a shell or an image's ENV)"
        )
    if not found:
        return None
    return next(iter(found.values())).read(env, nproc_default, nnodes_default)


# ---------------------------------------------------------------------------------------------
# Process level and platform settings: the rest of what platforms inject, read here too


def process_ranks(env: Mapping[str, str]) -> tuple[int, int, int]:
    """(rank, local_rank, world_size) of this process, from whoever started it: torchrun (and any
    launcher that follows it) sets RANK/LOCAL_RANK/WORLD_SIZE; mpirun sets OMPI_COMM_WORLD_*; a
    scheduler that starts one process per rank names its own (its process_rank_names). RANK without
    LOCAL_RANK is not trusted: a platform may inject RANK and WORLD_SIZE counting nodes, not processes."""
    if "LOCAL_RANK" in env and "RANK" in env:
        names = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    elif "OMPI_COMM_WORLD_RANK" in env:
        names = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE")
    elif named := platform_answers("process_rank_names", env):
        names = named[0]
    else:
        return 0, 0, 1
    rank, local, size = names
    with_defaults = {local: "0", size: "1", **env}
    return whole_number(env, rank), whole_number(with_defaults, local), whole_number(with_defaults, size, 1)


def platform_max_restarts(env: Mapping[str, str]) -> int | None:
    """The restart budget the platform's job names itself (its environment.py's max_restarts), else
    None: cluster.max_restarts applies."""
    return next(iter(platform_answers("max_restarts", env)), None)
