"""topology.py: every platform's documented variables -> one Topology
(and the torchrun command it yields), the platforms' contradictions as clear errors, the rank
mapping inside the trainer, and the wait for the master's port.

    python -m pytest -q tests/test_topology.py        # a few seconds, no training

The environments are the ones the platforms document: Kubeflow's training-operator v1 (PyTorchJob,
static and elastic), TI-ONE's tables for DDP, MPI, Ray and PS-Worker (with its own example values),
Slurm and OpenMPI. Slurm node lists are expanded by the real `scontrol`; the master wait uses real
sockets on 127.0.0.1.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import sys
import time

import pytest
from conftest import by_platform

# ---------------------------------------------------------------------------------------------
# The platforms' environments, as they inject them

# Kubeflow training-operator v1, PyTorchJob with 1 Master + 1 Worker, nprocPerNode 1: the pod of
# replica i gets PET_* for torchrun plus MASTER_ADDR/PORT, WORLD_SIZE (replicas x nprocPerNode)
# and RANK (the node's index, Master first).
KUBEFLOW_MASTER = {
    "PET_NNODES": "2",
    "PET_NODE_RANK": "0",
    "PET_NPROC_PER_NODE": "1",
    "PET_MASTER_ADDR": "gpt-job-master-0",
    "PET_MASTER_PORT": "23456",
    "MASTER_ADDR": "gpt-job-master-0",
    "MASTER_PORT": "23456",
    "WORLD_SIZE": "2",
    "RANK": "0",
    "PYTHONUNBUFFERED": "1",
}
KUBEFLOW_WORKER = {**KUBEFLOW_MASTER, "PET_NODE_RANK": "1", "RANK": "1"}
# Kubeflow Trainer v2 (TrainJob): PET_* only; the node rank is the pod's Job completion index.
KUBEFLOW_TRAINJOB = {
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "auto",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "gpt-node-0-0.gpt",
    "PET_MASTER_PORT": "29400",
}
# Elastic (elasticPolicy minReplicas 2, maxReplicas 4, rdzvHost/rdzvPort at the master): the
# operator adds PET_RDZV_* and turns PET_NNODES into min:max.
KUBEFLOW_ELASTIC = {
    **KUBEFLOW_WORKER,
    "PET_NNODES": "2:4",
    "PET_RDZV_BACKEND": "c10d",
    "PET_RDZV_ENDPOINT": "gpt-job-master-0:23456",
    "PET_MAX_RESTARTS": "3",
}

# TI-ONE DDP, the example values of its variable table: WORLD_SIZE and RANK count NODES.
TIONE_DDP = {
    "NODE_LIST": "timaker-xxxyyy-launcher.training-job.svc.cluster.local:1,"
    "timaker-xxxyyy-worker-0.training-job.svc.cluster.local:1",
    "INDEX": "1",
    "MASTER_ADDR": "10.35.110.11",
    "MASTER_PORT": "23456",
    "WORLD_SIZE": "2",
    "RANK": "1",
    "GPU_NUM": "2",
    "GPU_NUM_PER_NODE": "1",
}

# TI-ONE MPI: a hostfile (named by OMPI_MCA_orte_default_hostfile) and the node list as ip:slots.
TIONE_MPI = {
    "OMPI_MCA_orte_default_hostfile": "/etc/mpi/hostfile",
    "GPU_NUM": "2",
    "GPU_NUM_PER_NODE": "1",
    "NODE_IP_SLOT_LIST": "9.0.255.56:1,9.0.255.118:1",
}
# The hostfile as TI-ONE documents it: both entries on one line.
TIONE_HOSTFILE = (
    "train-960258573108964736-7an39bddmfpc-launcher slots=1 train-960258573108964736-7an39bddmfpc-worker-0 slots=1\n"
)

# TI-ONE Ray: the head's address and port, and this node's number (0 = head).
TIONE_RAY = {"HEAD_ADDR": "train-1282671078021627392-9qu5j2n90b9c-head-0", "HEAD_PORT": "6379", "RANK": "0"}

# TI-ONE PS-Worker: TF_CONFIG only, as in its example (two ps, two workers).
TF_CLUSTER = {
    "ps": [
        "train-960252492096760832-7an13ppfli80-ps-0.train-100031385875.svc:2222",
        "train-960252492096760832-7an13ppfli80-ps-1.train-100031385875.svc:2222",
    ],
    "worker": [
        "train-960252492096760832-7an13ppfli80-worker-0.train-100031385875.svc:2222",
        "train-960252492096760832-7an13ppfli80-worker-1.train-100031385875.svc:2222",
    ],
}
WORKER0_HOST = "train-960252492096760832-7an13ppfli80-worker-0.train-100031385875.svc"


def tf_config(kind: str, index: int, cluster: dict | None = None) -> dict:
    value = {"cluster": cluster or TF_CLUSTER, "task": {"type": kind, "index": index}, "environment": "cloud"}
    return {"TF_CONFIG": json.dumps(value)}


# Slurm: a job on node1 and node2, here on its second node.
SLURM = {
    "SLURM_JOB_ID": "4242",
    "SLURM_JOB_NAME": "gpt",
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_GPUS_ON_NODE": "4",
}
# srun one task per GPU: 2 tasks on each of 2 nodes; this is global task 3 (second task of node 1).
SLURM_PER_TASK = {
    **SLURM,
    "SLURM_NTASKS_PER_NODE": "2",
    "SLURM_NTASKS": "4",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
}

# mpirun -np 4 on 2 hosts, 2 slots each: global rank 3 = second rank of the second host.
OPENMPI = {
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "MASTER_ADDR": "10.0.0.1",
}

# Kept in every environment: variables of any machine, which must not look like a platform.
ORDINARY = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/root",
    "HOSTNAME": "gpt-job-master-0",
    "LANG": "C.UTF-8",
    "KUBERNETES_SERVICE_HOST": "10.96.0.1",
    "PYTHONPATH": "src",
}


@pytest.fixture(scope="session")
def topology(pkg):
    return pkg.topology


@pytest.fixture
def torchrun(pkg):
    return pkg.torchrun


@pytest.fixture
def network(pkg):
    return pkg.network


@pytest.fixture
def hostfile(tmp_path):
    """Writes an MPI hostfile and returns the environment naming it."""

    def _write(text: str, **extra) -> dict:
        path = tmp_path / "hostfile"
        path.write_text(text)
        return {"OMPI_MCA_orte_default_hostfile": str(path), "GPU_NUM": "2", "GPU_NUM_PER_NODE": "1", **extra}

    return _write


def fields(topo) -> dict:
    return {
        k: getattr(topo, k)
        for k in (
            "platform",
            "nnodes",
            "node_rank",
            "nproc_per_node",
            "master_addr",
            "master_port",
            "min_nnodes",
            "per_process",
            "role",
        )
    }


def expect(platform, nnodes, node_rank, nproc, addr, port, min_nnodes=None, per_process=False, role="worker"):
    return dict(
        platform=platform,
        nnodes=nnodes,
        node_rank=node_rank,
        nproc_per_node=nproc,
        master_addr=addr,
        master_port=port,
        min_nnodes=min_nnodes,
        per_process=per_process,
        role=role,
    )


# ---------------------------------------------------------------------------------------------
# Every platform's variables -> the expected Topology (nproc_default 8, nnodes_default 2)

CASES = {
    "kubeflow master": (KUBEFLOW_MASTER, expect("kubeflow", 2, 0, 1, "gpt-job-master-0", 23456)),
    "kubeflow worker": (KUBEFLOW_WORKER, expect("kubeflow", 2, 1, 1, "gpt-job-master-0", 23456)),
    # nprocPerNode auto (the operator's default): one process per GPU, counted on the node.
    "kubeflow nproc auto": (
        {**KUBEFLOW_WORKER, "PET_NPROC_PER_NODE": "auto"},
        expect("kubeflow", 2, 1, 8, "gpt-job-master-0", 23456),
    ),
    "kubeflow trainjob": (KUBEFLOW_TRAINJOB, expect("kubeflow", 2, 1, 8, "gpt-node-0-0.gpt", 29400)),
    "kubeflow elastic": (KUBEFLOW_ELASTIC, expect("kubeflow", 4, 1, 1, "gpt-job-master-0", 23456, min_nnodes=2)),
    "tione ddp (its example)": (TIONE_DDP, expect("tione-ddp", 2, 1, 1, "10.35.110.11", 23456)),
    "tione ddp master": ({**TIONE_DDP, "RANK": "0", "INDEX": "0"}, expect("tione-ddp", 2, 0, 1, "10.35.110.11", 23456)),
    "tione ddp 8 gpus x 4 nodes": (
        {
            **TIONE_DDP,
            "WORLD_SIZE": "4",
            "RANK": "3",
            "INDEX": "3",
            "GPU_NUM": "32",
            "GPU_NUM_PER_NODE": "8",
            "NODE_LIST": "a:8,b:8,c:8,d:8",
        },
        expect("tione-ddp", 4, 3, 8, "10.35.110.11", 23456),
    ),
    "tione ray head": (TIONE_RAY, expect("tione-ray", 2, 0, 8, TIONE_RAY["HEAD_ADDR"], 6379)),
    "tione ray worker": ({**TIONE_RAY, "RANK": "1"}, expect("tione-ray", 2, 1, 8, TIONE_RAY["HEAD_ADDR"], 6379)),
    # PS-Worker: the worker list is the torch world; worker 0 hosts the master on its TF_CONFIG
    # port, which the platform opened and no TensorFlow server uses here (MASTER_PORT overrides).
    "tione ps worker 1": (tf_config("worker", 1), expect("tione-ps", 2, 1, 8, WORKER0_HOST, 2222)),
    "tione ps worker 0 + MASTER_PORT": (
        {**tf_config("worker", 0), "MASTER_PORT": "23457"},
        expect("tione-ps", 2, 0, 8, WORKER0_HOST, 23457),
    ),
    "tione ps worker + GPU_NUM_PER_NODE": (
        {**tf_config("worker", 0), "GPU_NUM_PER_NODE": "4"},
        expect("tione-ps", 2, 0, 4, WORKER0_HOST, 2222),
    ),
    # A chief, when present, is node 0 and the workers follow it.
    "tione ps chief": (
        tf_config("worker", 0, {**TF_CLUSTER, "chief": ["chief-0.svc:2222"]}),
        expect("tione-ps", 3, 1, 8, "chief-0.svc", 2222),
    ),
    "tione ps ps task": (tf_config("ps", 1), expect("tione-ps", 2, 1, 8, WORKER0_HOST, 29500, role="ps")),
    "openmpi rank": (OPENMPI, expect("openmpi", 2, 1, 2, "10.0.0.1", 29500, per_process=True)),
    # Under TI-ONE's MPI mode the ranks find the master in the node list.
    "openmpi under tione": (
        {**TIONE_MPI, **OPENMPI, "MASTER_ADDR": None},
        expect("openmpi", 2, 1, 2, "9.0.255.56", 29500, per_process=True),
    ),
}


@pytest.mark.parametrize("name", by_platform(CASES))
def test_detect_every_platform(topology, name):
    env, expected = CASES[name]
    env = {k: v for k, v in {**ORDINARY, **env}.items() if v is not None}
    assert fields(topology.detect(env, 8, 2)) == expected


def test_no_platform_variables_is_none(topology):
    assert topology.detect(ORDINARY, 8, 1) is None
    assert topology.detect({}, 8, 1) is None


@pytest.mark.part("tione")
def test_tione_mpi_node_list(topology):
    """NODE_IP_SLOT_LIST wins over the hostfile; its first host is the master."""
    topo = topology.detect({**ORDINARY, **TIONE_MPI}, 8, 1)
    assert (topo.platform, topo.nnodes, topo.nproc_per_node, topo.master_addr, topo.master_port) == (
        "tione-mpi",
        2,
        1,
        "9.0.255.56",
        29500,
    )
    assert topology.mpi_hosts(TIONE_MPI) == [("9.0.255.56", 1), ("9.0.255.118", 1)]


@pytest.mark.part("tione")
def test_tione_mpi_hostfile_as_documented(topology, hostfile):
    """The hostfile of TI-ONE's example, both entries on one line; the launcher is the master."""
    topo = topology.detect(hostfile(TIONE_HOSTFILE), 8, 1)
    assert (topo.platform, topo.nnodes, topo.nproc_per_node, topo.master_port) == ("tione-mpi", 2, 1, 29500)
    assert topo.master_addr == "train-960258573108964736-7an39bddmfpc-launcher"
    hosts = topology.mpi_hosts(hostfile("launcher slots=8\n# a comment line\nworker-0 slots=8\n"))
    assert hosts == [("launcher", 8), ("worker-0", 8)]


