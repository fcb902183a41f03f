"""Real launches under simulated platforms: two "nodes" on loopback, each a `<package> node`
process given exactly the variables its platform injects, train one tiny job together on CPU.

    python -m pytest -q tests/test_platform_env.py      # about a minute on two cores

Covered: a Kubeflow PyTorchJob (Master + Worker, the worker started first), TI-ONE DDP (RANK and
WORLD_SIZE count nodes: still one process per GPU), TI-ONE PS-Worker (the ps task exits, the
workers train) and a node whose variables belong to two platforms. One GPU per node is simulated,
so every node runs one process and every job is 2 processes. Nothing is mocked: the node launcher
really waits for the master's port and really execs torchrun (Gloo on 127.0.0.1).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
from test_launch import flag, torchrun_args

# Any of these in the test runner's own environment (a Slurm allocation, an MPI shell, a TI-ONE
# notebook) would make every node look like two platforms: each node gets only its platform's.
PLATFORM_PREFIXES = ("PET_", "SLURM_", "OMPI_", "PMIX_", "TORCHELASTIC_")
PLATFORM_NAMES = {
    "MASTER_ADDR",
    "MASTER_PORT",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "NODE_LIST",
    "INDEX",
    "GPU_NUM",
    "GPU_NUM_PER_NODE",
    "NODE_IP_SLOT_LIST",
    "HEAD_ADDR",
    "HEAD_PORT",
    "TF_CONFIG",
    "CUDA_VISIBLE_DEVICES",
}

# 10 steps, 2 ranks x micro 4 = global 8: a few seconds of training.
RUN_OVERRIDES = [
    "batch.global_batch_size=8",
    "batch.micro_batch_size=4",
    "batch.grad_accum_steps=null",
    "schedule.max_steps=10",
    "schedule.warmup_steps=2",
    "logging.every_steps=5",
    "logging.eval_every_steps=0",
    "logging.tensorboard=false",
    "checkpoint.every_steps=0",
    "run.device=cpu",
    "run.dtype=fp32",
    "run.strategy=ddp",
    "run.compile=false",
    "run.seed=1337",
]
JOB_TIMEOUT = 150  # seconds for a whole two-node job; a hang ends in a failure, not a stuck suite


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def node_env(platform_vars: dict) -> dict:
    """The runner's environment without any platform's variables, plus this node's."""
    cleared = {k: None for k in os.environ if k.startswith(PLATFORM_PREFIXES) or k in PLATFORM_NAMES}
    return {**cleared, **platform_vars}


@pytest.fixture
def overrides(tiny_model, demo_data, tmp_path) -> list[str]:
    return [*tiny_model, *RUN_OVERRIDES, f"data.dir={demo_data}", f"run.output_dir={tmp_path / 'run'}"]


