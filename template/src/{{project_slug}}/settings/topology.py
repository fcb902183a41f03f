"""Node-level topology: which platform started this node, how many nodes, which one this is,
processes per node, and where the master is. The one place platform variables are read
(torchrun.py turns a Topology into the torchrun command).

Every platform describes a node in its own words. One table (PLATFORMS) maps each platform's
variables to one Topology; adding a platform is one reader function and one row:

  devmachine   torchrun-style flags given to `launch devmachine` (no variables)
  kubeflow     PET_NNODES (n or min:max), PET_NODE_RANK, PET_NPROC_PER_NODE, PET_MASTER_ADDR/PORT
  tione-ddp    WORLD_SIZE and RANK count NODES; MASTER_ADDR/PORT, GPU_NUM_PER_NODE, NODE_LIST, INDEX
  tione-mpi    /etc/mpi/hostfile (OMPI_MCA_orte_default_hostfile), NODE_IP_SLOT_LIST, GPU_NUM
  tione-ray    HEAD_ADDR, HEAD_PORT, RANK (0 = head)
  tione-ps     TF_CONFIG: the worker list is the torch world; ps tasks have nothing to do
  slurm        SLURM_NNODES, SLURM_NODEID, SLURM_JOB_NODELIST, SLURM_NTASKS_PER_NODE, SLURM_PROCID
  openmpi      OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK: one process per GPU, already started

Ambiguous (two platforms' variables at once) or contradictory variables raise TopologyError
naming them. No torch import here: the node launcher starts before any GPU work.
"""

from __future__ import annotations

import json
import math
import os
import re
import socket
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from .bounds import MAX_COUNT, MAX_NODES
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
    """Elastic jobs (Kubeflow PET_NNODES=min:max): torchrun waits for min..nnodes nodes."""
    per_process: bool = False
    """Ranks were started by MPI or srun (one per GPU): run `train` directly, no torchrun."""
    role: str = "worker"
    """'ps' for PS-Worker parameter servers, which PyTorch training has no use for."""

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


def _int(env: Mapping[str, str], name: str, least: int = 0, most: int = MAX_COUNT) -> int:
    """A whole-number variable from `least` (1 for a count of nodes or GPUs) to `most` (MAX_NODES
    for a count of nodes), in ASCII digits (int() would also read other scripts' digits)."""
    value = env.get(name, "")
    if not _digits(value) or not least <= int(value) <= most:
        shown = repr(value) if len(value) <= 40 else f"{value[:20]!r}... ({len(value)} characters)"
        raise TopologyError(
            f"{name}={shown} must be a whole number of at least {least} and at most {most}; {SET_BY_JOB}"
        )
    return int(value)


def _digits(text: str) -> bool:
    return re.fullmatch(r"[0-9]{1,40}", text.strip()) is not None


def _port(env: Mapping[str, str], name: str) -> int:
    if name not in env:
        return DEFAULT_PORT
    port = env[name].strip()
    if _digits(port) and 0 < int(port) < 65536:
        return int(port)
    raise TopologyError(f"{name}={port if _digits(port) else repr(env[name])} is not a port (1-65535); {SET_BY_JOB}")


def _require(env: Mapping[str, str], platform: str, *names: str) -> None:
    missing = [n for n in names if not env.get(n)]
    if missing:
        raise TopologyError(f"{platform}: {', '.join(missing)} not set; the platform injects it, or export it by hand")


def _check_rank(platform: str, rank_name: str, rank: int, size_name: str, size: int) -> None:
    if size < 1:
        raise TopologyError(f"{platform}: {size_name}={size} must be at least 1; {SET_BY_JOB}")
    if not 0 <= rank < size:
        raise TopologyError(
            f"{platform}: {rank_name}={rank} is not in 0..{size - 1} ({size_name}={size}); {SET_BY_JOB}"
        )