@pytest.mark.part("tione")
def test_tione_mpi_node_rank_is_this_hosts_line(topology, hostfile):
    """Each node finds itself in the hostfile by its hostname."""
    me = socket.gethostname()
    topo = topology.detect(hostfile(f"other-launcher slots=1 {me} slots=1\n"), 8, 1)
    assert (topo.node_rank, topo.nnodes, topo.master_addr) == (1, 2, "other-launcher")


# ---------------------------------------------------------------------------------------------
# Contradictions and mistakes: TopologyError naming the variables involved

ERRORS = {
    "two platforms: kubeflow + tione-ps": (
        {**KUBEFLOW_MASTER, **tf_config("worker", 0)},
        ["kubeflow", "PET_NNODES", "tione-ps", "TF_CONFIG"],
    ),
    "two platforms: slurm + tione-ray": ({**SLURM, **TIONE_RAY}, ["slurm", "SLURM_JOB_ID", "tione-ray", "HEAD_ADDR"]),
    "tione ddp RANK >= WORLD_SIZE": ({**TIONE_DDP, "RANK": "2", "INDEX": "2"}, ["RANK=2", "WORLD_SIZE=2"]),
    "tione ddp INDEX != RANK": ({**TIONE_DDP, "INDEX": "0"}, ["INDEX=0", "RANK=1"]),
    "tione ddp NODE_LIST length": ({**TIONE_DDP, "NODE_LIST": "a:1,b:1,c:1"}, ["NODE_LIST", "3", "WORLD_SIZE=2"]),
    "tione ddp GPU_NUM": ({**TIONE_DDP, "GPU_NUM": "3"}, ["GPU_NUM=3", "GPU_NUM_PER_NODE=1", "WORLD_SIZE=2"]),
    "tione ddp WORLD_SIZE not a number": ({**TIONE_DDP, "WORLD_SIZE": "two"}, ["WORLD_SIZE='two'"]),
    "tione ddp bad MASTER_PORT": ({**TIONE_DDP, "MASTER_PORT": "70000"}, ["MASTER_PORT=70000", "1-65535"]),
    "kubeflow PET_NNODES word": ({**KUBEFLOW_MASTER, "PET_NNODES": "two"}, ["PET_NNODES='two'", "min:max"]),
    "kubeflow PET_NNODES max < min": ({**KUBEFLOW_MASTER, "PET_NNODES": "4:2"}, ["PET_NNODES='4:2'"]),
    "kubeflow PET_NNODES zero": ({**KUBEFLOW_MASTER, "PET_NNODES": "0"}, ["PET_NNODES='0'"]),
    "kubeflow PET_NODE_RANK out of range": (
        {**KUBEFLOW_WORKER, "PET_NODE_RANK": "2"},
        ["PET_NODE_RANK=2", "PET_NNODES=2"],
    ),
    "kubeflow PET_NPROC_PER_NODE": ({**KUBEFLOW_MASTER, "PET_NPROC_PER_NODE": "many"}, ["PET_NPROC_PER_NODE='many'"]),
    "kubeflow bad PET_MASTER_PORT": ({**KUBEFLOW_MASTER, "PET_MASTER_PORT": "http"}, ["PET_MASTER_PORT='http'"]),
    "kubeflow no PET_MASTER_ADDR": ({**KUBEFLOW_MASTER, "PET_MASTER_ADDR": ""}, ["PET_MASTER_ADDR"]),
    "tione ps TF_CONFIG garbage": ({"TF_CONFIG": "{cluster: worker"}, ["TF_CONFIG", "JSON"]),
    "tione ps TF_CONFIG without task": ({"TF_CONFIG": json.dumps({"cluster": TF_CLUSTER})}, ["TF_CONFIG", "task.type"]),
    "tione ps unknown task type": (tf_config("evaluator", 0), ["TF_CONFIG", "task.type='evaluator'"]),
    "tione ps index past the workers": (tf_config("worker", 2), ["TF_CONFIG task.index=2", "worker list"]),
    "tione ps no workers": (tf_config("ps", 0, {"ps": TF_CLUSTER["ps"]}), ["TF_CONFIG", "no worker"]),
    "tione ray RANK past the nodes": ({**TIONE_RAY, "RANK": "2"}, ["RANK=2"]),
    "tione ray bad HEAD_PORT": ({**TIONE_RAY, "HEAD_PORT": "0"}, ["HEAD_PORT=0"]),
    "tione mpi bad NODE_IP_SLOT_LIST": (
        {**TIONE_MPI, "NODE_IP_SLOT_LIST": "9.0.255.56,9.0.255.118:1"},
        ["NODE_IP_SLOT_LIST", "'9.0.255.56'"],
    ),
    "tione mpi GPU_NUM": ({**TIONE_MPI, "GPU_NUM": "4"}, ["GPU_NUM=4", "2 hosts"]),
    "unreadable hostfile": (
        {"OMPI_MCA_orte_default_hostfile": "/nonexistent/mpi/hostfile"},
        ["/nonexistent/mpi/hostfile", "OMPI_MCA_orte_default_hostfile"],
    ),
    "openmpi rank >= size": (
        {**OPENMPI, "OMPI_COMM_WORLD_RANK": "4"},
        ["OMPI_COMM_WORLD_RANK=4", "OMPI_COMM_WORLD_SIZE=4"],
    ),
    "slurm SLURM_NODEID out of range": ({**SLURM, "SLURM_NODEID": "2"}, ["SLURM_NODEID=2", "SLURM_NNODES=2"]),
}