def run_nodes(cli, tmp_path: Path, nodes: list[tuple[str, dict, str | None]], args: list[str]) -> dict[str, tuple]:
    """Start `<package> node ARGS` once per (name, variables, after), where `after` is a text the node
    started before must have logged first (None: start at once); wait for all; returns
    {name: (exit code, log text)}. Every process group is killed at the end."""
    procs, logs = {}, {}
    try:
        for name, variables, after in nodes:
            if after is not None:
                previous = list(procs)[-1]
                deadline = time.monotonic() + JOB_TIMEOUT
                while after not in logs[previous].read_text():
                    text = logs[previous].read_text()[-3000:]
                    assert procs[previous].poll() is None, f"node {previous} exited before {after!r}:\n{text}"
                    assert time.monotonic() < deadline, f"node {previous} did not log {after!r}:\n{text}"
                    time.sleep(0.2)
            logs[name] = tmp_path / f"{name}.log"
            procs[name] = cli.start("node", "--wait-timeout", 90, *args, log=logs[name], env=node_env(variables))
        deadline = time.monotonic() + JOB_TIMEOUT
        for proc in procs.values():
            try:
                proc.wait(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
    finally:
        for proc in procs.values():
            cli.stop(proc)
    results = {name: (proc.returncode, logs[name].read_text()) for name, proc in procs.items()}
    for name, (code, text) in results.items():
        assert code == 0, f"node {name} exited {code} (killed after {JOB_TIMEOUT} s if negative)\n{text[-5000:]}"
    return results


def assert_one_job_of_two(results: dict, master: str, output_dir: Path, metrics) -> None:
    """Both nodes ran torchrun with one process each and rank 0 trained a 2-process job."""
    for name, (_, log) in results.items():
        args = torchrun_args(log)
        assert flag(args, "--nproc-per-node") == "1" and flag(args, "--nnodes") == "2", (name, args)
    # Global rank 0 (which prints) runs on the node the platform names as node 0 (rendezvous.py).
    log = "".join(text for _, text in results.values())
    assert log.count("| 2 process(es) on cpu |") == 1, log[-4000:]
    assert "| 2 process(es) on cpu |" in results[master][1], f"rank 0 did not run on {master}:\n{log[-4000:]}"
    assert "x 2 data-parallel ranks" in log
    records, _ = metrics(output_dir)
    assert [r["step"] for r in records] == [5, 10]


@pytest.mark.part("kubeflow")
def test_kubeflow_pytorchjob_worker_starts_first(cli, tmp_path, overrides, metrics):
    """PyTorchJob v1 with a Master and a Worker replica (nprocPerNode 1): the operator gives each pod
    PET_* for torchrun plus MASTER_ADDR/PORT, WORLD_SIZE and RANK. The worker pod is often scheduled
    first: its node launcher waits for the master's port and says so, then both train."""
    (port,) = free_ports(1)
    master = {
        "PET_NNODES": "2",
        "PET_NODE_RANK": "0",
        "PET_NPROC_PER_NODE": "1",
        # The operator gives the master's Service name; on one machine that is 127.0.0.1.
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(port),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": "2",
        "RANK": "0",
        "PYTHONUNBUFFERED": "1",
    }
    worker = {**master, "PET_NODE_RANK": "1", "RANK": "1"}
    # The master starts once the worker waits for it (the order the test is about, whatever the load).
    waiting = f"waiting for master 127.0.0.1:{port} ..."
    results = run_nodes(cli, tmp_path, [("worker", worker, None), ("master", master, waiting)], overrides)

    worker_log = results["worker"][1]
    assert f"waiting for master 127.0.0.1:{port} ..." in worker_log, worker_log[-3000:]
    assert f"master 127.0.0.1:{port} is up after" in worker_log
    for name, rank in (("master", "0"), ("worker", "1")):
        args = torchrun_args(results[name][1])
        assert flag(args, "--rdzv-endpoint") == f"127.0.0.1:{port}"
        assert flag(args, "--rdzv-conf") == f"is_host={'true' if rank == '0' else 'false'},node_rank={rank}"
        assert "kubeflow" in results[name][1].split("$ ")[0]  # the topology table names the platform
    assert_one_job_of_two(results, "master", tmp_path / "run", metrics)


@pytest.mark.part("tione")
def test_tione_ddp_counts_nodes_not_processes(cli, tmp_path, overrides, metrics):
    """TI-ONE DDP: WORLD_SIZE=2 and RANK=0/1 count NODES. Taken as process counts they would make a
    1-process job per node (or 4 processes); the shim makes one 2-process job."""
    (port,) = free_ports(1)
    common = {
        "NODE_LIST": "timaker-test-launcher.training-job.svc.cluster.local:1,"
        "timaker-test-worker-0.training-job.svc.cluster.local:1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": "2",
        "GPU_NUM": "2",
        "GPU_NUM_PER_NODE": "1",
    }
    nodes = [
        ("node1", {**common, "RANK": "1", "INDEX": "1"}, None),
        ("node0", {**common, "RANK": "0", "INDEX": "0"}, None),
    ]
    results = run_nodes(cli, tmp_path, nodes, overrides)
    for name in ("node0", "node1"):
        assert "tione-ddp" in results[name][1].split("$ ")[0]
        conf = f"is_host={'true' if name == 'node0' else 'false'},node_rank={name[-1]}"
        assert flag(torchrun_args(results[name][1]), "--rdzv-conf") == conf
    assert_one_job_of_two(results, "node0", tmp_path / "run", metrics)


@pytest.mark.part("tione")
def test_tione_ps_worker(cli, tmp_path, overrides, metrics):
    """TI-ONE PS-Worker: TF_CONFIG with one ps and two workers. The ps task has nothing to do in
    PyTorch training and exits 0 at once; the two workers train as one 2-process job."""
    ps_port, w0_port, w1_port, torch_port = free_ports(4)
    cluster = {"ps": [f"127.0.0.1:{ps_port}"], "worker": [f"127.0.0.1:{w0_port}", f"127.0.0.1:{w1_port}"]}

    def task(kind: str, index: int) -> dict:
        variables = {
            "TF_CONFIG": json.dumps(
                {"cluster": cluster, "task": {"type": kind, "index": index}, "environment": "cloud"}
            )
        }
        if kind == "worker":
            # One GPU in each worker container (what the GPU allocation shows the node launcher).
            variables["CUDA_VISIBLE_DEVICES"] = "0"
            # TF_CONFIG's ports are TensorFlow's; torch's store port is MASTER_PORT, which TI-ONE's
            # start script exports (default 29500: a shared test machine may have that in use).
            variables["MASTER_PORT"] = str(torch_port)
        return variables

    start = time.monotonic()
    ps = cli("node", *overrides, env=node_env(task("ps", 0)), timeout=60)
    assert time.monotonic() - start < 30
    assert "no parameter-server role" in ps.stdout and "Exiting 0" in ps.stdout
    assert "$ " not in ps.stdout and not (tmp_path / "run").exists()

    results = run_nodes(
        cli, tmp_path, [("worker1", task("worker", 1), None), ("worker0", task("worker", 0), None)], overrides
    )
    for name in ("worker0", "worker1"):
        args = torchrun_args(results[name][1])
        assert flag(args, "--rdzv-endpoint") == f"127.0.0.1:{torch_port}"
        assert flag(args, "--rdzv-conf") == f"is_host={'true' if name == 'worker0' else 'false'},node_rank={name[-1]}"
    assert_one_job_of_two(results, "worker0", tmp_path / "run", metrics)


@pytest.mark.part("kubeflow")
def test_contradictory_kubeflow_variables_exit_1_naming_both(cli, tmp_path, overrides):
    """A Kubeflow pod whose image also sets mpirun's rank variables: no guess, one line naming both."""
    variables = {
        "PET_NNODES": "2",
        "PET_NODE_RANK": "0",
        "PET_NPROC_PER_NODE": "1",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": "29500",
        "OMPI_COMM_WORLD_RANK": "0",
        "OMPI_COMM_WORLD_SIZE": "2",
    }
    proc = cli("node", *overrides, env=node_env(variables), expect=1, timeout=60)
    assert proc.stderr.startswith("error: "), proc.stderr
    for word in ("kubeflow", "PET_NNODES", "openmpi", "OMPI_COMM_WORLD_RANK"):
        assert word in proc.stderr
    assert "Traceback" not in proc.stderr and "$ " not in proc.stdout
    assert not (tmp_path / "run").exists()


@pytest.mark.part("kubeflow")
def test_hand_edited_replicas_the_global_batch_cannot_split_are_refused_in_one_line(cli, tmp_path, overrides):
    """Kubeflow replicas edited to 3 nodes: the config's global batch of 8 runs on any world it splits
    over (2 nodes above, whatever cluster.nodes says), not on 3 ranks of micro 4. The master pod
    refuses before torchrun starts, in one line naming the nearest values that would work."""
    variables = {
        "PET_NNODES": "3",
        "PET_NODE_RANK": "0",
        "PET_NPROC_PER_NODE": "1",
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": "29500",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
        "WORLD_SIZE": "3",
        "RANK": "0",
    }
    proc = cli("node", *overrides, env=node_env(variables), expect=1, timeout=60)
    assert proc.stderr.strip().splitlines() == [
        "error: batch.global_batch_size=8 is not a multiple of batch.micro_batch_size (4) x data-parallel size (3) "
        "= 12; set it to 12, or run on 1 or 2 data-parallel ranks (for 3 processes)"
    ], proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "run" / "metrics.jsonl").exists()
