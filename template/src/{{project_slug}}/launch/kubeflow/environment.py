"""What Kubeflow's training-operator tells a node (PET_NNODES, n or min:max; PET_NODE_RANK,
PET_NPROC_PER_NODE, PET_MASTER_ADDR/PORT; PET_RDZV_ENDPOINT for elastic jobs), as a Topology: the row
settings/topology.py asks of the platforms a project holds. Plain Python."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from ...planning.storage_paths import NOT_STORAGE, normalised
from ...settings.bounds import MAX_COUNT, MAX_NODES
from ...settings.stored_files import read_yaml
from ...settings.topology import (
    SET_BY_JOB,
    Platform,
    Topology,
    TopologyError,
    check_rank,
    digits,
    port_of,
    require,
    whole_number,
)


def read_kubeflow(env: Mapping[str, str], nproc: int, nnodes_default: int) -> Topology:
    require(env, "kubeflow", "PET_NNODES")
    spec = env["PET_NNODES"].strip()
    match = re.fullmatch(r"([0-9]+)(?::([0-9]+))?", spec)
    if not match:
        raise TopologyError(f"PET_NNODES={spec!r} must be a node count or min:max; {SET_BY_JOB}")
    low, high = int(match.group(1)), int(match.group(2) or match.group(1))
    if not 1 <= low <= high <= MAX_NODES:
        raise TopologyError(
            f"PET_NNODES={spec!r}: the minimum must be between 1 and the maximum, at most {MAX_NODES}; {SET_BY_JOB}"
        )
    node_rank = (
        whole_number(env, "PET_NODE_RANK")
        if "PET_NODE_RANK" in env
        else whole_number(env, "RANK")
        if "RANK" in env
        else 0
    )
    check_rank("kubeflow", "PET_NODE_RANK", node_rank, "PET_NNODES", high)
    per_node = env.get("PET_NPROC_PER_NODE", "auto").strip()
    if per_node not in ("auto", "gpu", "cpu") and not (digits(per_node) and 0 < int(per_node) <= MAX_COUNT):
        raise TopologyError(f"PET_NPROC_PER_NODE={per_node!r} must be auto or at least 1; {SET_BY_JOB}")
    if env.get("PET_RDZV_ENDPOINT"):
        # elasticPolicy: the operator names the c10d store (worker-0's Service unless rdzvHost is
        # set) and, for Worker-only jobs, injects no PET_MASTER_ADDR and no PET_NODE_RANK.
        endpoint = env["PET_RDZV_ENDPOINT"].strip()
        host, _, port = endpoint.rpartition(":")
        if not host or not digits(port) or not 0 < int(port) < 65536:
            raise TopologyError(f"PET_RDZV_ENDPOINT={endpoint!r} must be host:port")
        master_addr, master_port, elastic = host, int(port), True
    else:
        require(env, "kubeflow", "PET_MASTER_ADDR")
        master_addr, master_port, elastic = env["PET_MASTER_ADDR"], port_of(env, "PET_MASTER_PORT"), low != high
    return Topology(
        platform="kubeflow",
        nnodes=high,
        node_rank=node_rank,
        nproc_per_node=int(per_node) if digits(per_node) else nproc,
        master_addr=master_addr,
        master_port=master_port,
        # Elastic jobs rendezvous with c10d even at a fixed size (ranks are not given per pod).
        min_nnodes=low if elastic else None,
    )


ROWS = [Platform("kubeflow", ("PET_NNODES",), read_kubeflow)]
RUN_ON_NODE = "kubectl exec POD -- {command}"  # a command in a pod of a running job (debug-dump)


def max_restarts(env: Mapping[str, str]) -> int | None:
    """An elastic PyTorchJob's own restart budget (elasticPolicy.maxRestarts arrives as
    PET_MAX_RESTARTS), else None."""
    return whole_number(env, "PET_MAX_RESTARTS") if env.get("PET_MAX_RESTARTS") else None


def manifest_mounts(manifest) -> list[str]:
    """Every volume mount path in a Kubernetes manifest (any kind: its pod templates or overrides)."""
    found: list[str] = []

    def walk(node) -> None:
        if isinstance(node, dict):
            for mount in node.get("volumeMounts") or []:
                if isinstance(mount, dict) and isinstance(mount.get("mountPath"), str):
                    found.append(mount["mountPath"])
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(manifest)
    return [m for m in dict.fromkeys(found) if normalised(m) not in NOT_STORAGE]


def storage_mounts(root: Path) -> dict[str, list[str]]:
    """The volumes each of the project's manifests mounts in its pods, by its path in the project:
    `check` judges run.output_dir and data.dir against them (a pod sees nothing else)."""
    return {
        str(path.relative_to(root)): manifest_mounts(
            read_yaml(path, "correct that line, or re-render it with `copier update`")
        )
        for path in sorted((root / "launch" / "kubeflow").glob("*.yaml"))
    }