@pytest.mark.parametrize("name", by_platform(ERRORS))
def test_detect_errors_name_the_variables(topology, name):
    env, words = ERRORS[name]
    with pytest.raises(topology.TopologyError) as err:
        topology.detect({**ORDINARY, **env}, 8, 2)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


@pytest.mark.part("tione")
def test_hostfile_errors(topology, hostfile, tmp_path):
    with pytest.raises(topology.TopologyError) as err:
        topology.detect(hostfile("launcher slots=1\nworker-0 slots=2\n"), 8, 1)
    assert "different slot counts [1, 2]" in str(err.value)
    with pytest.raises(topology.TopologyError) as err:
        topology.detect(hostfile("launcher worker-0\n"), 8, 1)
    assert str(tmp_path / "hostfile") in str(err.value) and "slots=N" in str(err.value)
    # A folder where the file should be is unreadable too.
    with pytest.raises(topology.TopologyError) as err:
        topology.detect({"OMPI_MCA_orte_default_hostfile": str(tmp_path)}, 8, 1)
    assert "OMPI_MCA_orte_default_hostfile" in str(err.value) and str(tmp_path) in str(err.value)


def test_openmpi_without_a_master_says_how_to_name_one(topology, tmp_path):
    env = {k: v for k, v in OPENMPI.items() if k != "MASTER_ADDR"}
    hosts = tmp_path / "hosts"
    hosts.write_text("h0 slots=2 h1 slots=2\n")
    assert topology.detect({**env, "OMPI_MCA_orte_default_hostfile": str(hosts)}, 8, 1).master_addr == "h0"
    # (A TI-ONE MPI machine has /etc/mpi/hostfile, where the master is then found.)
    if not os.path.exists("/etc/mpi/hostfile"):
        with pytest.raises(topology.TopologyError) as err:
            topology.detect(env, 8, 1)
        assert "MASTER_ADDR" in str(err.value) and "mpirun -x" in str(err.value)