def read_kubeflow(env: Mapping[str, str], nproc: int, nnodes_default: int) -> Topology:
    _require(env, "kubeflow", "PET_NNODES")
    spec = env["PET_NNODES"].strip()
    match = re.fullmatch(r"([0-9]+)(?::([0-9]+))?", spec)
    if not match:
        raise TopologyError(f"PET_NNODES={spec!r} must be a node count or min:max; {SET_BY_JOB}")
    low, high = int(match.group(1)), int(match.group(2) or match.group(1))
    if not 1 <= low <= high <= MAX_NODES:
        raise TopologyError(
            f"PET_NNODES={spec!r}: the minimum must be between 1 and the maximum, at most {MAX_NODES}; {SET_BY_JOB}"
        )
    node_rank = _int(env, "PET_NODE_RANK") if "PET_NODE_RANK" in env else _int(env, "RANK") if "RANK" in env else 0
    _check_rank("kubeflow", "PET_NODE_RANK", node_rank, "PET_NNODES", high)
    per_node = env.get("PET_NPROC_PER_NODE", "auto").strip()
    if per_node not in ("auto", "gpu", "cpu") and not (_digits(per_node) and 0 < int(per_node) <= MAX_COUNT):
        raise TopologyError(f"PET_NPROC_PER_NODE={per_node!r} must be auto or at least 1; {SET_BY_JOB}")
    if env.get("PET_RDZV_ENDPOINT"):
        # elasticPolicy: the operator names the c10d store (worker-0's Service unless rdzvHost is
        # set) and, for Worker-only jobs, injects no PET_MASTER_ADDR and no PET_NODE_RANK.
        endpoint = env["PET_RDZV_ENDPOINT"].strip()
        host, _, port = endpoint.rpartition(":")
        if not host or not _digits(port) or not 0 < int(port) < 65536:
            raise TopologyError(f"PET_RDZV_ENDPOINT={endpoint!r} must be host:port")
        master_addr, master_port, elastic = host, int(port), True
    else:
        _require(env, "kubeflow", "PET_MASTER_ADDR")
        master_addr, master_port, elastic = env["PET_MASTER_ADDR"], _port(env, "PET_MASTER_PORT"), low != high
    return Topology(
        platform="kubeflow",
        nnodes=high,
        node_rank=node_rank,
        nproc_per_node=int(per_node) if _digits(per_node) else nproc,
        master_addr=master_addr,
        master_port=master_port,
        # Elastic jobs rendezvous with c10d even at a fixed size (ranks are not given per pod).
        min_nnodes=low if elastic else None,
    )


def read_tione_ddp(env: Mapping[str, str], nproc: int, nnodes_default: int) -> Topology:
    _require(env, "tione-ddp", "WORLD_SIZE", "RANK", "MASTER_ADDR")
    nnodes, node_rank = _int(env, "WORLD_SIZE", 1, MAX_NODES), _int(env, "RANK")  # both count nodes on TI-ONE
    _check_rank("tione-ddp", "RANK", node_rank, "WORLD_SIZE", nnodes)
    if "INDEX" in env and _int(env, "INDEX") != node_rank:
        raise TopologyError(f"tione-ddp: INDEX={env['INDEX']} and RANK={node_rank} disagree about this node's rank")
    if env.get("NODE_LIST"):
        listed = [n for n in env["NODE_LIST"].split(",") if n.strip()]
        if len(listed) != nnodes:
            raise TopologyError(f"tione-ddp: NODE_LIST names {len(listed)} nodes but WORLD_SIZE={nnodes}")
    per_node = _int(env, "GPU_NUM_PER_NODE", 1) if env.get("GPU_NUM_PER_NODE") else nproc
    if env.get("GPU_NUM") and _int(env, "GPU_NUM") != per_node * nnodes:
        raise TopologyError(
            f"tione-ddp: GPU_NUM={env['GPU_NUM']} != GPU_NUM_PER_NODE={per_node} x WORLD_SIZE={nnodes} nodes"
        )
    return Topology("tione-ddp", nnodes, node_rank, per_node, env["MASTER_ADDR"], _port(env, "MASTER_PORT"))


def mpi_hosts(env: Mapping[str, str]) -> list[tuple[str, int]]:
    """(host, slots) from NODE_IP_SLOT_LIST ('ip:n,ip:n') or the OpenMPI hostfile ('host slots=n')."""
    if env.get("NODE_IP_SLOT_LIST"):
        hosts = []
        for item in env["NODE_IP_SLOT_LIST"].split(","):
            host, _, slots = item.strip().rpartition(":")
            if not host or not _digits(slots) or not 1 <= int(slots) <= MAX_COUNT:
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
    # Entries are separated by newlines or, as TI-ONE documents it, by spaces on one line.
    hosts = [(host, int(slots)) for host, slots in re.findall(r"(\S+)\s+slots=(\d+)", text)]
    if not hosts or min(slots for _, slots in hosts) < 1:
        raise TopologyError(f"MPI hostfile {path} must list 'host slots=N' entries with N at least 1")
    return hosts


