"""What TI-ONE injects in each of its modes, as a Topology: DDP (WORLD_SIZE and RANK count NODES;
MASTER_ADDR/PORT, GPU_NUM_PER_NODE, NODE_LIST, INDEX), MPI (/etc/mpi/hostfile through
OMPI_MCA_orte_default_hostfile, NODE_IP_SLOT_LIST, GPU_NUM), Ray (HEAD_ADDR, HEAD_PORT, RANK: 0 is
the head) and PS-Worker (TF_CONFIG: the worker list is the torch world; ps tasks have nothing to do).
The rows settings/topology.py asks of the platforms a project holds. Plain Python."""

from __future__ import annotations

import json
import socket
from collections.abc import Mapping

from ...settings.bounds import MAX_NODES
from ...settings.topology import (
    DEFAULT_PORT,
    Platform,
    Topology,
    TopologyError,
    check_rank,
    digits,
    mpi_hosts,
    port_of,
    require,
    whole_number,
)


def read_tione_ddp(env: Mapping[str, str], nproc: int, nnodes_default: int) -> Topology:
    require(env, "tione-ddp", "WORLD_SIZE", "RANK", "MASTER_ADDR")
    nnodes, node_rank = (
        whole_number(env, "WORLD_SIZE", 1, MAX_NODES),
        whole_number(env, "RANK"),
    )  # both count nodes on TI-ONE
    check_rank("tione-ddp", "RANK", node_rank, "WORLD_SIZE", nnodes)
    if "INDEX" in env and whole_number(env, "INDEX") != node_rank:
        raise TopologyError(f"tione-ddp: INDEX={env['INDEX']} and RANK={node_rank} disagree about this node's rank")
    if env.get("NODE_LIST"):
        listed = [n for n in env["NODE_LIST"].split(",") if n.strip()]
        if len(listed) != nnodes:
            raise TopologyError(f"tione-ddp: NODE_LIST names {len(listed)} nodes but WORLD_SIZE={nnodes}")
    per_node = whole_number(env, "GPU_NUM_PER_NODE", 1) if env.get("GPU_NUM_PER_NODE") else nproc
    if env.get("GPU_NUM") and whole_number(env, "GPU_NUM") != per_node * nnodes:
        raise TopologyError(
            f"tione-ddp: GPU_NUM={env['GPU_NUM']} != GPU_NUM_PER_NODE={per_node} x WORLD_SIZE={nnodes} nodes"
        )
    return Topology("tione-ddp", nnodes, node_rank, per_node, env["MASTER_ADDR"], port_of(env, "MASTER_PORT"))


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
    if env.get("GPU_NUM") and whole_number(env, "GPU_NUM") != per_node * len(hosts):
        raise TopologyError(f"tione-mpi: GPU_NUM={env['GPU_NUM']} != {len(hosts)} hosts x {per_node} slots")
    names = {socket.gethostname(), socket.getfqdn()}
    try:  # NODE_IP_SLOT_LIST lists IPs: this node's own addresses find it there
        names |= set(socket.gethostbyname_ex(socket.gethostname())[2])
    except OSError:
        pass
    # Only the start script reads this (to pick the launcher); ranks get theirs from mpirun.
    node_rank = next((i for i, (h, _) in enumerate(hosts) if h in names or h.split(".")[0] in names), 0)
    return Topology(
        "tione-mpi", len(hosts), node_rank, per_node, env.get("MASTER_ADDR") or hosts[0][0], port_of(env, "MASTER_PORT")
    )


def read_tione_ray(env: Mapping[str, str], nproc: int, nnodes_default: int) -> Topology:
    require(env, "tione-ray", "HEAD_ADDR", "HEAD_PORT")
    node_rank = whole_number(env, "RANK") if env.get("RANK") else 0
    nnodes = whole_number(env, "WORLD_SIZE", 1, MAX_NODES) if env.get("WORLD_SIZE") else nnodes_default
    check_rank("tione-ray", "RANK", node_rank, "the node count (WORLD_SIZE or cluster.nodes)", nnodes)
    return Topology("tione-ray", nnodes, node_rank, nproc, env["HEAD_ADDR"], port_of(env, "HEAD_PORT"))


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
    check_rank("tione-ps", "TF_CONFIG task.index", node_rank, "the worker list", len(world))
    host, _, port = world[0].rpartition(":")
    per_node = whole_number(env, "GPU_NUM_PER_NODE", 1) if env.get("GPU_NUM_PER_NODE") else nproc
    # The platform opened worker 0's TF port and no TF server uses it in a PyTorch job: torch's
    # store takes it unless MASTER_PORT says otherwise.
    master_port = (
        port_of(env, "MASTER_PORT")
        if "MASTER_PORT" in env
        else int(port)
        if digits(port) and 0 < int(port) < 65536
        else DEFAULT_PORT
    )
    return Topology("tione-ps", len(world), node_rank, per_node, host or world[0], master_port)


ROWS = [
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


def tione_variables(env: Mapping[str, str]) -> list[str]:
    """The TI-ONE variables set here (non-empty when running inside a TI-ONE task)."""
    return sorted({v for row in ROWS if row.matches(env) for v in row.signature})