# ---------------------------------------------------------------------------------------------
# Topology -> torchrun command

ENTRY = ["-m", "gpt", "train", "model.size=tiny"]


def flag(cmd: list[str], name: str) -> str:
    return cmd[cmd.index(name) + 1]


def test_torchrun_multi_node_uses_c10d_hosted_on_node_0(topology, torchrun):
    """c10d, not static: after a failure every node's agent joins the next round (restarts). Its
    ordered variant (rendezvous.py) gives the node ranks to the rendezvous: node 0 runs rank 0."""
    node_1 = topology.Topology("tione-ddp", 2, 1, 1, "10.35.110.11", 23456)  # TIONE_DDP as its folder reads it
    worker = torchrun.torchrun_command(node_1, ENTRY, max_restarts=3, grace_seconds=90)
    assert worker[:3] == [sys.executable, "-m", f"{torchrun.__package__}.rendezvous"]
    assert flag(worker, "--nproc-per-node") == "1" and flag(worker, "--nnodes") == "2"
    assert flag(worker, "--rdzv-backend") == "c10d-ordered" and flag(worker, "--rdzv-endpoint") == "10.35.110.11:23456"
    assert flag(worker, "--rdzv-conf") == "is_host=false,node_rank=1"  # TIONE_DDP is node 1
    assert flag(worker, "--max-restarts") == "3" and flag(worker, "--shutdown-timeout") == "90"
    assert "SIGUSR1" in flag(worker, "--signals-to-handle").split(",")
    assert "--standalone" not in worker and "--node-rank" not in worker and "--master-addr" not in worker
    assert worker[-len(ENTRY) :] == ENTRY
    master = torchrun.torchrun_command(dataclasses.replace(node_1, node_rank=0), ENTRY)
    assert flag(master, "--rdzv-conf") == "is_host=true,node_rank=0"