def read_tione_mpi(env: Mapping[str, str], nproc: int, nnodes_default: int) -> Topology:
    """Node-level view of an MPI job (for the start script; ranks themselves are `openmpi`)."""
    hosts = mpi_hosts(env)
    source = (
        "NODE_IP_SLOT_LIST"
        if env.get("NODE_IP_SLOT_LIST")
        else f"the hostfile {env.get('OMPI_MCA_orte_default_hostfile', '/etc/mpi/hostfile')}"
    )
    slots = {s for _, s in hosts}
    if len(slots) != 1:
        raise TopologyError(
            f"tione-mpi: {source} gives nodes different slot counts {sorted(slots)}; use the same GPUs per node"
        )
    per_node = slots.pop()
    if env.get("GPU_NUM") and _int(env, "GPU_NUM") != per_node * len(hosts):
        raise TopologyError(f"tione-mpi: GPU_NUM={env['GPU_NUM']} != {len(hosts)} hosts x {per_node} slots")
    names = {socket.gethostname(), socket.getfqdn()}
    try:  # NODE_IP_SLOT_LIST lists IPs: this node's own addresses find it there
        names |= set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    # Only the start script reads this (to pick the launcher); ranks get theirs from mpirun.
    node_rank = next((i for i, (h, _) in enumerate(hosts) if h in names or h.split(".")[0] in names), 0)
    return Topology(
        "tione-mpi", len(hosts), node_rank, per_node, env.get("MASTER_ADDR") or hosts[0][0], _port(env, "MASTER_PORT")
    )


def read_openmpi(env: Mapping[str, str], nproc: int, nnodes_default: int) -> Topology:
    """One process per GPU started by mpirun: ranks come from OpenMPI, the master is the first host."""
    rank, size = _int(env, "OMPI_COMM_WORLD_RANK"), _int(env, "OMPI_COMM_WORLD_SIZE", 1)
    _check_rank("openmpi", "OMPI_COMM_WORLD_RANK", rank, "OMPI_COMM_WORLD_SIZE", size)
    local_size = _int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1) if env.get("OMPI_COMM_WORLD_LOCAL_SIZE") else size
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
        _port(env, "MASTER_PORT"),
        per_process=True,
    )


def read_tione_ray(env: Mapping[str, str], nproc: int, nnodes_default: int) -> Topology:
    _require(env, "tione-ray", "HEAD_ADDR", "HEAD_PORT")
    node_rank = _int(env, "RANK") if env.get("RANK") else 0
    nnodes = _int(env, "WORLD_SIZE", 1, MAX_NODES) if env.get("WORLD_SIZE") else nnodes_default
    _check_rank("tione-ray", "RANK", node_rank, "the node count (WORLD_SIZE or cluster.nodes)", nnodes)
    return Topology("tione-ray", nnodes, node_rank, nproc, env["HEAD_ADDR"], _port(env, "HEAD_PORT"))


def read_tione_ps(env: Mapping[str, str], nproc: int, nnodes_default: int) -> Topology:
    try:
        tf_config = json.loads(env["TF_CONFIG"])
        cluster, task = tf_config["cluster"], tf_config["task"]
        kind, index = task["type"], int(task["index"])
    except (ValueError, KeyError, TypeError):
        raise TopologyError("TF_CONFIG must be JSON with cluster.worker and task.type/task.index") from None
    # A chief, when present, is rank 0 of the torch world; the workers follow.
    world = list(cluster.get("chief", [])) + list(cluster.get("worker", []))
    if not world:
        raise TopologyError("TF_CONFIG lists no worker (or chief) tasks to train on")
    if kind == "ps":
        return Topology("tione-ps", len(world), index, nproc, world[0].rpartition(":")[0], DEFAULT_PORT, role="ps")
    if kind not in ("worker", "chief"):
        raise TopologyError(f"TF_CONFIG task.type={kind!r} is not ps, worker or chief")
    node_rank = index + (len(cluster.get("chief", [])) if kind == "worker" else 0)
    _check_rank("tione-ps", "TF_CONFIG task.index", node_rank, "the worker list", len(world))
    host, _, port = world[0].rpartition(":")
    per_node = _int(env, "GPU_NUM_PER_NODE", 1) if env.get("GPU_NUM_PER_NODE") else nproc
    # The platform opened worker 0's TF port and no TF server uses it in a PyTorch job: torch's
    # store takes it unless MASTER_PORT says otherwise.
    master_port = (
        _port(env, "MASTER_PORT")
        if "MASTER_PORT" in env
        else int(port)
        if _digits(port) and 0 < int(port) < 65536
        else DEFAULT_PORT
    )
    return Topology("tione-ps", len(world), node_rank, per_node, host or world[0], master_port)


def slurm_hostnames(nodelist: str) -> list[str]:
    """Expand a compressed Slurm node list (node[01-03]) with `scontrol show hostnames`; a plain
    comma-separated list has nothing to expand."""
    if not re.search(r"[\[\]\s]", nodelist):
        return [host for host in nodelist.split(",") if host]
    try:
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30)
    except OSError:
        raise TopologyError("slurm: `scontrol` is not on PATH, so SLURM_JOB_NODELIST cannot be expanded") from None
    hosts = out.stdout.split()
    if out.returncode != 0 or not hosts:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        raise TopologyError(f"slurm: `scontrol show hostnames {nodelist}` failed ({last}): check SLURM_JOB_NODELIST")
    return hosts


