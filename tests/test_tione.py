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
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from conftest import BIN, TEMPLATE, render, run

TRAIN = [
    "model.size=tiny", "model.sequence_len=64", "batch.global_batch_size=8", "batch.micro_batch_size=4",
    "schedule.max_steps=10", "schedule.warmup_steps=2", "logging.every_steps=5", "logging.eval_every_steps=0",
    "checkpoint.every_steps=0", "run.device=cpu", "run.dtype=fp32", "logging.tensorboard=false",
]
# Variables of any platform that a developer's shell might carry into the launches.
FOREIGN = re.compile(r"^(PET_|SLURM_|OMPI_|PMIX_|TF_CONFIG$|HEAD_|NODE_IP_SLOT_LIST$|GPU_NUM|INDEX$|NODE_LIST$|"
                     r"RANK$|LOCAL_RANK$|WORLD_SIZE$|MASTER_|RAY_)")
MODES = {"ddp": "start-ddp.sh", "mpi": "start-mpi.sh", "ray": "start-ray.sh", "ps-worker": "start-ps-worker.sh"}


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not FOREIGN.match(k)}
    env.update(PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", OMP_NUM_THREADS="1", **extra)
    return env


def sh(cmd: list[str], env: dict[str, str], cwd: Path | None = None, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    assert ray.exists(), (f"ray is not installed for {BIN / 'python'}: pip install 'ray[train]' "
                          "(./dev test installs requirements-platforms.txt)")
    return str(ray)


def project_answers(project: Path) -> dict:
    return yaml.safe_load((project / ".copier-answers.yml").read_text())


def slug_of(project: Path) -> str:
    return project_answers(project)["project_slug"]


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
def data_dir(tmp_path_factory) -> Path:
    """Demo corpus, tokenizer and shards, prepared once with a rendered project and shared."""
    root = tmp_path_factory.mktemp("tione-data")
    project = render(root / "p", project_name="Data Prep", platforms="[tione]",
                     data_dir=str(root / "data"), output_dir=str(root / "runs"))
    result = sh(["python", "-m", slug_of(project), "prepare-data", "--demo-corpus", "data.vocab_size=2048",
                 "data.val_fraction=0.05"], clean_env(PYTHONPATH=str(project / "src")), cwd=project)
    assert result.returncode == 0, result.stdout + result.stderr
    return root / "data"


def render_mode(tmp_path: Path, data_dir: Path, mode: str, nodes: int, gpus_per_node: int) -> Path:
    return render(tmp_path / "project", project_name=f"Tione {mode} Run", platforms="[tione]", tione_mode=mode,
                  nodes=nodes, gpus_per_node=gpus_per_node, data_dir=str(data_dir),
                  output_dir=str(tmp_path / "runs"))


# ---------------------------------------------------------------------------------------------
# Files and `launch tione`


@pytest.mark.parametrize("mode", MODES)
def test_one_start_script_per_mode_and_launch_prints_the_readme_settings(tmp_path, mode):
    project = render(tmp_path / "p", project_name="Console", platforms="[devmachine, tione]", tione_mode=mode,
                     nodes=2, gpus_per_node=8, image="ccr.ccs.tencentyun.com/team/console:v3")
    assert sorted(p.name for p in (project / "launch" / "tione").iterdir()) == sorted(["README.md", MODES[mode]])
    cli = ["python", "-m", slug_of(project), "launch", "tione"]
    env = clean_env(PYTHONPATH=str(project / "src"))
    shown, dry = sh(cli, env, cwd=project), sh(cli + ["--dry-run"], env, cwd=project)
    assert shown.returncode == 0 and dry.returncode == 0, shown.stderr + dry.stderr
    assert shown.stdout == dry.stdout
    readme = (project / "launch" / "tione" / "README.md").read_text()
    block = readme.split("<!-- console-settings:start -->\n")[1].split("<!-- console-settings:end -->")[0]
    assert shown.stdout == block
    assert f"bash /opt/ml/code/launch/tione/{MODES[mode]}" in shown.stdout
    assert "ccr.ccs.tencentyun.com/team/console:v3" in shown.stdout and "NCCL_IB_HCA" in shown.stdout
    script = (project / "launch" / "tione" / MODES[mode]).read_text()
    # Restarts resume from the shared output_dir: the script names it and never deletes anything.
    assert "training resumes from <output_dir>/checkpoints/latest" in script.replace("\n# ", " ")
    assert not re.search(r"(^|[;&|]\s*)\s*rm\s", script, re.MULTILINE), "a start script must not delete files"
    assert f"{project_answers(project)['output_dir']}" in script and "SHARED_MOUNT" in script
    readme_text = (project / "launch" / "tione" / "README.md").read_text()
    assert f"resumes from\n`{project_answers(project)['output_dir']}/checkpoints/latest`" in readme_text
    with_overrides = sh(cli + ["schedule.max_steps=7"], env, cwd=project)
    assert f"{MODES[mode]} schedule.max_steps=7" in with_overrides.stdout
    # Inside a TI-ONE task the start script is what must run: say so, exit 1.
    inside = sh(cli, {**env, "HEAD_ADDR": "head-0", "HEAD_PORT": "6379"}, cwd=project)
    assert inside.returncode == 1 and f"bash {project}/launch/tione/{MODES[mode]}" in inside.stderr, inside.stderr


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
    env = clean_env(NODE_IP_SLOT_LIST="127.0.0.1:2", OMPI_MCA_orte_default_hostfile=str(hostfile),
                    GPU_NUM="2", GPU_NUM_PER_NODE="2", MASTER_PORT=str(free_port()))
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
exec env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$HOME" /bin/sh -c "$*"
"""


def test_mpi_launcher_and_worker_instances(tmp_path, data_dir):
    """Two instances as TI-ONE runs them: both run the start command; the launcher (INDEX=0) mpiruns
    one rank per instance, the worker (INDEX=1) waits until its rank, started through the remote
    agent with only what -x carries, has ended, then exits 0."""
    require_mpirun()
    project = render_mode(tmp_path, data_dir, "mpi", nodes=2, gpus_per_node=1)
    script = str(project / "launch" / "tione" / "start-mpi.sh")
    agent, agent_log = tmp_path / "agent.sh", tmp_path / "agent.log"
    agent.write_text(AGENT.format(log=agent_log))
    agent.chmod(0o755)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("127.0.0.1 slots=1 127.0.0.2 slots=1\n")  # 127.0.0.2: "another" instance on lo
    env = clean_env(OMPI_MCA_orte_default_hostfile=str(hostfile), OMPI_MCA_plm_rsh_agent=str(agent),
                    GPU_NUM="2", GPU_NUM_PER_NODE="1", MASTER_PORT=str(free_port()), POLL_SECONDS="1")
    worker_log = tmp_path / "worker.log"
    with open(worker_log, "w") as log:
        worker = subprocess.Popen(["bash", script, *TRAIN], env={**env, "INDEX": "1"}, stdout=log,
                                  stderr=subprocess.STDOUT)
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


def ray_nodes_of(output: str) -> set[str]:
    """Ray node ids the training workers reported (one line per worker rank)."""
    return set(re.findall(r"ray worker rank \d+/2 on node (\w+)", output))


def test_ray_on_a_cluster_tione_started(tmp_path, data_dir):
    """TI-ONE's Ray mode: the platform starts head and worker node and runs the start command on the
    head (RANK=0). The script must find that cluster, not start another, and train 2 workers on it."""
    ray = ray_cli()
    project = render_mode(tmp_path, data_dir, "ray", nodes=2, gpus_per_node=1)
    port = free_port()
    env = clean_env()
    try:
        head = sh([ray, "start", "--head", "--port", str(port), "--num-cpus", "1", "--disable-usage-stats",
                   "--include-dashboard=false"], env)
        assert head.returncode == 0, head.stdout + head.stderr
        node = sh([ray, "start", "--address", f"127.0.0.1:{port}", "--num-cpus", "1", "--disable-usage-stats"], env)
        assert node.returncode == 0, node.stdout + node.stderr
        result = sh(["bash", str(project / "launch" / "tione" / "start-ray.sh"), *TRAIN],
                    clean_env(HEAD_ADDR="127.0.0.1", HEAD_PORT=str(port), RANK="0"), timeout=400)
        out = result.stdout + result.stderr
        assert result.returncode == 0, out[-6000:]
        assert f"a Ray cluster answers at 127.0.0.1:{port}" in out
        assert "2 Ray node(s)" in out and "starting 2 worker(s) on CPU" in out
        assert len(ray_nodes_of(out)) == 2, out[-6000:]
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
        worker = subprocess.Popen(["bash", script, *TRAIN], env={**env, "RANK": "1"}, stdout=log,
                                  stderr=subprocess.STDOUT)
    try:
        head = sh(["bash", script, *TRAIN], {**env, "RANK": "0"}, timeout=400)
        worker_rc = worker.wait(timeout=60)
        out, worker_out = head.stdout + head.stderr, worker_log.read_text()
        assert head.returncode == 0, out[-6000:]
        assert "Ray runtime started" in out and "a Ray cluster answers" not in out
        assert len(ray_nodes_of(out)) == 2, out[-6000:]
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
    "model.size=tiny", "model.sequence_len=64", "batch.global_batch_size=8", "batch.micro_batch_size=4",
    "schedule.warmup_steps=2", "schedule.min_lr_ratio=1.0", "logging.every_steps=2", "logging.eval_every_steps=0",
    "checkpoint.every_steps=2", "run.device=cpu", "run.dtype=fp32", "logging.tensorboard=false",
]


def tione_ddp_env(shared: Path, **extra: str) -> dict[str, str]:
    """What TI-ONE injects on the only node of a 1-node, 2-GPU DDP task (the seed's variables)."""
    return clean_env(WORLD_SIZE="1", RANK="0", INDEX="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                     GPU_NUM_PER_NODE="2", GPU_NUM="2", NODE_LIST="127.0.0.1:2", SHARED_MOUNT=str(shared), **extra)


def losses(output_dir: Path) -> dict[int, tuple]:
    """step -> (loss, lr, grad_norm) of the training records."""
    return {m["step"]: (m["loss"], m["lr"], m["grad_norm"]) for m in metrics(output_dir) if "loss" in m}


@pytest.fixture(scope="module")
def ddp_task(tmp_path_factory, data_dir):
    """A rendered DDP project whose shared storage is a temporary folder, and an uninterrupted 8-step
    run through start-ddp.sh to compare the resumed runs with."""
    root = tmp_path_factory.mktemp("tione-ddp")
    project = render(root / "project", project_name="Tione Ddp Resume", platforms="[tione]", tione_mode="ddp",
                     nodes=1, gpus_per_node=2, shared_mount=str(root), data_dir=str(data_dir),
                     output_dir=str(root / "runs"))
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
        proc = subprocess.Popen(command, env=tione_ddp_env(root, TRAIN_FAULT_STEP_SECONDS="0.5"), stdout=f,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not (out_dir / "metrics.jsonl").is_file() and time.monotonic() < deadline and proc.poll() is None:
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
    assert f"warning: output_dir {tmp_path / 'runs'} is not under the shared storage {tmp_path / 'elsewhere'}" \
        in result.stderr