def test_per_rank_log_files_only_when_asked(topology, torchrun):
    topo = topology.Topology("tione-ddp", 2, 1, 1, "10.35.110.11", 23456)
    assert "--log-dir" not in torchrun.torchrun_command(topo, ENTRY)
    cmd = torchrun.torchrun_command(topo, ENTRY, log_dir="/mnt/shared/runs/logs/node-a")
    assert flag(cmd, "--log-dir") == "/mnt/shared/runs/logs/node-a" and flag(cmd, "--tee") == "3"


def test_torchrun_one_node_is_standalone(topology, torchrun):
    one = topology.Topology("kubeflow", 1, 0, 4, "gpt-job-master-0", 23456)
    cmd = torchrun.torchrun_command(one, ENTRY)
    assert "--standalone" in cmd and flag(cmd, "--nproc-per-node") == "4"
    assert not any(a in cmd for a in ("--nnodes", "--node-rank", "--master-addr", "--rdzv-endpoint"))
    assert cmd[-len(ENTRY) :] == ENTRY


def test_torchrun_elastic_uses_c10d(topology, torchrun):
    topo = topology.Topology("kubeflow", 4, 1, 1, "gpt-job-master-0", 23456, min_nnodes=2)  # KUBEFLOW_ELASTIC's
    cmd = torchrun.torchrun_command(topo, ENTRY)
    assert flag(cmd, "--nnodes") == "2:4" and flag(cmd, "--rdzv-backend") == "c10d"
    assert flag(cmd, "--rdzv-endpoint") == "gpt-job-master-0:23456"
    # Elastic ranks are assigned at rendezvous: no fixed node rank, no static master.
    assert "--node-rank" not in cmd and "--master-addr" not in cmd and "--standalone" not in cmd
    # An elastic job may shrink to a single node and still needs the rendezvous.
    one_to_two = dataclasses.replace(topo, nnodes=2, min_nnodes=1)
    assert flag(torchrun.torchrun_command(one_to_two, ENTRY), "--nnodes") == "1:2"


