"""The MPIJob's Launcher command for real: the GENERATED launch/kubeflow/mpijob.yaml's Launcher
container (its command and env, exactly as rendered) runs here with a hostfile in the MPI
Operator's format, real DeepSpeed (`--launcher openmpi`), real Open MPI mpirun and a tiny ZeRO-2 job.

    python -m pytest -q tests/test_mpijob.py      # needs mpirun (Debian: openmpi-bin) and DeepSpeed

What stands in for Kubernetes: the hostfile names 127.0.0.2 and 127.0.0.3 as the Workers, and
OMPI_MCA_plm_rsh_agent is a script that "logs into" them the way sshd would, running mpirun's
daemon here with an EMPTY environment (`env -i`). So the ranks see only what `mpirun -x` passes
on from the Launcher's env, as in the Worker pods, where processes started by sshd inherit none of
the pod's variables. Both ranks share this machine's cores; Gloo on `lo`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from conftest import BIN, LOGIN_PATH, copy_demo_corpus, free_port, render

TINY = [
    "model.size=tiny",
    "model.sequence_len=64",
    "batch.global_batch_size=8",
    "batch.micro_batch_size=4",
    "batch.grad_accum_steps=null",
    "schedule.max_steps=10",
    "schedule.warmup_steps=2",
    "logging.every_steps=5",
    "logging.eval_every_steps=0",
    "checkpoint.every_steps=10",
    "run.device=cpu",
    "run.compile=false",
]
# Stand-in for `ssh HOST CMD` into a Worker: a new login has none of the caller's environment. Each
# "host" gets its own temporary folder, as separate pods have: two of mpirun's daemons on one machine
# would otherwise race for the same session directory under /tmp.
AGENT = """#!/bin/sh
echo "$1" >> {log}
mkdir -p {tmp}/$1
export_tmp="OMPI_MCA_orte_tmpdir_base={tmp}/$1"
shift
exec env -i PATH={login_path} HOME="$HOME" "$export_tmp" /bin/sh -c "$*"
"""


def require_mpirun() -> None:
    if shutil.which("mpirun") is None or shutil.which("ompi_info") is None:
        pytest.fail("Open MPI is missing: apt-get install openmpi-bin (or bash tests/infra/install-system.sh)")


def ds_project(root: Path, corpus: Path, nodes: int, gpus_per_node: int) -> Path:
    """A DeepSpeed ZeRO-2 project with Kubeflow, its shared mount here, data prepared on it."""
    project = render(
        root / "p",
        project_name="Mpi Job",
        platforms="[devmachine,kubeflow]",
        strategy="deepspeed",
        zero_stage=2,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        fabric="tcp",
        nccl_socket_ifname="lo",
        shared_mount=str(root),
        data_dir=str(root / "data"),
        output_dir=str(root / "runs"),
    )
    copy_demo_corpus(corpus, root / "data")
    return project


def run_launcher(project: Path, hostfile_text: str, tmp: Path, timeout: int = 300):
    """The Launcher container of launch/kubeflow/mpijob.yaml, run from the project root (the image's
    WORKDIR) with the container's env and the operator's hostfile; returns (process, agent log)."""
    job = yaml.safe_load((project / "launch" / "kubeflow" / "mpijob.yaml").read_text())
    (container,) = job["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"]
    hostfile, agent, agent_log = tmp / "hostfile", tmp / "agent.sh", tmp / "agent.log"
    hostfile.write_text(hostfile_text)
    agent.write_text(AGENT.format(log=agent_log, tmp=tmp / "hosts", login_path=LOGIN_PATH))
    agent.chmod(0o755)
    env = {
        # What the image provides: python3 with the project (here: on PYTHONPATH) and DeepSpeed.
        "PATH": os.pathsep.join([str(BIN), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": os.environ["HOME"],
        "PYTHONPATH": str(project / "src"),
        "OMP_NUM_THREADS": "1",
        **{e["name"]: e["value"] for e in container["env"]},
        # What the operator provides: the hostfile (at /etc/mpi/hostfile in a pod) and SSH to the Workers.
        "MPI_HOSTFILE": str(hostfile),
        "OMPI_MCA_plm_rsh_agent": str(agent),
        "MASTER_PORT": str(free_port()),
        "TRAIN_DEBUG": "1",
    }
    # Its own process group: on a timeout, mpirun and the ranks end with the runner.
    proc = subprocess.Popen(
        container["command"] + TINY,
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"the Launcher command did not end within {timeout} s:\n{stdout[-4000:]}\n{stderr[-4000:]}")
    result = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return result, (agent_log.read_text().split() if agent_log.exists() else [])


def assert_trained(project: Path, output: str) -> None:
    runs = project.parent / "runs"
    assert "2 process(es) on cpu" in output and "strategy deepspeed ZeRO 2" in output, output[-6000:]
    steps = [r["step"] for r in map(json.loads, (runs / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert steps == [5, 10], steps
    shards = sorted(p.name for p in (runs / "checkpoints" / "step_00000010").glob("zero_pp_rank_*_optim_states.pt"))
    assert shards == ["zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    # TRAIN_DEBUG=1 was set on the Launcher only: the ranks got it through -x, and `node` applied
    # config/nccl-debug.env, whose flight-recorder folder it creates on the shared storage.
    assert (runs / "nccl-trace").is_dir()


def test_two_workers_one_slot_each(tmp_path, demo_corpus):
    """nodes=2, gpus_per_node=1: mpirun reaches both Workers through the agent and starts one rank
    on each; rank 0 (first Worker) is the master."""
    require_mpirun()
    project = ds_project(tmp_path, demo_corpus, nodes=2, gpus_per_node=1)
    proc, logged_in = run_launcher(project, "127.0.0.2 slots=1\n127.0.0.3 slots=1\n", tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-8000:]
    assert sorted(logged_in) == ["127.0.0.2", "127.0.0.3"], logged_in  # both Workers, over "ssh"
    # DeepSpeed's runner built the mpirun command: the operator's hostfile, the -x list of the manifest.
    cmd = re.search(r"cmd = (mpirun .*)$", output, re.MULTILINE)
    assert cmd and cmd.group(1).startswith(f"mpirun -n 2 -hostfile {tmp_path / 'hostfile'} "), output[-6000:]
    assert "-x MASTER_ADDR -x MASTER_PORT -x TRAIN_DEBUG -x PATH -x NCCL_DEBUG" in cmd.group(1)
    assert cmd.group(1).endswith(" -u -m mpijob node " + " ".join(TINY))
    # Rank 0's node table: one process per rank, the first Worker is the master.
    assert re.search(r"^platform\s+openmpi \(one process per rank, no torchrun\)$", output, re.MULTILINE), output
    assert re.search(r"^master\s+127\.0\.0\.2:\d+$", output, re.MULTILINE), output
    assert re.search(r"^nodes\s+2$", output, re.MULTILINE), output
    assert_trained(project, output)


def test_one_worker_two_slots(tmp_path, demo_corpus):
    """nodes=1, gpus_per_node=2: two ranks on one Worker (local ranks 0 and 1). --force_multi makes
    DeepSpeed use mpirun even for one host: the Launcher itself has no GPU to train on."""
    require_mpirun()
    project = ds_project(tmp_path, demo_corpus, nodes=1, gpus_per_node=2)
    proc, logged_in = run_launcher(project, "127.0.0.2 slots=2\n", tmp_path)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-8000:]
    assert logged_in == ["127.0.0.2"], logged_in
    assert re.search(r"^processes per node\s+2$", output, re.MULTILINE), output
    assert_trained(project, output)


def test_worker_prestop_makes_the_ranks_save_before_the_pod_goes(tmp_path, demo_corpus):
    """The Worker's preStop hook, exactly as rendered, run here against a real training process:
    it finds the rank by its command line, sends SIGUSR1, and returns only once the rank has saved
    and exited 143 (the preemption code)."""
    project = ds_project(tmp_path, demo_corpus, nodes=2, gpus_per_node=1)
    job = yaml.safe_load((project / "launch" / "kubeflow" / "mpijob.yaml").read_text())
    (worker,) = job["spec"]["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"]
    hook = worker["lifecycle"]["preStop"]["exec"]["command"]
    assert "-m mpijob trai[n]( |$)" in hook[-1]
    env = {
        **os.environ,
        "PYTHONPATH": str(project / "src"),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "TRAIN_FAULT_STEP_SECONDS": "0.2",
    }
    log = tmp_path / "rank.log"
    with open(log, "w") as out:
        rank = subprocess.Popen(
            [
                str(BIN / "python"),
                "-u",
                "-m",
                "mpijob",
                "train",
                *TINY,
                "schedule.max_steps=500",
                "logging.every_steps=1",
                "run.strategy=ddp",
            ],
            cwd=project,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 120
        while "step      3/" not in log.read_text():
            assert rank.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        hook_run = subprocess.run(hook, capture_output=True, text=True, timeout=120)
        assert hook_run.returncode == 0, hook_run.stderr
        assert rank.poll() == 143, log.read_text()[-3000:]  # already gone when the hook returned
    finally:
        if rank.poll() is None:
            os.killpg(rank.pid, signal.SIGKILL)
    record = json.loads((tmp_path / "runs" / "preempted.json").read_text())
    assert (
        record["signal"] == "SIGUSR1"
        and (tmp_path / "runs" / "checkpoints" / f"step_{record['step']:08d}.pt").is_file()
    )
