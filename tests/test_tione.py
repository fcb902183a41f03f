"""TI-ONE, launched for real: each mode's generated start script runs as TI-ONE runs it, with the
variables TI-ONE injects, and trains a tiny model on CPU.

    python -m pytest -q tests/test_tione.py            # about 3 minutes on 2 cores
    python -m pytest -q tests/test_tione.py -k mpi     # the mpirun launches only (needs openmpi-bin)

MPI: mpirun (Open MPI) with NODE_IP_SLOT_LIST on one instance, then a launcher and a worker
"instance" where the worker's ranks reach it through a remote-launch agent (the job TI-ONE's ssh or
exec into the container does), with a fresh environment. Ray: a real local Ray cluster of two
nodes, once started by the test as TI-ONE's Ray mode does, once by the script's own RANK=0 and
RANK=1 invocations. DDP: a task that TI-ONE restarts (the start script run again on the same shared
output_dir with a longer schedule) resumes from the checkpoint, and one stopped with SIGTERM saves
first; both end bitwise equal to an uninterrupted run. PS-Worker runs with simulated variables elsewhere.

`launch tione` talks to TI-ONE's API (CreateTrainingTask, DescribeTrainingTask, DescribeLogs,
StopTrainingTask) through the official SDK; here it talks to a local endpoint on 127.0.0.1 that
checks each request's TC3 signature and validates its body against the SDK's own request model (an
unknown or misspelt field fails the test), and answers in the documented shapes.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import shutil
import socket
import subprocess
import threading
import time
import warnings
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml
from conftest import BIN, LOGIN_PATH, TEMPLATE, copy_demo_corpus, free_port, render, run, run_project_suite, slug_of
from test_generated_project import part_tests

TRAIN = [
    "model.size=tiny",
    "model.sequence_len=64",
    "batch.global_batch_size=8",
    "batch.micro_batch_size=4",
    "schedule.max_steps=10",
    "schedule.warmup_steps=2",
    "logging.every_steps=5",
    "logging.eval_every_steps=0",
    "checkpoint.every_steps=0",
    "run.device=cpu",
    "run.dtype=fp32",
    "logging.tensorboard=false",
]
# Variables of any platform that a developer's shell might carry into the launches.
FOREIGN = re.compile(
    r"^(PET_|SLURM_|OMPI_|PMIX_|TF_CONFIG$|HEAD_|NODE_IP_SLOT_LIST$|GPU_NUM|INDEX$|NODE_LIST$|"
    r"RANK$|LOCAL_RANK$|WORLD_SIZE$|MASTER_|RAY_)"
)
MODES = {"ddp": "start-ddp.sh", "mpi": "start-mpi.sh", "ray": "start-ray.sh", "ps-worker": "start-ps-worker.sh"}


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not FOREIGN.match(k)}
    env.update(PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", OMP_NUM_THREADS="1", **extra)
    return env


def sh(cmd: list[str], env: dict[str, str], cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            return True
    except OSError:
        return False


def require_mpirun() -> None:
    """Open MPI comes from tests/infra/install-system.sh (apt as root); fail loudly without it."""
    result = run(["bash", str(TEMPLATE / "tests" / "infra" / "install-system.sh")], timeout=900)
    assert result.returncode == 0, result.stdout + result.stderr
    assert run(["mpirun", "--version"]).returncode == 0, "mpirun not found: apt-get install openmpi-bin"


def ray_cli() -> str:
    ray = BIN / "ray"
    assert ray.exists(), (
        f"ray is not installed for {BIN / 'python'}: pip install 'ray[train]' "
        "(./dev test installs requirements-platforms.txt)"
    )
    return str(ray)


def project_answers(project: Path) -> dict:
    return yaml.safe_load((project / ".copier-answers.yml").read_text())


def metrics(output_dir: Path) -> list[dict]:
    path = output_dir / "metrics.jsonl"
    assert path.is_file(), f"no {path}"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_trained(output: str, output_dir: Path, world: int) -> None:
    assert f"| {world} process(es) on cpu" in output, output[-4000:]
    steps = [m for m in metrics(output_dir) if "loss" in m]
    assert [m["step"] for m in steps] == [5, 10], steps
    assert all(0 < m["loss"] < 20 for m in steps), steps


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory, demo_corpus) -> Path:
    """Demo corpus, tokenizer and shards, on this module's "shared storage" (read only)."""
    return copy_demo_corpus(demo_corpus, tmp_path_factory.mktemp("tione-data") / "data")


def render_mode(tmp_path: Path, data_dir: Path, mode: str, nodes: int, gpus_per_node: int) -> Path:
    return render(
        tmp_path / "project",
        project_name=f"Tione {mode} Run",
        platforms="[tione]",
        tione_mode=mode,
        nodes=nodes,
        gpus_per_node=gpus_per_node,
        data_dir=str(data_dir),
        output_dir=str(tmp_path / "runs"),
    )


# ---------------------------------------------------------------------------------------------
# Files and `launch tione`


@pytest.mark.parametrize("mode", MODES)
def test_one_start_script_per_mode_and_launch_console_prints_the_readme_settings(tmp_path, mode):
    project = render(
        tmp_path / "p",
        project_name="Console",
        platforms="[devmachine, tione]",
        tione_mode=mode,
        nodes=2,
        gpus_per_node=8,
        image="ccr.ccs.tencentyun.com/team/console:v3",
    )
    assert sorted(p.name for p in (project / "launch" / "tione").iterdir()) == sorted(
        ["README.md", "task.yaml", MODES[mode]]
    )
    cli = ["python", "-m", slug_of(project), "launch", "tione"]
    env = api_env(project, tmp_path / "home", credentials=False)
    shown = sh(cli + ["--console"], env, cwd=project)
    assert shown.returncode == 0, shown.stderr
    readme = (project / "launch" / "tione" / "README.md").read_text()
    block = readme.split("<!-- console-settings:start -->\n")[1].split("<!-- console-settings:end -->")[0]
    assert shown.stdout == block
    assert f"bash /opt/ml/code/launch/tione/{MODES[mode]}" in shown.stdout
    assert "ccr.ccs.tencentyun.com/team/console:v3" in shown.stdout and "NCCL_IB_HCA" in shown.stdout
    # --dry-run is the API request now, not the console text.
    dry = sh(cli + ["--dry-run"], env, cwd=project)
    assert (
        dry.returncode == 0
        and json.loads(dry.stdout)["ImageInfo"]["ImageUrl"] == "ccr.ccs.tencentyun.com/team/console:v3"
    ), dry.stdout + dry.stderr
    script = (project / "launch" / "tione" / MODES[mode]).read_text()
    # Restarts resume from the shared output_dir: the script names it and never deletes anything.
    assert "training resumes from <output_dir>/checkpoints/latest" in script.replace("\n# ", " ")
    assert not re.search(r"(^|[;&|]\s*)\s*rm\s", script, re.MULTILINE), "a start script must not delete files"
    assert f"{project_answers(project)['output_dir']}" in script and "SHARED_MOUNT" in script
    assert f"resumes from\n`{project_answers(project)['output_dir']}/checkpoints/latest`" in readme
    with_overrides = sh(cli + ["--console", "schedule.max_steps=7"], env, cwd=project)
    assert with_overrides.returncode == 0, with_overrides.stderr
    assert with_overrides.stdout.startswith(block.rstrip() + "\n")
    assert f"{MODES[mode]} schedule.max_steps=7" in with_overrides.stdout
    # Inside a TI-ONE task the start script is what must run: say so, exit 1 (before any credentials).
    inside = sh(cli, {**env, "HEAD_ADDR": "head-0", "HEAD_PORT": "6379"}, cwd=project)
    assert inside.returncode == 1 and f"bash {project}/launch/tione/{MODES[mode]}" in inside.stderr, inside.stderr
    assert "Traceback" not in inside.stderr and len(inside.stderr.strip().splitlines()) == 1, inside.stderr


def test_tione_project_own_platform_tests_pass(tmp_path, data_dir):
    """The project's TI-ONE tests (its platform folder's): every mode's variables read into one
    topology (and real two-node DDP and PS-Worker jobs started from them), their bad values, its
    damaged task.yaml."""
    project = render_mode(tmp_path, data_dir, "ddp", 2, 1)
    log = run_project_suite(project, *part_tests(), name="tione-project", timeout=900)
    assert "test_tione_ddp_counts_nodes_not_processes PASSED" in log and "[tione ps chief] PASSED" in log
    assert "test_a_damaged_launch_file_is_one_line_from_its_dry_run[" in log


