"""DeepSpeed's multi-node launchers for real, started by a GENERATED project's
`launch devmachine --launcher deepspeed --nnodes 2` on "node 0": pdsh (DeepSpeed's default, ssh)
and openmpi (mpirun), each training a tiny ZeRO-2 job with one rank on each of two hosts.

    python -m pytest -q tests/test_deepspeed_launcher.py   # needs pdsh and mpirun (tests/infra/install-system.sh)

What stands in for the other machines: the hostfile names 127.0.0.2 and 127.0.0.3, and the remote
login is a stand-in that runs the command here with an EMPTY environment (`env -i`), as sshd would
give it: an `ssh` script first on PATH for pdsh, OMPI_MCA_plm_rsh_agent for mpirun. So a rank has
only what DeepSpeed passes on: its own exports plus DS_ENV_FILE, where `launch` writes the NCCL/Gloo
settings and the master address. The one-machine and --no-ssh cases are the generated project's
own tests/test_deepspeed_launcher.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest
from conftest import BIN, LOGIN_PATH, copy_demo_corpus, free_port, render, run

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
LOGIN = f'exec env -i PATH={LOGIN_PATH} HOME="$HOME" OMPI_MCA_orte_tmpdir_base={{tmp}}/$host /bin/sh -c "$*"'
# pdsh runs `ssh [options] HOST COMMAND`; a new login has none of the caller's environment. Each host
# gets its own temporary folder, as separate machines have.
SSH = (
    """#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -l|-p|-o|-i) shift 2;; -*) shift;; *) break;; esac; done
host=$1; shift
echo "$host" >> {log}
mkdir -p {tmp}/$host
"""
    + LOGIN
    + "\n"
)
# mpirun's remote agent gets `HOST COMMAND`.
AGENT = (
    """#!/bin/sh
host=$1; shift
echo "$host" >> {log}
mkdir -p {tmp}/$host
"""
    + LOGIN
    + "\n"
)


def require(program: str, package: str) -> None:
    if shutil.which(program) is None:
        pytest.fail(f"{program} is missing: apt-get install {package} (or bash tests/infra/install-system.sh)")


@pytest.fixture(scope="module")
def project(tmp_path_factory, demo_corpus) -> Path:
    root = tmp_path_factory.mktemp("ds-launcher")
    project = render(
        root / "p",
        project_name="Ds Launch",
        platforms="[devmachine]",
        strategy="deepspeed",
        zero_stage=2,
        nodes=2,
        gpus_per_node=1,
        fabric="tcp",
        nccl_socket_ifname="lo",
        data_dir=str(root / "data"),
        output_dir=str(root / "runs"),
    )
    copy_demo_corpus(demo_corpus, root / "data")
    return project


def launch_two_nodes(project: Path, tmp: Path, backend: str, env: dict):
    hostfile = tmp / "hostfile"
    hostfile.write_text("127.0.0.2 slots=1\n127.0.0.3 slots=1\n")
    out = tmp / "runs"
    base = {
        "PATH": os.pathsep.join([str(BIN), "/usr/local/bin", "/usr/bin", "/bin"]),
        "HOME": os.environ["HOME"],
        "PYTHONPATH": str(project / "src"),
        "OMP_NUM_THREADS": "1",
    }
    proc = run(
        [
            str(BIN / "python"),
            "-m",
            "dslaunch",
            "launch",
            "devmachine",
            "--launcher",
            "deepspeed",
            "--nnodes",
            "2",
            "--hostfile",
            str(hostfile),
            "--ds-launcher",
            backend,
            "--master-port",
            str(free_port()),
            *TINY,
            f"run.output_dir={out}",
        ],
        cwd=project,
        env={**base, **env},
        timeout=300,
    )
    return proc, out


def assert_two_ranks_trained(out: Path, output: str) -> None:
    assert "2 process(es) on cpu" in output and "strategy deepspeed ZeRO 2" in output, output[-6000:]
    steps = [r["step"] for r in map(json.loads, (out / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert steps == [5, 10], steps
    shards = sorted(p.name for p in (out / "checkpoints" / "step_00000010").glob("zero_pp_rank_*_optim_states.pt"))
    assert len(shards) == 2, shards
    # What reached the other hosts: config/nccl.env as applied on node 0, and the master (the first host).
    passed = dict(line.split("=", 1) for line in (out / "deepspeed_env").read_text().splitlines())
    assert passed["GLOO_SOCKET_IFNAME"] == passed["NCCL_SOCKET_IFNAME"] == "lo"
    assert passed["MASTER_ADDR"] == "127.0.0.2" and passed["NCCL_IB_DISABLE"] == "1"


def test_pdsh_starts_both_hosts(project, tmp_path):
    """DeepSpeed's default: its runner checks ssh to the first host, then pdsh runs
    deepspeed.launcher.launch on every host (node rank = pdsh's %n), which starts the rank there."""
    require("pdsh", "pdsh")
    fake = tmp_path / "bin"
    fake.mkdir()
    log = tmp_path / "ssh.log"
    (fake / "ssh").write_text(SSH.format(log=log, tmp=tmp_path / "hosts"))
    (fake / "ssh").chmod(0o755)
    proc, out = launch_two_nodes(project, tmp_path, "pdsh", {"PATH": f"{fake}{os.pathsep}{BIN}:/usr/bin:/bin"})
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-8000:]
    cmd = re.search(r"cmd = (pdsh .*)$", output, re.MULTILINE)
    assert cmd and cmd.group(1).startswith("pdsh -S -f 1024 -w 127.0.0.2,127.0.0.3 "), output[-4000:]
    assert "--node_rank=%n" in cmd.group(1) and "--no_local_rank" in cmd.group(1)
    # The ssh check (first host), then one login per host.
    assert sorted(log.read_text().split()) == ["127.0.0.2", "127.0.0.2", "127.0.0.3"]
    assert_two_ranks_trained(out, output)


def test_openmpi_starts_both_hosts(project, tmp_path):
    """--ds-launcher openmpi: DeepSpeed's runner builds one mpirun over the hostfile; the ranks run
    `train` with OMPI_COMM_WORLD_* and learn the master only from DS_ENV_FILE (mpirun -x)."""
    require("mpirun", "openmpi-bin")
    agent, log = tmp_path / "agent.sh", tmp_path / "agent.log"
    agent.write_text(AGENT.format(log=log, tmp=tmp_path / "hosts"))
    agent.chmod(0o755)
    # The ssh check of DeepSpeed's runner uses plain ssh: the same stand-in.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "ssh").write_text(SSH.format(log=tmp_path / "ssh.log", tmp=tmp_path / "hosts"))
    (fake / "ssh").chmod(0o755)
    env = {
        "PATH": f"{fake}{os.pathsep}{BIN}:/usr/bin:/bin",
        "OMPI_MCA_plm_rsh_agent": str(agent),
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
    }
    proc, out = launch_two_nodes(project, tmp_path, "openmpi", env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-8000:]
    cmd = re.search(r"cmd = (mpirun .*)$", output, re.MULTILINE)
    assert cmd and cmd.group(1).startswith(f"mpirun -n 2 -hostfile {tmp_path / 'hostfile'} "), output[-4000:]
    assert "-x MASTER_ADDR=127.0.0.2" in cmd.group(1) and cmd.group(1).endswith(
        " -u -m dslaunch train " + " ".join(TINY) + f" run.output_dir={out}"
    )
    assert sorted(log.read_text().split()) == ["127.0.0.2", "127.0.0.3"]
    assert_two_ranks_trained(out, output)