def read_slurm(env: Mapping[str, str], nproc: int, nnodes_default: int) -> Topology:
    _require(env, "slurm", "SLURM_NNODES", "SLURM_JOB_NODELIST")
    nnodes = _int(env, "SLURM_NNODES", 1, MAX_NODES)
    node_rank = _int(env, "SLURM_NODEID") if env.get("SLURM_NODEID") else 0
    _check_rank("slurm", "SLURM_NODEID", node_rank, "SLURM_NNODES", nnodes)
    hosts = slurm_hostnames(env["SLURM_JOB_NODELIST"])
    if len(hosts) != nnodes:
        raise TopologyError(f"slurm: SLURM_JOB_NODELIST expands to {len(hosts)} hosts but SLURM_NNODES={nnodes}")
    # '2(x3)' means 2 tasks on each of 3 nodes
    tasks = _int(
        {"SLURM_NTASKS_PER_NODE": env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]}, "SLURM_NTASKS_PER_NODE", 1
    )
    per_task = tasks > 1 and "SLURM_PROCID" in env and "SLURM_STEP_ID" in env
    per_node = tasks if per_task else (_int(env, "SLURM_GPUS_ON_NODE", 1) if env.get("SLURM_GPUS_ON_NODE") else nproc)
    # The port follows the job id so two jobs sharing a first node do not collide.
    port = _port(env, "MASTER_PORT") if "MASTER_PORT" in env else 20000 + _int(env, "SLURM_JOB_ID") % 20000
    return Topology(
        "slurm", nnodes, node_rank, per_node, env.get("MASTER_ADDR") or hosts[0], port, per_process=per_task
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


PLATFORMS = [
    Platform("openmpi", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"), read_openmpi),
    Platform("kubeflow", ("PET_NNODES",), read_kubeflow),
    # mpirun inside a Slurm allocation: the ranks are MPI's, the allocation only hosts them.
    Platform("slurm", ("SLURM_JOB_ID", "SLURM_NNODES"), read_slurm, unless=("OMPI_COMM_WORLD_RANK",)),
    Platform("tione-ps", ("TF_CONFIG",), read_tione_ps),
    Platform("tione-ray", ("HEAD_ADDR", "HEAD_PORT"), read_tione_ray),
    Platform("tione-mpi", ("NODE_IP_SLOT_LIST",), read_tione_mpi, unless=("OMPI_COMM_WORLD_RANK",)),
    Platform(
        "tione-mpi",
        ("OMPI_MCA_orte_default_hostfile",),
        read_tione_mpi,
        unless=("OMPI_COMM_WORLD_RANK", "NODE_IP_SLOT_LIST"),
    ),
    Platform(
        "tione-ddp",
        ("GPU_NUM_PER_NODE", "WORLD_SIZE", "MASTER_ADDR"),
        read_tione_ddp,
        unless=("PET_NNODES", "OMPI_COMM_WORLD_RANK"),
    ),
]


def detect(env: Mapping[str, str], nproc_default: int, nnodes_default: int = 1) -> Topology | None:
    """The Topology the environment describes, or None where no platform variables are set.
    The defaults fill what a platform does not say (GPUs per node, TI-ONE Ray's node count)."""
    found = {p.name: p for p in PLATFORMS if p.matches(env)}
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
    """(rank, local_rank, world_size) of this process, from whoever started it: torchrun (and Ray
    Train) set RANK/LOCAL_RANK/WORLD_SIZE; mpirun sets OMPI_COMM_WORLD_*; srun sets SLURM_PROCID,
    SLURM_LOCALID and SLURM_NTASKS. RANK without LOCAL_RANK is not trusted: TI-ONE's DDP mode
    injects RANK and WORLD_SIZE counting nodes, not processes."""
    if "LOCAL_RANK" in env and "RANK" in env:
        names = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
    elif "OMPI_COMM_WORLD_RANK" in env:
        names = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_SIZE")
    elif "SLURM_PROCID" in env and "SLURM_STEP_ID" in env and _int({"SLURM_NTASKS": "1", **env}, "SLURM_NTASKS", 1) > 1:
        names = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS")
    else:
        return 0, 0, 1
    rank, local, size = names
    with_defaults = {local: "0", size: "1", **env}
    return _int(env, rank), _int(with_defaults, local), _int(with_defaults, size, 1)


def platform_max_restarts(env: Mapping[str, str]) -> int | None:
    """The restart budget a platform names itself (an elastic PyTorchJob's elasticPolicy.maxRestarts
    arrives as PET_MAX_RESTARTS), else None: cluster.max_restarts applies."""
    return _int(env, "PET_MAX_RESTARTS") if env.get("PET_MAX_RESTARTS") else None


def tione_variables(env: Mapping[str, str]) -> list[str]:
    """The TI-ONE variables set here (non-empty when running inside a TI-ONE task)."""
    return sorted({v for p in PLATFORMS if p.name.startswith("tione") and p.matches(env) for v in p.signature})