def test_mpi_role_follows_index_then_the_first_host(tmp_path):
    project = render(tmp_path / "p", project_name="Roles", platforms="[tione]", tione_mode="mpi", nodes=2)
    script = str(project / "launch" / "tione" / "start-mpi.sh")
    me = socket.gethostname()
    hostfile = tmp_path / "hostfile"
    # TI-ONE's hostfile: instance names, both entries on one line.
    hostfile.write_text(f"{me} slots=8 train-123-worker-0 slots=8\n")
    base = clean_env(DRY_RUN="1", OMPI_MCA_orte_default_hostfile=str(hostfile), GPU_NUM="16")
    launcher = sh(["bash", script], base)
    assert launcher.returncode == 0, launcher.stderr
    assert f"this instance is the launcher (first host {me} is this machine)" in launcher.stdout
    assert f"-np 16 -H {me}:8,train-123-worker-0:8" in launcher.stdout
    assert f"-x MASTER_ADDR={me} -x MASTER_PORT=29500" in launcher.stdout
    hostfile.write_text("train-123-launcher slots=8\ntrain-123-worker-0 slots=8\n")
    worker = sh(["bash", script], base)
    assert "this instance is the worker (first host train-123-launcher is another machine)" in worker.stdout
    # NODE_IP_SLOT_LIST names instances by IP: this machine's own address makes it the launcher,
    # a neighbour's (same subnet) does not.
    for ip in [a for a in run(["hostname", "-I"]).stdout.split() if re.fullmatch(r"[0-9.]+", a)][:1]:
        other = ip.rsplit(".", 1)[0] + (".7" if not ip.endswith(".7") else ".8")
        by_ip = sh(["bash", script], {**base, "NODE_IP_SLOT_LIST": f"{ip}:8,{other}:8"})
        assert f"this instance is the launcher (first host {ip} is this machine)" in by_ip.stdout, by_ip.stdout
        by_ip = sh(["bash", script], {**base, "NODE_IP_SLOT_LIST": f"{other}:8,{ip}:8"})
        assert f"this instance is the worker (first host {other} is another machine)" in by_ip.stdout, by_ip.stdout
    assert "this instance is the launcher (INDEX=0)" in sh(["bash", script], {**base, "INDEX": "0"}).stdout
    assert "this instance is the worker (INDEX=1)" in sh(["bash", script], {**base, "INDEX": "1"}).stdout
    missing = sh(["bash", script], {**base, "OMPI_MCA_orte_default_hostfile": str(tmp_path / "none")})
    assert missing.returncode == 1 and "NODE_IP_SLOT_LIST" in missing.stderr


# ---------------------------------------------------------------------------------------------
# MPI: mpirun for real


def test_mpi_one_instance_two_ranks(tmp_path, data_dir):
    """TI-ONE MPI mode with one instance of 2 GPUs: the start script mpiruns 2 ranks that train together."""
    require_mpirun()
    project = render_mode(tmp_path, data_dir, "mpi", nodes=1, gpus_per_node=2)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    env = clean_env(
        NODE_IP_SLOT_LIST="127.0.0.1:2",
        OMPI_MCA_orte_default_hostfile=str(hostfile),
        GPU_NUM="2",
        GPU_NUM_PER_NODE="2",
        MASTER_PORT=str(free_port()),
    )
    result = sh(["bash", str(project / "launch" / "tione" / "start-mpi.sh"), *TRAIN], env)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-6000:]
    assert "this instance is the launcher (the only host)" in out
    assert re.search(r"platform\s+openmpi", out) and re.search(r"processes per node\s+2", out), out
    assert_trained(out, tmp_path / "runs", world=2)


AGENT = """#!/bin/sh
# Stand-in for TI-ONE's remote launch into another instance (ssh, or exec into its container):
# drop the host name and run the command here in a fresh environment, as a new login would.
echo "$1" >> {log}
shift
exec env -i PATH={login_path} HOME="$HOME" /bin/sh -c "$*"
"""


