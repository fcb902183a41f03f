"""What Slurm tells a node (SLURM_NNODES, SLURM_NODEID, SLURM_JOB_NODELIST expanded by `scontrol
show hostnames`, SLURM_NTASKS_PER_NODE, SLURM_PROCID), as a Topology: the row settings/topology.py
asks of the platforms a project holds; the ranks srun starts one per GPU (process_rank_names) and
the identity of a job across its requeues (job_identity). Plain Python."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Mapping

from ...settings.bounds import MAX_NODES
from ...settings.config import project_root
from ...settings.topology import (
    Platform,
    Topology,
    TopologyError,
    check_rank,
    port_of,
    require,
    whole_number,
)
from .partition import partition_problem, requested


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
    require(env, "slurm", "SLURM_NNODES", "SLURM_JOB_NODELIST")
    nnodes = whole_number(env, "SLURM_NNODES", 1, MAX_NODES)
    node_rank = whole_number(env, "SLURM_NODEID") if env.get("SLURM_NODEID") else 0
    check_rank("slurm", "SLURM_NODEID", node_rank, "SLURM_NNODES", nnodes)
    hosts = slurm_hostnames(env["SLURM_JOB_NODELIST"])
    if len(hosts) != nnodes:
        raise TopologyError(f"slurm: SLURM_JOB_NODELIST expands to {len(hosts)} hosts but SLURM_NNODES={nnodes}")
    # '2(x3)' means 2 tasks on each of 3 nodes
    tasks = whole_number(
        {"SLURM_NTASKS_PER_NODE": env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0]}, "SLURM_NTASKS_PER_NODE", 1
    )
    per_task = tasks > 1 and "SLURM_PROCID" in env and "SLURM_STEP_ID" in env
    per_node = (
        tasks if per_task else (whole_number(env, "SLURM_GPUS_ON_NODE", 1) if env.get("SLURM_GPUS_ON_NODE") else nproc)
    )
    # The port follows the job id so two jobs sharing a first node do not collide.
    port = port_of(env, "MASTER_PORT") if "MASTER_PORT" in env else 20000 + whole_number(env, "SLURM_JOB_ID") % 20000
    # Slurm signals every process of a step itself (scancel, --signal's warning before the time limit).
    return Topology(
        "slurm",
        nnodes,
        node_rank,
        per_node,
        env.get("MASTER_ADDR") or hosts[0],
        port,
        per_process=per_task,
        signals_every_process=True,
    )


def process_rank_names(env: Mapping[str, str]) -> tuple[str, str, str] | None:
    """The rank, local rank and world size of a process srun started one per GPU (a step of several
    tasks), else None."""
    if (
        "SLURM_PROCID" in env
        and "SLURM_STEP_ID" in env
        and whole_number({"SLURM_NTASKS": "1", **env}, "SLURM_NTASKS", 1) > 1
    ):
        return ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NTASKS")
    return None


def job_identity(env: Mapping[str, str], topo: Topology | None) -> str | None:
    """The Slurm job (and step): a requeued job keeps its id, and its steps their numbers. None
    outside a Slurm job, and for a node another platform describes (`launch devmachine` on a machine
    Slurm allocated is not the allocation's job)."""
    if not env.get("SLURM_JOB_ID") or (topo is not None and topo.platform != "slurm"):
        return None
    step = env.get("SLURM_STEP_ID")
    return f"slurm job {env['SLURM_JOB_ID']}" + (f" step {step}" if step else "")


def site_problems(cfg) -> list[str]:
    """For `check` on a login node: launch/slurm/train.sbatch against the nodes sinfo lists; nothing
    without the script or sinfo (and a warning where sinfo reports a node that cannot be judged)."""
    script = project_root() / "launch" / "slurm" / "train.sbatch"
    if not script.is_file():
        return []
    notes: list[str] = []
    problem = partition_problem(requested(script.read_text(), []), notes=notes)
    for note in notes:
        print(f"warning: {note}", file=sys.stderr)
    return [problem] if problem else []


RUN_ON_NODE = "srun --overlap --jobid JOBID {command}"  # a command on the nodes of a running job (debug-dump)

ROWS = [
    # mpirun inside a Slurm allocation: the ranks are MPI's, the allocation only hosts them.
    Platform("slurm", ("SLURM_JOB_ID", "SLURM_NNODES"), read_slurm, unless=("OMPI_COMM_WORLD_RANK",)),
]