@pytest.mark.part("kubeflow")
def test_table_names_what_was_found(topology):
    table = topology.detect(KUBEFLOW_ELASTIC, 8, 1).table()
    assert "kubeflow" in table and "2..4" in table and "gpt-job-master-0:23456" in table
    assert socket.gethostname() in table
    assert "no torchrun" in topology.detect(OPENMPI, 8, 1).table()


def test_default_nproc_counts_visible_gpus(topology, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2")
    assert topology.default_nproc(8) == 3
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5")
    assert topology.default_nproc(8) == 1


# ---------------------------------------------------------------------------------------------
# Inside the trainer: whoever started the process -> (rank, local_rank, world_size)

RANKS = {
    "torchrun": (
        {
            "RANK": "3",
            "LOCAL_RANK": "1",
            "WORLD_SIZE": "4",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500",
        },
        (3, 1, 4),
    ),
    "mpirun": (
        {
            "OMPI_COMM_WORLD_RANK": "2",
            "OMPI_COMM_WORLD_LOCAL_RANK": "0",
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        },
        (2, 0, 4),
    ),
    "srun": (SLURM_PER_TASK, (3, 1, 4)),
    # torchrun inside a TI-ONE or Kubeflow pod: the platform's node-level RANK/WORLD_SIZE were
    # replaced by torchrun's, LOCAL_RANK marks them as process-level.
    "torchrun in a tione pod": ({**TIONE_DDP, "RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}, (2, 0, 2)),
    # TI-ONE DDP's own RANK/WORLD_SIZE count nodes: without LOCAL_RANK this is one process.
    "tione ddp node variables": (TIONE_DDP, (0, 0, 1)),
    "kubeflow pod variables": (KUBEFLOW_WORKER, (0, 0, 1)),
    # An sbatch script (no step) or a one-task step is not a multi-process job.
    "slurm batch script": ({**SLURM, "SLURM_PROCID": "0", "SLURM_NTASKS": "2"}, (0, 0, 1)),
    "srun one task": ({**SLURM, "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_STEP_ID": "0"}, (0, 0, 1)),
    "nothing": (ORDINARY, (0, 0, 1)),
}


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=pytest.mark.part("slurm")) if name == "srun" else name for name in RANKS]
)
def test_process_ranks(pkg, name):
    env, expected = RANKS[name]
    assert pkg.topology.process_ranks(env) == expected