def test_mpi_launcher_and_worker_instances(tmp_path, data_dir):
    """Two instances as TI-ONE runs them: both run the start command; the launcher (INDEX=0) mpiruns
    one rank per instance, the worker (INDEX=1) waits until its rank, started through the remote
    agent with only what -x carries, has ended, then exits 0."""
    require_mpirun()
    project = render_mode(tmp_path, data_dir, "mpi", nodes=2, gpus_per_node=1)
    script = str(project / "launch" / "tione" / "start-mpi.sh")
    agent, agent_log = tmp_path / "agent.sh", tmp_path / "agent.log"
    agent.write_text(AGENT.format(log=agent_log, login_path=LOGIN_PATH))
    agent.chmod(0o755)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("127.0.0.1 slots=1 127.0.0.2 slots=1\n")  # 127.0.0.2: "another" instance on lo
    env = clean_env(
        OMPI_MCA_orte_default_hostfile=str(hostfile),
        OMPI_MCA_plm_rsh_agent=str(agent),
        GPU_NUM="2",
        GPU_NUM_PER_NODE="1",
        MASTER_PORT=str(free_port()),
        POLL_SECONDS="1",
    )
    worker_log = tmp_path / "worker.log"
    with open(worker_log, "w") as log:
        worker = subprocess.Popen(
            ["bash", script, *TRAIN], env={**env, "INDEX": "1"}, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        launcher = sh(["bash", script, *TRAIN], {**env, "INDEX": "0"})
        worker_rc = worker.wait(timeout=60)
    finally:
        if worker.poll() is None:
            worker.kill()
    out, worker_out = launcher.stdout + launcher.stderr, worker_log.read_text()
    assert launcher.returncode == 0, out[-6000:]
    assert "this instance is the launcher (INDEX=0)" in out
    assert worker_rc == 0, worker_out
    assert "this instance is the worker (INDEX=1)" in worker_out
    assert "mpirun reached this instance" in worker_out and "ranks have ended; exiting 0" in worker_out
    assert agent_log.read_text().split() == ["127.0.0.2"]
    assert re.search(r"nodes\s+2\n", out) and re.search(r"processes per node\s+1\n", out), out
    assert_trained(out, tmp_path / "runs", world=2)


# ---------------------------------------------------------------------------------------------
# Ray: a real two-node Ray cluster on this machine


# Ten tiny steps take seconds; starting them does not: on two loaded cores Ray's own processes, the
# controller and two workers importing torch took 4-6 minutes (100 s to start the worker group alone).
RAY_TRAINING_SECONDS = 700


def ray_nodes_of(output: str) -> dict[int, str]:
    """Worker rank -> the Ray node id it reported (ray_train.WORKER_LINE). Each line reaches the head's
    output through a log monitor: two Ray nodes on one machine share the log folder, so both of theirs
    send it, in either order. ray-train exempts these lines from Ray's folding of similar lines, which
    kept only the last one seen (one rank's line could go missing and both ranks look like one node)."""
    found: dict[int, str] = {}
    for rank, node in re.findall(r"ray worker rank (\d+)/2 on node (\w+)", output):
        assert found.setdefault(int(rank), node) == node, f"rank {rank} reported two nodes:\n{output[-6000:]}"
    assert sorted(found) == [0, 1], f"not every worker's placement line: {found}\n{output[-6000:]}"
    return found


def assert_one_worker_per_node(output: str) -> None:
    nodes = ray_nodes_of(output)
    assert len(set(nodes.values())) == 2, f"both workers on one node: {nodes}\n{output[-6000:]}"


def test_ray_on_a_cluster_tione_started(tmp_path, data_dir):
    """TI-ONE's Ray mode: the platform starts head and worker node and runs the start command on the
    head (RANK=0). The script must find that cluster, not start another, and train 2 workers on it."""
    ray = ray_cli()
    project = render_mode(tmp_path, data_dir, "ray", nodes=2, gpus_per_node=1)
    port = free_port()
    env = clean_env()
    try:
        head = sh(
            [
                ray,
                "start",
                "--head",
                "--port",
                str(port),
                "--num-cpus",
                "1",
                "--disable-usage-stats",
                "--include-dashboard=false",
            ],
            env,
        )
        assert head.returncode == 0, head.stdout + head.stderr
        node = sh([ray, "start", "--address", f"127.0.0.1:{port}", "--num-cpus", "1", "--disable-usage-stats"], env)
        assert node.returncode == 0, node.stdout + node.stderr
        result = sh(
            ["bash", str(project / "launch" / "tione" / "start-ray.sh"), *TRAIN],
            clean_env(HEAD_ADDR="127.0.0.1", HEAD_PORT=str(port), RANK="0"),
            timeout=RAY_TRAINING_SECONDS,
        )
        out = result.stdout + result.stderr
        assert result.returncode == 0, out[-6000:]
        assert f"a Ray cluster answers at 127.0.0.1:{port}" in out
        assert "2 Ray node(s)" in out and "starting 2 worker(s) on CPU" in out
        assert_one_worker_per_node(out)
        assert_trained(out, tmp_path / "runs", world=2)
        assert port_open(port), "the script stopped a Ray cluster it did not start"
    finally:
        sh([ray, "stop", "--force"], env)


def test_ray_script_starts_head_and_worker_joins(tmp_path, data_dir):
    """No cluster yet: RANK=0 starts the head and trains, RANK=1 joins, both exit 0 when done."""
    ray = ray_cli()  # the script finds the same CLI beside the python on PATH
    project = render_mode(tmp_path, data_dir, "ray", nodes=2, gpus_per_node=1)
    script = str(project / "launch" / "tione" / "start-ray.sh")
    port = free_port()
    env = clean_env(HEAD_ADDR="127.0.0.1", HEAD_PORT=str(port), RAY_START_ARGS="--num-cpus 1", POLL_SECONDS="1")
    worker_log = tmp_path / "rank1.log"
    with open(worker_log, "w") as log:
        worker = subprocess.Popen(
            ["bash", script, *TRAIN], env={**env, "RANK": "1"}, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        head = sh(["bash", script, *TRAIN], {**env, "RANK": "0"}, timeout=RAY_TRAINING_SECONDS)
        worker_rc = worker.wait(timeout=120)  # 3 missed probes of the head, then its own `ray stop`
        out, worker_out = head.stdout + head.stderr, worker_log.read_text()
        assert head.returncode == 0, out[-6000:]
        assert "Ray runtime started" in out and "a Ray cluster answers" not in out
        assert_one_worker_per_node(out)
        assert_trained(out, tmp_path / "runs", world=2)
        assert worker_rc == 0, worker_out
        assert "node 1 joined" in worker_out and "the head has stopped the cluster; exiting 0" in worker_out
        deadline = time.monotonic() + 20
        while port_open(port) and time.monotonic() < deadline:
            time.sleep(1)
        assert not port_open(port), "the head left its Ray cluster running"
    finally:
        if worker.poll() is None:
            worker.kill()
        sh([ray, "stop", "--force"], clean_env())


# ---------------------------------------------------------------------------------------------
# DDP: restarted and preempted tasks resume from the shared output_dir

# A constant learning rate after warmup (min_lr_ratio 1.0): the schedule then does not depend on
# schedule.max_steps, so a task restarted with a longer schedule follows the uninterrupted run exactly.
RESUME = [
    "model.size=tiny",
    "model.sequence_len=64",
    "batch.global_batch_size=8",
    "batch.micro_batch_size=4",
    "schedule.warmup_steps=2",
    "schedule.min_lr_ratio=1.0",
    "logging.every_steps=2",
    "logging.eval_every_steps=0",
    "checkpoint.every_steps=2",
    "run.device=cpu",
    "run.dtype=fp32",
    "logging.tensorboard=false",
]


def tione_ddp_env(shared: Path, **extra: str) -> dict[str, str]:
    """What TI-ONE injects on the only node of a 1-node, 2-GPU DDP task (the seed's variables)."""
    return clean_env(
        WORLD_SIZE="1",
        RANK="0",
        INDEX="0",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(free_port()),
        GPU_NUM_PER_NODE="2",
        GPU_NUM="2",
        NODE_LIST="127.0.0.1:2",
        SHARED_MOUNT=str(shared),
        **extra,
    )


def losses(output_dir: Path) -> dict[int, tuple]:
    """step -> (loss, lr, grad_norm) of the training records."""
    return {m["step"]: (m["loss"], m["lr"], m["grad_norm"]) for m in metrics(output_dir) if "loss" in m}


@pytest.fixture(scope="module")
def ddp_task(tmp_path_factory, data_dir):
    """A rendered DDP project whose shared storage is a temporary folder, and an uninterrupted 8-step
    run through start-ddp.sh to compare the resumed runs with."""
    root = tmp_path_factory.mktemp("tione-ddp")
    project = render(
        root / "project",
        project_name="Tione Ddp Resume",
        platforms="[tione]",
        tione_mode="ddp",
        nodes=1,
        gpus_per_node=2,
        shared_mount=str(root),
        data_dir=str(data_dir),
        output_dir=str(root / "runs"),
    )
    script = str(project / "launch" / "tione" / "start-ddp.sh")
    straight = root / "straight"
    result = sh(["bash", script, *RESUME, "schedule.max_steps=8", f"run.output_dir={straight}"], tione_ddp_env(root))
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    assert sorted(losses(straight)) == [2, 4, 6, 8]
    return root, script, losses(straight)


def test_ddp_task_restarted_by_tione_resumes_from_the_shared_output_dir(ddp_task):
    """The task trains 4 steps and ends; TI-ONE runs the start command again (same output_dir on the
    shared storage, schedule.max_steps raised to 8): it resumes at step 4 and ends where an
    uninterrupted 8-step run ends, bit for bit."""
    root, script, straight = ddp_task
    runs = root / "runs"
    first = sh(["bash", script, *RESUME, "schedule.max_steps=4"], tione_ddp_env(root))
    out = first.stdout + first.stderr
    assert first.returncode == 0, out[-6000:]
    assert "| 2 process(es) on cpu" in out and "checkpoint found" not in out and "warning:" not in out
    assert sorted(losses(runs)) == [2, 4]
    second = sh(["bash", script, *RESUME, "schedule.max_steps=8"], tione_ddp_env(root))
    out = second.stdout + second.stderr
    assert second.returncode == 0, out[-6000:]
    assert f"checkpoint found: training resumes from {runs}/checkpoints/step_00000004.pt" in out, out[-4000:]
    assert f"resumed from {runs}/checkpoints/step_00000004.pt at step 4" in out and "steps 4->8" in out, out[-4000:]
    assert sorted(losses(runs)) == [2, 4, 6, 8]
    assert losses(runs) == straight  # steps 2 and 4 from the first run, 6 and 8 after the restart


def test_ddp_task_stopped_with_sigterm_saves_and_resumes(ddp_task):
    """SIGTERM to the start command (what stopping an instance sends): the ranks save at the next step
    boundary and it exits 143 with preempted.json; the same command again finishes the schedule with
    the uninterrupted run's losses."""
    root, script, straight = ddp_task
    out_dir = root / "preempted"
    command = ["bash", script, *RESUME, "schedule.max_steps=8", f"run.output_dir={out_dir}"]
    log = root / "preempted.log"
    with open(log, "w") as f:  # slow steps (faults.py) leave time to signal mid-run
        proc = subprocess.Popen(
            command, env=tione_ddp_env(root, TRAIN_FAULT_STEP_SECONDS="0.5"), stdout=f, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 180
        while not (out_dir / "metrics.jsonl").is_file():  # the first logged step: training is under way
            assert proc.poll() is None, f"exited ({proc.returncode}) before its first step:\n{log.read_text()[-6000:]}"
            assert time.monotonic() < deadline, f"no logged step within 180 s:\n{log.read_text()[-6000:]}"
            time.sleep(0.2)
        proc.send_signal(15)
        rc = proc.wait(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = log.read_text()
    assert rc == 143, out[-6000:]
    marker = json.loads((out_dir / "preempted.json").read_text())
    stopped = marker["step"]
    assert marker["signal"] == "SIGTERM" and 0 < stopped < 8, marker
    again = sh(command, tione_ddp_env(root))
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-6000:]
    assert f"resumed from {out_dir}/checkpoints/step_{stopped:08d}.pt at step {stopped}" in out, out[-4000:]
    assert losses(out_dir)[8] == straight[8]


def test_output_dir_off_the_shared_storage_is_a_warning(tmp_path, data_dir):
    project = render_mode(tmp_path, data_dir, "ddp", nodes=1, gpus_per_node=2)  # output_dir under tmp_path
    env = {**tione_ddp_env(tmp_path / "elsewhere"), "DRY_RUN": "1"}
    result = sh(["bash", str(project / "launch" / "tione" / "start-ddp.sh")], env)
    assert result.returncode == 0, result.stderr
    assert (
        f"warning: output_dir {tmp_path / 'runs'} is not under the shared storage {tmp_path / 'elsewhere'}"
        in result.stderr
    )


# ---------------------------------------------------------------------------------------------
# `launch tione` through TI-ONE's API, against a local endpoint

IMAGE = "ccr.ccs.tencentyun.com/team/api:v1"
STORAGE_ID, INSTANCE_TYPE, SHARED = "cfs-3f9a1c2e", "TI.GN7.20XLARGE320.POST", "/mnt/cfs"
REGION, PROJECT_ID, NODES = "ap-guangzhou", "proj-42", 2
SECRET_ID, SECRET_KEY = "AKIDlocaltest0123", "local-test-secret-key"
API_MODES = {"ddp": "DDP", "mpi": "MPI", "ps-worker": "PS_WORKER", "ray": None}
T0 = datetime(2024, 5, 1, 8, 0, 0, tzinfo=timezone.utc)  # the tasks' StartTime; log lines follow it
PROXIES = {"http_proxy", "https_proxy", "all_proxy", "no_proxy"}
_MODEL_LOCK = threading.Lock()


def sdk_models():
    try:
        from tencentcloud.tione.v20211111 import models
    except ImportError:
        pytest.fail(
            "the TI-ONE SDK is not installed for the tests: pip install tencentcloud-sdk-python-tione "
            "(./dev test installs requirements-platforms.txt)"
        )
    return models


def sdk_unknown_fields(model: str, data: dict) -> list[str]:
    """Names the SDK's model (or a model nested in it) does not know: it warns 'X fileds are useless.'"""
    models = sdk_models()
    with _MODEL_LOCK, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        getattr(models, model)()._deserialize(data)
    suffix = " fileds are useless."
    return sorted(
        name.strip()
        for w in caught
        if str(w.message).endswith(suffix)
        for name in str(w.message).removesuffix(suffix).split(",")
    )


def rfc3339(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def tc3_signature(secret_key: str, headers, raw: bytes, service: str = "tione") -> str:
    """TC3-HMAC-SHA256 of a POST with a JSON body, as Tencent Cloud's API documents it."""
    timestamp = headers["X-TC-Timestamp"]
    date = datetime.fromtimestamp(int(timestamp), timezone.utc).strftime("%Y-%m-%d")
    canonical = "\n".join(
        [
            "POST",
            "/",
            "",
            f"content-type:{headers['Content-Type']}\nhost:{headers['Host']}\n",
            "content-type;host",
            hashlib.sha256(raw).hexdigest(),
        ]
    )
    scope = f"{date}/{service}/tc3_request"
    string = "\n".join(["TC3-HMAC-SHA256", timestamp, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = ("TC3" + secret_key).encode()
    for part in (date, service, "tc3_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, string.encode(), hashlib.sha256).hexdigest()


class ApiError(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(code, message)
        self.code, self.message = code, message


class LocalTione:
    """TI-ONE's API 2021-11-11 on 127.0.0.1, for the four calls `launch tione` makes. It records every
    request, checks its signature (secret keys in `keys`), validates the body against the SDK's request
    model and its own answers against the response models (any mismatch lands in `problems`), and keeps
    tasks (`tasks`, TrainingTaskDetail fields) and log lines per instance (`logs`, LogIdentity fields).
    `errors[action] = (code, message)` makes an action fail; `on_describe[task id]` are functions of the
    task run one per DescribeTrainingTask of it, to change it between polls."""

    PAGE = 3  # lines per DescribeLogs page, whatever Limit asks: the logs come in several pages
    REQUIRED = {
        "CreateTrainingTask": ("Name", "ChargeType", "ResourceConfigInfos"),
        "DescribeTrainingTask": ("Id",),
        "DescribeLogs": ("Service",),
        "StopTrainingTask": ("Id",),
    }

    def __init__(self):
        self.keys = {SECRET_ID: SECRET_KEY}
        self.calls: list[dict] = []
        self.problems: list[str] = []
        self.tasks: dict[str, dict] = {}
        self.logs: dict[str, list[dict]] = {}
        self.errors: dict[str, tuple[str, str]] = {}
        self.on_describe: dict[str, list[Callable[[dict], None]]] = {}
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _TioneHandler)
        self.server.daemon_threads = True
        self.server.endpoint = self
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)

    def bodies(self, action: str) -> list[dict]:
        return [call["body"] for call in self.calls if call["action"] == action]

    def actions(self) -> list[str]:
        return [call["action"] for call in self.calls]

    def answer(self, headers, raw: bytes) -> dict:
        action = headers.get("X-TC-Action", "")
        with self.lock:
            request_id = f"req-{len(self.calls) + 1:04d}-local"
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                body = None
            self.calls.append({"action": action, "headers": dict(headers.items()), "body": body})
            try:
                answer = self._answer(action, headers, raw, body)
            except ApiError as exc:
                return {"Response": {"Error": {"Code": exc.code, "Message": exc.message}, "RequestId": request_id}}
            answer["RequestId"] = request_id
            unknown = sdk_unknown_fields(f"{action}Response", answer)
            if unknown:
                self.problems.append(f"the local endpoint's {action} answer has fields the SDK lacks: {unknown}")
            return {"Response": answer}

    def _answer(self, action: str, headers, raw: bytes, body) -> dict:
        handler = getattr(self, f"_{action}", None)
        if handler is None or not isinstance(body, dict):
            self.problems.append(f"unexpected request: action {action!r}, body {raw[:200]!r}")
            raise ApiError("InvalidAction", f"the local endpoint does not serve {action!r}")
        for name, want in (
            ("Content-Type", "application/json"),
            ("X-TC-Version", "2021-11-11"),
            ("X-TC-Region", REGION),
        ):
            if headers.get(name) != want:
                self.problems.append(f"{action}: header {name} is {headers.get(name)!r}, not {want!r}")
        auth = re.fullmatch(
            r"TC3-HMAC-SHA256 Credential=([^/]+)/(\d{4}-\d\d-\d\d)/tione/tc3_request, "
            r"SignedHeaders=content-type;host, Signature=([0-9a-f]{64})",
            headers.get("Authorization", ""),
        )
        if not auth or auth.group(1) not in self.keys:
            raise ApiError("AuthFailure.SecretIdNotFound", "the SecretId is unknown")
        if not hmac.compare_digest(auth.group(3), tc3_signature(self.keys[auth.group(1)], headers, raw)):
            raise ApiError("AuthFailure.SignatureFailure", "the signature does not match")
        unknown = sdk_unknown_fields(f"{action}Request", body)
        if unknown:
            self.problems.append(f"{action} request has fields the SDK's model lacks: {unknown}")
        missing = [name for name in self.REQUIRED[action] if body.get(name) in (None, "", [])]
        if missing:
            self.problems.append(f"{action} request misses {missing}")
            raise ApiError("MissingParameter", f"{', '.join(missing)} missing")
        if action in self.errors:
            raise ApiError(*self.errors[action])
        return handler(body, headers)

    def _task(self, task_id: str) -> dict:
        if task_id not in self.tasks:
            raise ApiError("ResourceNotFound", f"task {task_id} does not exist")
        return self.tasks[task_id]

    def _CreateTrainingTask(self, body: dict, headers) -> dict:
        task_id = f"train-{51200 + len(self.tasks)}"
        self.tasks[task_id] = {
            "Id": task_id,
            "Name": body["Name"],
            "Region": headers.get("X-TC-Region"),
            "TrainingMode": body.get("TrainingMode"),
            "ChargeType": body["ChargeType"],
            "ResourceConfigInfos": body["ResourceConfigInfos"],
            "ImageInfo": body.get("ImageInfo"),
            "StartCmdInfo": body.get("StartCmdInfo"),
            "Status": "SUBMITTING",
            "CreateTime": rfc3339(T0),
        }
        return {"Id": task_id}

    def _DescribeTrainingTask(self, body: dict, headers) -> dict:
        task = self._task(body["Id"])
        hooks = self.on_describe.get(body["Id"])
        if hooks:
            hooks.pop(0)(task)
        return {"TrainingTaskDetail": {k: v for k, v in task.items() if v is not None}}

    def _DescribeLogs(self, body: dict, headers) -> dict:
        start = parse_time(body.get("StartTime") or rfc3339(datetime.now(timezone.utc) - timedelta(hours=1)))
        end = parse_time(body.get("EndTime") or rfc3339(datetime.now(timezone.utc)))
        lines = [
            line
            for line in self.logs.get(body.get("ServiceId", ""), [])
            if start <= parse_time(line["Timestamp"]) <= end
            and (not body.get("PodName") or line["PodName"] == body["PodName"])
        ]
        lines.sort(key=lambda line: parse_time(line["Timestamp"]), reverse=body.get("Order", "DESC") != "ASC")
        context = body.get("Context") or "ctx-0"
        if not re.fullmatch(r"ctx-\d+", context):
            raise ApiError("InvalidParameterValue", f"Context {context!r} is not one this API returned")
        offset = int(context.removeprefix("ctx-"))
        page = lines[offset : offset + min(int(body.get("Limit") or 100), self.PAGE)]
        return {"Content": page, "Context": f"ctx-{offset + len(page)}" if page else ""}

    def _StopTrainingTask(self, body: dict, headers) -> dict:
        self._task(body["Id"])["Status"] = "STOPPING"
        return {}


class _TioneHandler(BaseHTTPRequestHandler):
    timeout = 20

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        data = json.dumps(self.server.endpoint.answer(self.headers, raw)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.server.endpoint.problems.append(f"GET {self.path}: the SDK POSTs")
        self.send_error(405)

    def log_message(self, *args):
        pass


@pytest.fixture
def endpoint():
    api = LocalTione()
    api.thread.start()
    try:
        yield api
    finally:
        api.server.shutdown()
        api.server.server_close()
        api.thread.join(timeout=10)
    assert not api.problems, api.problems


@pytest.fixture(scope="module")
def api_projects(tmp_path_factory) -> dict[str, Path]:
    """One project per tione_mode, ready to submit (storage id and instance type answered); the DDP one
    in a TI-ONE workspace (TiProjectId). Tests that write to a project work on a copy (fresh_project)."""
    root = tmp_path_factory.mktemp("tione-api")
    return {
        mode: render(
            root / mode,
            project_name=f"Api {mode.replace('-', ' ')}",
            platforms="[tione]",
            tione_mode=mode,
            nodes=NODES,
            gpus_per_node=8,
            image=IMAGE,
            shared_mount=SHARED,
            tione_storage_id=STORAGE_ID,
            tione_instance_type=INSTANCE_TYPE,
            tione_project_id=PROJECT_ID if mode == "ddp" else "",
        )
        for mode in API_MODES
    }


def fresh_project(api_projects: dict[str, Path], mode: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(api_projects[mode], tmp_path / mode, ignore=shutil.ignore_patterns(".jobs")))


def api_env(project: Path, home: Path, credentials: bool = True, **extra: str) -> dict[str, str]:
    """The environment of a developer's shell without anything of theirs: HOME is empty (no
    ~/.tencentcloud/credentials leaks in), no TENCENTCLOUD_* but the test's key, no proxy."""
    home.mkdir(parents=True, exist_ok=True)
    env = {
        k: v
        for k, v in clean_env(PYTHONPATH=str(project / "src")).items()
        if not k.startswith("TENCENTCLOUD_") and k.lower() not in PROXIES
    }
    env.update(HOME=str(home), NO_PROXY="127.0.0.1,localhost")
    if credentials:
        env.update(TENCENTCLOUD_SECRET_ID=SECRET_ID, TENCENTCLOUD_SECRET_KEY=SECRET_KEY)
    return {**env, **extra}


def tione(project: Path, env: dict[str, str], *args: str, timeout: int = 60) -> subprocess.CompletedProcess:
    """`<package> launch tione ARGS` in the project, which never raises. (The SDK silences its own
    'fileds are useless' warnings once its client is imported: a field it drops is caught by what the
    endpoint receives, not by stderr.)"""
    result = sh(["python", "-m", slug_of(project), "launch", "tione", *args], env, cwd=project, timeout=timeout)
    assert "Traceback" not in result.stderr, result.stderr
    return result


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """A mistake: exit 1, one line `error: ...` on stderr, no traceback; returns the line."""
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]


def recorded(project: Path) -> list[dict]:
    path = project / ".jobs" / "tione.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def submit(project: Path, env: dict[str, str], endpoint: LocalTione, *args: str) -> str:
    """Create a task through the endpoint; its id."""
    result = tione(project, env, "--endpoint", endpoint.url, *args)
    assert result.returncode == 0, result.stdout + result.stderr
    task_id = re.search(r"created TI-ONE task (\S+) ", result.stdout).group(1)
    assert recorded(project)[-1]["id"] == task_id
    return task_id


def log_line(instance: str, seconds: int, pod: str, message: str) -> dict:
    return {
        "Id": hashlib.sha1(f"{instance}|{seconds}|{pod}|{message}".encode()).hexdigest()[:20],
        "Message": message,
        "PodName": pod,
        "Timestamp": rfc3339(T0 + timedelta(seconds=seconds)),
    }


def shown(lines: list[dict]) -> list[str]:
    return [f"[{line['PodName']}] {line['Message']}" for line in lines]


def test_a_dry_run_without_the_sdk_names_its_install(api_projects, tmp_path):
    """runtime/optional_packages.py: one line naming the extra, not a ModuleNotFoundError."""
    project = api_projects["ddp"]
    code = (
        f"import sys; sys.modules['tencentcloud'] = None; from {slug_of(project)}.cli import main; "
        "sys.exit(main(['launch', 'tione', '--dry-run']))"
    )
    line = one_line_error(sh(["python", "-c", code], api_env(project, tmp_path / "home"), cwd=project))
    assert "launch tione" in line and "'.[tione]'" in line and "tencentcloud-sdk-python-tione" in line, line


@pytest.mark.quick
@pytest.mark.parametrize("mode", API_MODES)
def test_dry_run_prints_only_the_create_request_the_sdk_accepts(api_projects, endpoint, tmp_path, mode):
    project = api_projects[mode]
    env = api_env(project, tmp_path / "home", TENCENTCLOUD_TIONE_ENDPOINT=endpoint.url)
    result = tione(project, env, "--dry-run", "schedule.max_steps=7")
    assert result.returncode == 0, result.stderr
    request = json.loads(result.stdout)  # stdout is the JSON and nothing else
    assert sdk_unknown_fields("CreateTrainingTaskRequest", request) == []
    assert re.fullmatch(rf"{slug_of(project)}-\d{{8}}-\d{{6}}", request["Name"]), request["Name"]
    start = f"bash /workspace/{slug_of(project)}/launch/tione/{MODES[mode]} schedule.max_steps=7"
    if API_MODES[mode]:
        assert request["TrainingMode"] == API_MODES[mode] and result.stderr == ""
    else:
        assert "TrainingMode" not in request and "no Ray mode" in result.stderr
    assert request["StartCmdInfo"] == (
        {"PsStartCmd": start, "WorkerStartCmd": start} if mode == "ps-worker" else {"StartCmd": start}
    )
    assert request["ImageInfo"] == {"ImageType": "CCR", "ImageUrl": IMAGE}
    roles = {info["Role"]: info for info in request["ResourceConfigInfos"]}
    assert sorted(roles) == (["PS", "WORKER"] if mode == "ps-worker" else ["WORKER"])
    assert roles["WORKER"]["InstanceNum"] == NODES and roles["WORKER"]["InstanceType"] == INSTANCE_TYPE
    assert [c["MappingPath"] for c in request["DataConfigs"]] == [SHARED]
    assert request["DataConfigs"][0]["CFSSource"]["Id"] == STORAGE_ID and request["DataSource"] == "CFS"
    assert request.get("TiProjectId") == (PROJECT_ID if mode == "ddp" else None)
    assert endpoint.calls == []  # credentials and an endpoint at hand: a dry run still sends nothing


@pytest.mark.parametrize("mode", ["ddp", "mpi", "ps-worker"])
def test_submit_sends_the_dry_run_request_and_records_the_task(api_projects, endpoint, tmp_path, mode):
    project = fresh_project(api_projects, mode, tmp_path)
    env = api_env(project, tmp_path / "home")
    dry = tione(project, env, "--dry-run", "--name", "nightly-7", "schedule.max_steps=7")
    assert dry.returncode == 0, dry.stderr
    result = tione(project, env, "--endpoint", endpoint.url, "--name", "nightly-7", "schedule.max_steps=7")
    assert result.returncode == 0, result.stdout + result.stderr
    assert endpoint.actions() == ["CreateTrainingTask"]
    assert endpoint.bodies("CreateTrainingTask") == [json.loads(dry.stdout)]
    task_id = next(iter(endpoint.tasks))
    assert f"created TI-ONE task {task_id} (nightly-7) in {REGION}, mode {API_MODES[mode]}" in result.stdout
    assert "launch tione --action logs --follow" in result.stdout
    [job] = recorded(project)
    assert (job["platform"], job["id"], job["name"], job["where"], job["image"]) == (
        "tione",
        task_id,
        "nightly-7",
        REGION,
        IMAGE,
    )
    assert "schedule.max_steps=7" in job["command"] and job["extra"]["endpoint"] == endpoint.url
    assert job["extra"]["mode"] == API_MODES[mode]
    assert job["extra"]["project"] == (PROJECT_ID if mode == "ddp" else "")


def test_tracker_credentials_go_from_the_shell_into_the_task_and_never_into_the_output(
    api_projects, endpoint, tmp_path
):
    """The trackers' variables set where `launch tione` runs reach the task's Envs (after task.yaml's
    own); a dry run shows the secrets masked, the request sent holds them."""
    project = fresh_project(api_projects, "ddp", tmp_path)
    env = api_env(
        project,
        tmp_path / "home",
        WANDB_API_KEY="wandb-key-123",
        MLFLOW_TRACKING_URI="http://mlflow.internal:5000",
        MLFLOW_TRACKING_PASSWORD="mlflow-pass-456",
    )
    dry = tione(project, env, "--dry-run", "--name", "tracked-1")
    assert dry.returncode == 0, dry.stderr
    assert "wandb-key-123" not in dry.stdout + dry.stderr and "mlflow-pass-456" not in dry.stdout + dry.stderr
    assert json.loads(dry.stdout)["Envs"] == [
        {"Name": "MLFLOW_TRACKING_URI", "Value": "http://mlflow.internal:5000"},
        {"Name": "MLFLOW_TRACKING_PASSWORD", "Value": "***"},
        {"Name": "WANDB_API_KEY", "Value": "***"},
    ]
    result = tione(project, env, "--endpoint", endpoint.url, "--name", "tracked-1")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "wandb-key-123" not in result.stdout + result.stderr
    [body] = endpoint.bodies("CreateTrainingTask")
    assert {e["Name"]: e["Value"] for e in body["Envs"]} == {
        "MLFLOW_TRACKING_URI": "http://mlflow.internal:5000",
        "MLFLOW_TRACKING_PASSWORD": "mlflow-pass-456",
        "WANDB_API_KEY": "wandb-key-123",
    }
    assert "wandb-key-123" not in json.dumps(recorded(project))  # nor in the job record


def mount_storage_at(project: Path, mount: Path) -> None:
    """The project as answered with shared_mount=mount: the storage as this machine mounts it (here a
    temporary folder), at the same path as TI-ONE mounts it on the nodes."""
    for name in ("launch/tione/task.yaml", "config/train.yaml"):
        path = project / name
        path.write_text(path.read_text().replace(SHARED, str(mount)))


@pytest.mark.quick
@pytest.mark.parametrize(
    "output_dir, words",
    [
        ("/srv/runs", ["run.output_dir='/srv/runs' lies outside the storage", SHARED, "task.yaml"]),
        (f"{SHARED}/../../etc/runs", ["(that is /etc/runs)", "set run.output_dir under it"]),
    ],
)
def test_outputs_off_the_mounted_storage_are_refused_before_a_copy(api_projects, tmp_path, output_dir, words):
    """planning/storage_paths.py: where the job's nodes would keep checkpoints in a container that
    vanishes, the dry run says so in one line and copies nothing."""
    project = fresh_project(api_projects, "ddp", tmp_path)
    env = api_env(project, tmp_path / "home")
    result = tione(project, env, "--dry-run", "--code-from-storage", "--image", IMAGE, f"run.output_dir={output_dir}")
    line = one_line_error(result)
    assert all(w in line for w in words), line


def test_code_from_storage_task_runs_the_copy_in_the_image_given(api_projects, endpoint, tmp_path):
    """--code-from-storage: the project is copied beside run.output_dir, the start command checks the
    image and runs the copy's start script, the image is the one given, and the record names the copy."""
    project = fresh_project(api_projects, "ddp", tmp_path)
    env = api_env(project, tmp_path / "home")
    runs = tmp_path / "cfs" / "p" / "runs"
    mount_storage_at(project, tmp_path / "cfs")
    given = ["--code-from-storage", "--image", "nvcr.io/nvidia/pytorch:25.01-py3", f"run.output_dir={runs}"]
    dry = tione(project, env, "--dry-run", "--name", "ready-1", *given)
    assert dry.returncode == 0, dry.stderr
    assert not (runs.parent / "code").exists()  # a dry run copies nothing
    result = tione(project, env, "--endpoint", endpoint.url, "--name", "ready-1", *given)
    assert result.returncode == 0, result.stdout + result.stderr
    [request] = endpoint.bodies("CreateTrainingTask")
    assert request == json.loads(dry.stdout) and sdk_unknown_fields("CreateTrainingTaskRequest", request) == []
    [copy] = (runs.parent / "code").iterdir()
    assert request["ImageInfo"] == {"ImageType": "CUSTOM", "ImageUrl": "nvcr.io/nvidia/pytorch:25.01-py3"}
    slug = slug_of(project)
    assert request["StartCmdInfo"] == {
        "StartCmd": f"python {copy}/src/{slug}/cluster/ready_image.py --check run.output_dir={runs} && "
        f"bash {copy}/launch/tione/start-ddp.sh run.output_dir={runs}"
    }
    assert (copy / "launch" / "tione" / "start-ddp.sh").is_file() and not (copy / ".jobs").exists()
    [job] = recorded(project)
    assert job["code_copy"] == str(copy) and job["image"] == "nvcr.io/nvidia/pytorch:25.01-py3"


def test_ray_submit_prints_the_console_settings_and_sends_nothing(api_projects, endpoint, tmp_path):
    project = fresh_project(api_projects, "ray", tmp_path)
    env = api_env(project, tmp_path / "home", TENCENTCLOUD_TIONE_ENDPOINT=endpoint.url)
    result = tione(project, env, "schedule.max_steps=7")
    console = tione(project, env, "--console", "schedule.max_steps=7")
    assert result.returncode == 0 and console.returncode == 0, result.stderr + console.stderr
    assert result.stdout == console.stdout and "start-ray.sh schedule.max_steps=7" in result.stdout
    assert "no Ray mode" in result.stderr
    assert endpoint.calls == [] and recorded(project) == []


def test_status_maps_each_state_of_the_last_task_or_the_one_named(api_projects, endpoint, tmp_path):
    project = fresh_project(api_projects, "ddp", tmp_path)
    env = api_env(project, tmp_path / "home")
    first, last = submit(project, env, endpoint), submit(project, env, endpoint)
    base = {**endpoint.tasks[last], "LatestInstanceId": f"{last}-1", "StartTime": rfc3339(T0), "RuntimeInSeconds": 125}
    cases = {
        "RUNNING": ({}, "running"),
        "FAILED": (
            {"FailureReason": "NCCL timeout on worker-1", "EndTime": rfc3339(T0 + timedelta(hours=1))},
            "failed",
        ),
        "SUCCEED": ({"EndTime": rfc3339(T0 + timedelta(hours=2))}, "succeeded"),
        "SUBMITTING": ({"LatestInstanceId": None, "StartTime": None, "RuntimeInSeconds": None}, "queued"),
    }
    for state, (fields, meaning) in cases.items():
        endpoint.tasks[last] = {**base, **fields, "Status": state}
        result = tione(project, env, "--action", "status")  # the endpoint comes from the job record
        assert result.returncode == 0, result.stderr
        out = result.stdout
        assert f"  state:    {state} ({meaning})\n" in out, out
        assert out.startswith(f"tione job {last} (") and f"  task:     {last} " in out, out
        assert f"  worker:   {NODES} x {INSTANCE_TYPE}\n" in out, out
        assert ("  reason:   NCCL timeout on worker-1\n" in out) == (state == "FAILED"), out
        if state == "RUNNING":
            assert f"  runtime:  0:02:05 (started {rfc3339(T0)})\n" in out, out
        if state in ("FAILED", "SUCCEED"):
            assert f"  ended:    {fields['EndTime']}\n" in out, out
        if state == "SUBMITTING":
            assert "runtime:" not in out, out
    endpoint.tasks[first]["Status"] = "STOPPED"
    picked = tione(project, env, "--action", "status", "--id", first)
    assert picked.returncode == 0 and "  state:    STOPPED (stopped)\n" in picked.stdout, picked.stdout
    describes = endpoint.bodies("DescribeTrainingTask")
    assert describes == [{"Id": last, "TiProjectId": PROJECT_ID}] * len(cases) + [
        {"Id": first, "TiProjectId": PROJECT_ID}
    ]
    # A task this project did not submit: --id and the endpoint find it all the same.
    endpoint.tasks["train-elsewhere"] = {"Id": "train-elsewhere", "Name": "other", "Status": "STARTING"}
    other = tione(project, env, "--action", "status", "--id", "train-elsewhere", "--endpoint", endpoint.url)
    assert other.returncode == 0 and "  state:    STARTING (starting)\n" in other.stdout, other.stdout + other.stderr


def test_logs_prints_every_page_once_in_order(api_projects, endpoint, tmp_path):
    project = fresh_project(api_projects, "mpi", tmp_path)
    env = api_env(project, tmp_path / "home")
    task_id = submit(project, env, endpoint)
    instance = f"{task_id}-run1"
    endpoint.tasks[task_id].update(Status="SUCCEED", LatestInstanceId=instance, StartTime=rfc3339(T0))
    lines = [
        log_line(instance, i, f"{task_id}-{'launcher' if i % 2 else 'worker'}-0", f"step {i} loss {9 - i * 0.5}")
        for i in range(1, 9)
    ]
    endpoint.logs[instance] = lines[::-1]  # the endpoint sorts: ASC is asked for
    endpoint.logs["train-other-run1"] = [log_line("train-other-run1", 3, "other-worker-0", "not this task's")]
    result = tione(project, env, "--action", "logs")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == shown(lines)
    pages = endpoint.bodies("DescribeLogs")
    assert [page.get("Context") for page in pages] == [None, "ctx-3", "ctx-6", "ctx-8"]  # 3 + 3 + 2, then none
    assert all(
        page["Service"] == "TRAIN"
        and page["ServiceId"] == instance
        and page["Order"] == "ASC"
        and page["StartTime"] == rfc3339(T0)
        and page["EndTime"] == pages[0]["EndTime"]
        and set(page) - {"Context"} == {"Service", "ServiceId", "StartTime", "EndTime", "Limit", "Order"}
        for page in pages
    ), pages  # no TiProjectId: this project is in the default workspace
    # --pod: one pod's lines.
    pod = f"{task_id}-worker-0"
    one_pod = tione(project, env, "--action", "logs", "--pod", pod)
    assert one_pod.returncode == 0 and one_pod.stdout.splitlines() == shown(
        [line for line in lines if line["PodName"] == pod]
    ), one_pod.stdout
    # No instance yet: said, not an error.
    endpoint.tasks[task_id].update(Status="SUBMITTING", LatestInstanceId=None)
    queued = tione(project, env, "--action", "logs")
    assert queued.returncode == 0 and queued.stdout == "" and "no instance yet" in queued.stderr, queued.stderr


def test_logs_follow_prints_new_lines_once_until_the_task_ends(api_projects, endpoint, tmp_path):
    project = fresh_project(api_projects, "ddp", tmp_path)
    env = api_env(project, tmp_path / "home")
    task_id = submit(project, env, endpoint)
    instance, pod = f"{task_id}-run1", f"{task_id}-worker-0"
    endpoint.tasks[task_id].update(Status="RUNNING", LatestInstanceId=instance, StartTime=rfc3339(T0))
    before = [log_line(instance, i, pod, f"step {i}") for i in range(1, 5)]
    # Between two polls, lines arrive (one stamped with the same second as the last line printed) and
    # the task ends.
    after = [
        log_line(instance, 4, pod, "step 4 checkpoint saved"),
        log_line(instance, 5, pod, "step 5"),
        log_line(instance, 6, pod, "training done"),
    ]
    endpoint.logs[instance] = list(before)

    def finish(task: dict) -> None:
        endpoint.logs[instance] += after
        task.update(Status="SUCCEED", EndTime=rfc3339(T0 + timedelta(seconds=7)))

    endpoint.on_describe[task_id] = [lambda task: None, finish]
    result = tione(project, env, "--action", "logs", "--follow", timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == shown(before + after)
    # Ended at the poll that saw the task end: two reads of it, not one more wait (counted, not timed).
    assert endpoint.bodies("DescribeTrainingTask") == [{"Id": task_id, "TiProjectId": PROJECT_ID}] * 2
    starts = [page["StartTime"] for page in endpoint.bodies("DescribeLogs") if "Context" not in page]
    assert starts == [rfc3339(T0), before[-1]["Timestamp"]]  # the second poll starts at the newest line printed
    assert all(page["TiProjectId"] == PROJECT_ID for page in endpoint.bodies("DescribeLogs"))


def test_logs_follow_right_after_submit_waits_for_the_first_instance(api_projects, endpoint, tmp_path):
    """The command submit suggests: the task is still queued (no instance) when it starts."""
    project = fresh_project(api_projects, "ddp", tmp_path)
    env = api_env(project, tmp_path / "home")
    task_id = submit(project, env, endpoint)
    instance, pod = f"{task_id}-run1", f"{task_id}-worker-0"
    endpoint.tasks[task_id].update(Status="SUBMITTING")
    lines = [log_line(instance, i, pod, f"step {i}") for i in range(1, 3)]

    def start(task: dict) -> None:
        endpoint.logs[instance] = list(lines)
        task.update(Status="SUCCEED", LatestInstanceId=instance, StartTime=rfc3339(T0))

    endpoint.on_describe[task_id] = [lambda task: None, start]
    result = tione(project, env, "--action", "logs", "--follow", timeout=40)
    assert result.returncode == 0, result.stderr
    assert "queued; waiting for its first instance" in result.stderr
    assert result.stdout.splitlines() == shown(lines)


@pytest.mark.parametrize("mode", ["ddp", "mpi"])
def test_cancel_stops_the_recorded_task(api_projects, endpoint, tmp_path, mode):
    project = fresh_project(api_projects, mode, tmp_path)
    env = api_env(project, tmp_path / "home")
    task_id = submit(project, env, endpoint)
    result = tione(project, env, "--action", "cancel")
    assert result.returncode == 0, result.stderr
    assert endpoint.bodies("StopTrainingTask") == [
        {"Id": task_id, **({"TiProjectId": PROJECT_ID} if mode == "ddp" else {})}
    ]
    assert f"stopping TI-ONE task {task_id} (request id req-0002-local)" in result.stdout
    assert endpoint.tasks[task_id]["Status"] == "STOPPING"


def test_missing_credentials_are_one_line_and_the_profile_file_is_read(api_projects, endpoint, tmp_path):
    project = fresh_project(api_projects, "ddp", tmp_path)
    home = tmp_path / "home"
    env = api_env(project, home, credentials=False)
    line = one_line_error(tione(project, env, "--endpoint", endpoint.url))
    assert "TENCENTCLOUD_SECRET_ID" in line and "~/.tencentcloud/credentials" in line
    assert endpoint.calls == [] and recorded(project) == []
    # A profile file the SDK cannot read (no [default] section, no section at all): one line too.
    (home / ".tencentcloud").mkdir()
    for text in ("[prod]\nsecret_id = a\nsecret_key = b\n", "secret_id = a\n"):
        (home / ".tencentcloud" / "credentials").write_text(text)
        line = one_line_error(tione(project, env, "--endpoint", endpoint.url))
        assert "~/.tencentcloud/credentials cannot be used" in line and "[default]" in line, line
    assert endpoint.calls == []
    # The SDK's profile file in HOME: the request is signed with its key.
    (home / ".tencentcloud" / "credentials").write_text(
        "[default]\nsecret_id = AKIDprofile0001\nsecret_key = profile-secret\n"
    )
    endpoint.keys["AKIDprofile0001"] = "profile-secret"
    submit(project, env, endpoint)
    assert "Credential=AKIDprofile0001/" in endpoint.calls[-1]["headers"]["Authorization"]


def test_api_error_is_one_line_with_code_message_and_request_id(api_projects, endpoint, tmp_path):
    project = fresh_project(api_projects, "ddp", tmp_path)
    env = api_env(project, tmp_path / "home")
    endpoint.errors["CreateTrainingTask"] = ("InvalidParameterValue", f"InstanceType {INSTANCE_TYPE} is sold out")
    line = one_line_error(tione(project, env, "--endpoint", endpoint.url))
    assert "InvalidParameterValue" in line and f"InstanceType {INSTANCE_TYPE} is sold out" in line, line
    assert "req-0001-local" in line and recorded(project) == []
    # A wrong key: the signature check fails, and the line says what to fix.
    env["TENCENTCLOUD_SECRET_KEY"] = "not-the-key"
    line = one_line_error(tione(project, env, "--endpoint", endpoint.url))
    assert "AuthFailure.SignatureFailure" in line and "wrong or expired" in line, line


def refusals_of_an_edited_task(api_projects, endpoint, tmp_path, edit) -> list[str]:
    """A DDP project's task.yaml changed by `edit`, submitted and dry-run: each must end in one line
    before anything is sent or recorded; returns the two lines."""
    project = fresh_project(api_projects, "ddp", tmp_path)
    task = project / "launch" / "tione" / "task.yaml"
    edited = edit(task.read_text())
    assert edited != task.read_text()
    task.write_text(edited)
    env = api_env(project, tmp_path / "home")
    lines = []
    for args in (["--endpoint", endpoint.url], ["--dry-run"]):
        result = tione(project, env, *args)
        lines.append(one_line_error(result))
        assert result.stdout == ""
    assert endpoint.calls == [] and recorded(project) == []
    return lines


@pytest.mark.parametrize(
    "edit, name",
    [
        (
            lambda text: text.replace(
                "  ResourceConfigInfos:",
                "  ResourceConfigInfo:\n    - {Role: WORKER, InstanceNum: 4}\n  ResourceConfigInfos:",
            ),
            "ResourceConfigInfo",
        ),
        (lambda text: text.replace('Path: "/"}', 'Pth: "/"}'), "Pth"),
    ],
    ids=["top-level", "nested"],
)
def test_misspelt_field_in_task_yaml_is_refused_before_sending(api_projects, endpoint, tmp_path, edit, name):
    for line in refusals_of_an_edited_task(api_projects, endpoint, tmp_path, edit):
        assert f"unknown field(s) {name}" in line and "task.yaml" in line, line


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda text: re.sub(r"InstanceNum: \d+", "InstanceNum: two", text, count=1), "InstanceNum"),
        (lambda text: re.sub(r"InstanceNum: \d+", "InstanceNum: 100000000000", text, count=1), "InstanceNum"),
        (lambda text: re.sub(r'(\n  Name: )"[^"]*"', r"\1yes", text, count=1), "Name"),  # YAML 1.1: a boolean
        (lambda text: re.sub(r'(\n  Name: )"[^"]*"', r"\g<1>0755", text, count=1), "Name"),  # an int
    ],
    ids=["word-for-a-count", "huge-count", "yes-for-a-name", "number-for-a-name"],
)
def test_a_task_yaml_field_of_the_wrong_type_is_refused_before_sending(api_projects, endpoint, tmp_path, edit, words):
    for line in refusals_of_an_edited_task(api_projects, endpoint, tmp_path, edit):
        assert words in line and "task.yaml" in line, line


def test_credentials_that_are_only_whitespace_are_one_line(api_projects, endpoint, tmp_path):
    project = fresh_project(api_projects, "ddp", tmp_path)
    env = api_env(project, tmp_path / "home", TENCENTCLOUD_SECRET_ID="  ", TENCENTCLOUD_SECRET_KEY="\t")
    line = one_line_error(tione(project, env, "--endpoint", endpoint.url))
    assert "TENCENTCLOUD_SECRET_ID" in line, line
    assert endpoint.calls == [] and recorded(project) == []


def test_submit_without_storage_id_is_refused_naming_the_answer(endpoint, tmp_path):
    project = render(
        tmp_path / "p",
        project_name="No Storage",
        platforms="[tione]",
        tione_mode="ddp",
        image=IMAGE,
        tione_instance_type=INSTANCE_TYPE,
    )
    env = api_env(project, tmp_path / "home")
    line = one_line_error(tione(project, env, "--endpoint", endpoint.url))
    assert "tione_storage_id" in line, line
    assert endpoint.calls == [] and recorded(project) == []
    dry = tione(project, env, "--dry-run")  # the dry run shows the request anyway, with a note
    assert dry.returncode == 0 and json.loads(dry.stdout)["DataConfigs"][0]["CFSSource"]["Id"] == ""
    assert "note: not ready to submit" in dry.stderr and "tione_storage_id" in dry.stderr


def test_status_logs_cancel_without_a_recorded_task_are_one_line(api_projects, endpoint, tmp_path):
    project = fresh_project(api_projects, "ddp", tmp_path)
    env = api_env(project, tmp_path / "home")
    for action in ("status", "logs", "cancel"):
        line = one_line_error(tione(project, env, "--action", action, "--endpoint", endpoint.url))
        assert "no tione job submitted from this project yet" in line and "--id" in line, line
    assert endpoint.calls == []


def test_status_of_a_task_the_api_no_longer_has_answers_from_the_records(api_projects, endpoint, ddp_task, tmp_path):
    """A task deleted from TI-ONE after it ended: status answers from what the project holds, and says
    so: the state status last saw, the last training line and last word logs printed, and the run
    folder (here the storage is mounted on this machine: ddp_task's finished 8-step run). A task of
    which the project holds nothing is exit 1, said in words."""
    root, _, straight = ddp_task
    run_dir = root / "straight"
    project = fresh_project(api_projects, "ddp", tmp_path)
    mount_storage_at(project, root)
    env = api_env(project, tmp_path / "home")
    task_id = submit(project, env, endpoint, f"run.output_dir={run_dir}", "schedule.max_steps=8")
    assert (
        recorded(project)[-1]["extra"] | {"output_dir": str(run_dir), "max_steps": 8} == recorded(project)[-1]["extra"]
    )
    instance, pod = f"{task_id}-run1", f"{task_id}-worker-0"
    endpoint.tasks[task_id].update(Status="RUNNING", LatestInstanceId=instance, StartTime=rfc3339(T0))
    training = "step      8/8 | loss 6.1234 | lr 3.00e-04 | 1,234 tok/s | 120 ms/step"
    done = f"done: metrics in {run_dir}/metrics.jsonl, checkpoints in {run_dir}/checkpoints"
    endpoint.logs[instance] = [
        log_line(instance, 1, pod, "[default0]:step      4/8 | loss 7.0000 | lr 3.00e-04 | 1,200 tok/s | 121 ms/step"),
        log_line(instance, 2, pod, f"[default0]:{training}"),
        log_line(instance, 3, pod, f"[default0]:{done}"),
    ]
    assert tione(project, env, "--action", "logs").returncode == 0
    endpoint.tasks[task_id]["Status"] = "SUCCEED"
    assert "  state:    SUCCEED (succeeded)\n" in tione(project, env, "--action", "status").stdout
    del endpoint.tasks[task_id]  # deleted in the console

    result = tione(project, env, "--action", "status")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"tione job {task_id} ("), lines
    assert lines[1].startswith(f"  TI-ONE has no task {task_id} in {REGION} any more (deleted, or created in"), lines
    assert "ResourceNotFound" in lines[1], lines
    assert lines[2] == "  from this project's records:", lines
    assert re.fullmatch(r"  last seen: SUCCEED at \S+Z \(--action status\)", lines[3]), lines
    assert lines[4:7] == [f"  last line: {training}", f"  last word: {done}", f"  run folder: {run_dir}"], lines
    trained = losses(run_dir)
    assert lines[7].startswith(f"  latest: step      8/8 | loss {trained[8][0]:.4f} | "), lines
    assert sorted(trained) == sorted(straight) == [2, 4, 6, 8]
    validation = [record for record in metrics(run_dir) if "val_loss" in record][-1]  # the run's final evaluation
    assert lines[8:] == [
        f"  validation: step 8, loss {validation['val_loss']:.4f}",
        f"  checkpoint: {run_dir / 'checkpoints' / 'step_00000008.pt'}",
        "  finished: reached max_steps 8",
    ], lines

    # A task the API never had and this project holds nothing of: exit 1, in words.
    nothing = tione(project, env, "--action", "status", "--id", "train-never", "--endpoint", endpoint.url)
    assert nothing.returncode == 1, nothing.stdout + nothing.stderr
    assert nothing.stdout.splitlines()[-1] == (
        "  and this project holds nothing of it: no status or logs seen, no log line, no run folder here"
    ), nothing.stdout