# ---------------------------------------------------------------------------------------------
# Waiting for the master's port (real sockets)


@pytest.fixture
def closed_port():
    """A port bound on 127.0.0.1 but not listening: connections are refused until listen()."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    yield sock
    sock.close()


def test_wait_for_master_returns_once_the_port_listens(topology, network, closed_port):
    """The master starts listening once the worker has found its port closed and said it waits (the
    order the test is about, whatever the load): the worker's next try, 1 s later, finds it."""
    port = closed_port.getsockname()[1]
    logs: list[str] = []

    def log(message: str) -> None:
        logs.append(message)
        if message.startswith("waiting for master"):
            closed_port.listen()

    start = time.monotonic()
    network.wait_for_master("127.0.0.1", port, timeout=30, log=log)
    waited = time.monotonic() - start
    assert 1.0 <= waited < 25, waited  # one back-off of 1 s, then the connection
    assert logs == [f"waiting for master 127.0.0.1:{port} ...", f"master 127.0.0.1:{port} is up after 2 tries"], logs


def test_wait_for_master_listening_now_returns_silently(topology, network, closed_port):
    closed_port.listen()
    logs: list[str] = []
    network.wait_for_master("127.0.0.1", closed_port.getsockname()[1], timeout=5, log=logs.append)
    assert logs == []


def test_wait_for_master_times_out_with_what_to_check(topology, network, closed_port):
    port = closed_port.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(topology.TopologyError) as err:
        network.wait_for_master("127.0.0.1", port, timeout=2, log=lambda m: None)
    waited = time.monotonic() - start
    assert 2 <= waited < 60, waited  # waited its timeout out, and did not hang
    message = str(err.value)
    assert f"127.0.0.1:{port}" in message and "within 2 s" in message
    # What to check: the master's own start, name resolution/reachability, the port between nodes.
    assert "node 0 started" in message and "resolves" in message and f"port {port} is open" in message


# training-operator v1, Worker-only PyTorchJob with elasticPolicy (min 2, max 4, maxRestarts 3,
# nprocPerNode 1): no Master replica, so no PET_MASTER_ADDR, PET_NODE_RANK, MASTER_ADDR, RANK.
KUBEFLOW_ELASTIC_WORKERS = {
    "PET_NNODES": "2:4",
    "PET_RDZV_BACKEND": "c10d",
    "PET_RDZV_ENDPOINT": "gpt-job-worker-0:23456",
    "PET_MAX_RESTARTS": "3",
    "PET_NPROC_PER_NODE": "1",
    "PYTHONUNBUFFERED": "1",
}


@pytest.mark.part("kubeflow")
def test_kubeflow_elastic_worker_only_job(topology, torchrun):
    topo = topology.detect({**ORDINARY, **KUBEFLOW_ELASTIC_WORKERS}, 8, 1)
    assert fields(topo) == expect("kubeflow", 4, 0, 1, "gpt-job-worker-0", 23456, min_nnodes=2)
    cmd = torchrun.torchrun_command(topo, ENTRY)
    assert flag(cmd, "--nnodes") == "2:4" and flag(cmd, "--rdzv-endpoint") == "gpt-job-worker-0:23456"


@pytest.mark.part("kubeflow")
def test_kubeflow_elastic_fixed_size_still_uses_c10d(topology, torchrun):
    # elasticPolicy without min/max: PET_NNODES is the worker count, ranks come from the rendezvous.
    topo = topology.detect({**KUBEFLOW_ELASTIC_WORKERS, "PET_NNODES": "2"}, 8, 1)
    cmd = torchrun.torchrun_command(topo, ENTRY)
    assert flag(cmd, "--rdzv-backend") == "c10d" and flag(cmd, "--nnodes") == "2:2" and "--node-rank" not in cmd


@pytest.mark.part("kubeflow")
@pytest.mark.parametrize("value", ["gpt-job-worker-0", "gpt-job-worker-0:http", ":23456"])
def test_kubeflow_bad_rdzv_endpoint(topology, value):
    with pytest.raises(topology.TopologyError) as err:
        topology.detect({**KUBEFLOW_ELASTIC_WORKERS, "PET_RDZV_ENDPOINT": value}, 8, 1)
    assert "PET_RDZV_ENDPOINT" in str(err.value)
