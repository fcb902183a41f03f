"""`launch devmachine`: the torchrun command for one node and for several, and its mistakes; the
verbs every platform has (status, logs, cancel) against a real 2-process run, and the job records.

    python -m pytest -q tests/test_launch.py       # about a minute on 2 cores
"""

from __future__ import annotations

import json
import shlex
import shutil
import socket
import subprocess
import sys
import time
from argparse import Namespace

import pytest
import torch
from conftest import subprocess_env


def torchrun_args(stdout: str) -> list[str]:
    lines = [line for line in stdout.splitlines() if line.startswith("$ ")]
    assert len(lines) == 1, stdout
    return shlex.split(lines[0][2:])


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


@pytest.mark.part("devmachine")
def test_dry_run_one_node_is_standalone(cli):
    proc = cli(
        "launch",
        "devmachine",
        "--dry-run",
        "--nnodes",
        1,
        "--nproc-per-node",
        2,
        "model.size=tiny",
        "--set",
        "optim.lr=0.01",
    )
    args = torchrun_args(proc.stdout)
    assert args[1:3] == ["-m", "torch.distributed.run"]
    assert "--standalone" in args and flag(args, "--nproc-per-node") == "2"
    assert not any(a in ("--nnodes", "--master-addr", "--node-rank") for a in args)
    # Overrides reach `train`, whichever way they were given.
    entry = args[args.index("--standalone") + 1 :]
    assert entry[:3] == ["-m", cli.package, "train"] and set(entry[3:]) == {"model.size=tiny", "optim.lr=0.01"}
    assert "processes per node  2" in proc.stdout


@pytest.mark.part("devmachine")
def test_dry_run_two_nodes_uses_c10d_rendezvous_at_the_master(cli):
    proc = cli(
        "launch",
        "devmachine",
        "--dry-run",
        "--nnodes",
        2,
        "--node-rank",
        1,
        "--master-addr",
        "10.1.2.3",
        "--master-port",
        29555,
        "--nproc-per-node",
        8,
        "--config",
        "config/train.yaml",
        "schedule.max_steps=5",
    )
    args = torchrun_args(proc.stdout)
    assert "--standalone" not in args and "--node-rank" not in args
    assert flag(args, "--nnodes") == "2" and flag(args, "--rdzv-conf") == "is_host=false,node_rank=1"
    assert flag(args, "--nproc-per-node") == "8" and flag(args, "--max-restarts") == "3"
    assert flag(args, "--rdzv-backend") == "c10d-ordered" and flag(args, "--rdzv-endpoint") == "10.1.2.3:29555"
    assert args[1:3] == ["-m", f"{cli.package}.cluster.rendezvous"]  # torchrun with the ordered c10d registered
    assert flag(args, "--local-addr")  # the address on the route to the master, for MASTER_ADDR
    assert args[-6:] == ["-m", cli.package, "train", "--config", "config/train.yaml", "schedule.max_steps=5"]
    assert "node rank           1" in proc.stdout and "10.1.2.3:29555" in proc.stdout

    master = cli("launch", "devmachine", "--dry-run", "--nnodes", 2, "--node-rank", 0, "--master-addr", "10.1.2.3")
    args = torchrun_args(master.stdout)
    assert flag(args, "--rdzv-conf") == "is_host=true,node_rank=0" and flag(args, "--rdzv-endpoint") == "10.1.2.3:29500"


@pytest.mark.part("devmachine")
def test_two_nodes_without_master_addr_is_a_clear_error(cli):
    proc = cli("launch", "devmachine", "--dry-run", "--nnodes", 2, "--node-rank", 0, expect=1)
    assert proc.stderr.startswith("error: ") and "--master-addr" in proc.stderr
    assert "Traceback" not in proc.stderr and "$ " not in proc.stdout


@pytest.fixture
def topology(pkg, tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("cluster:\n  nodes: 1\n  gpus_per_node: 1\n")
    cfg = pkg.config.load_config(empty)

    def _topology(**kwargs):
        args = dict(nnodes=None, node_rank=None, master_addr=None, master_port=29500, nproc_per_node=None)
        return pkg.module("launch.devmachine.platform").devmachine_topology(Namespace(**{**args, **kwargs}), cfg)

    return _topology


@pytest.mark.part("devmachine")
@pytest.mark.parametrize(
    "kwargs, words",
    [
        (dict(nnodes=2, master_addr="10.0.0.1"), ["--node-rank", "0 on the master"]),
        (dict(nnodes=2, node_rank=0), ["--master-addr"]),
        (dict(nnodes=2, node_rank=2, master_addr="10.0.0.1"), ["--node-rank 2", "between 0 and 1"]),
        (dict(nnodes=3, node_rank=-1, master_addr="10.0.0.1"), ["--node-rank -1", "between 0 and 2"]),
    ],
)
def test_topology_mistakes(pkg, topology, kwargs, words):
    with pytest.raises(pkg.config.ConfigError) as err:
        topology(**kwargs)
    for word in words:
        assert word in str(err.value)


@pytest.mark.part("devmachine")
def test_topology_defaults(topology):
    one = topology(nproc_per_node=3)
    assert (one.nnodes, one.node_rank, one.nproc_per_node, one.master_addr) == (1, 0, 3, "127.0.0.1")
    # Default: one process per visible GPU; without GPUs one per core, at most cluster.gpus_per_node (1 here).
    assert topology().nproc_per_node == (torch.cuda.device_count() if torch.cuda.is_available() else 1)
    two = topology(nnodes=2, node_rank=1, master_addr="h0", master_port=1234, nproc_per_node=4)
    assert (two.nnodes, two.node_rank, two.master_addr, two.master_port) == (2, 1, "h0", 1234)


def wait_for(predicate, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out after {seconds:.0f} s waiting for {what}")


def steps_logged(out) -> int:
    try:
        lines = (out / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return 0
    return sum(1 for line in lines if '"loss"' in line)


def own_project(cli, folder):
    """A project folder of this test's own (config/ and launch/ copied; the package from the source tree
    through PYTHONPATH): its .jobs/ records only the runs started there. The suite's other tests launch
    runs from the shared project folder at the same time, and a verb without --id takes the newest record."""
    for part in ("config", "launch"):
        shutil.copytree(cli.root / part, folder / part)
    return folder


def run_in(folder, cli, *args, timeout: float = 240) -> subprocess.CompletedProcess:
    """`python -m <package> ARGS` from folder; fails the test with its output unless it exits 0."""
    result = subprocess.run(
        cli.command(*args), cwd=folder, env=subprocess_env(), capture_output=True, text=True, timeout=timeout
    )
    assert result.returncode == 0, f"{args}: exit {result.returncode}\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
    return result


def rewrite_record(project, change) -> dict:
    """The newest devmachine record after change(record) edited it in place, as another run's or an
    older version's record would read."""
    path = project / ".jobs" / "devmachine.jsonl"
    lines = path.read_text().splitlines()
    record = json.loads(lines[-1])
    change(record)
    path.write_text("\n".join([*lines[:-1], json.dumps(record)]) + "\n")
    return record


def without_identity(record: dict) -> None:
    """A record as written before launcher identities were kept: the pid (in the id) alone."""
    del record["extra"]["launcher"]


def give_pid_to(record: dict, pid: int) -> None:
    """The record of a run that ended, once its launcher's number went to pid."""
    record["id"] = f"{record['id'].rpartition(':')[0]}:{pid}"
    if "launcher" in record["extra"]:
        record["extra"]["launcher"]["pid"] = pid


@pytest.mark.part("devmachine")
def test_status_logs_and_cancel_of_a_real_run(cli, demo_data, train_overrides, tmp_path):
    out = tmp_path / "run"
    project = own_project(cli, tmp_path / "project")
    with open(tmp_path / "launch.log", "w") as log:
        launched = subprocess.Popen(
            cli.command(
                "launch",
                "devmachine",
                "--nproc-per-node",
                "2",
                *train_overrides,
                f"data.dir={demo_data}",
                f"run.output_dir={out}",
                "schedule.max_steps=100000",
                "logging.every_steps=1",
            ),
            cwd=project,
            env=subprocess_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        wait_for(lambda: steps_logged(out) >= 3, 180, "three logged steps")
        record = json.loads((project / ".jobs" / "devmachine.jsonl").read_text().splitlines()[-1])
        assert record["id"] == f"{socket.gethostname()}:{launched.pid}" and record["extra"]["output_dir"] == str(out)
        launcher = record["extra"]["launcher"]
        assert launcher["pid"] == launched.pid and launcher["cmdline"][-len(record["command"]) :] == record["command"]
        status = run_in(project, cli, "launch", "devmachine", "--action", "status").stdout
        assert f"process: running (launcher pid {launched.pid}; 2 training process(es)" in status, status
        assert "latest: step" in status and "/100000 | loss " in status and "tok/s" in status, status
        # A record from before identities were kept: the live launcher runs its command and started before it.
        rewrite_record(project, without_identity)
        legacy = run_in(project, cli, "launch", "devmachine", "--action", "status").stdout
        assert f"process: running (launcher pid {launched.pid}; 2 training process(es)" in legacy, legacy
        rewrite_record(project, lambda r: r["extra"].update(launcher=launcher))
        # Rank 0's own log file, written by torchrun beside the terminal's copy.
        logs = run_in(project, cli, "launch", "devmachine", "--action", "logs").stdout
        assert f"{out}/logs/{socket.gethostname()}/" in logs and "step" in logs and "loss" in logs, logs
        dry = run_in(project, cli, "launch", "devmachine", "--action", "cancel", "--dry-run").stdout
        assert "would cancel devmachine job" in dry
        assert launched.poll() is None
        cancel = run_in(project, cli, "launch", "devmachine", "--action", "cancel").stdout
        assert "sent SIGTERM" in cancel
        assert launched.wait(timeout=120) == 143  # saved, then stopped: the preempted exit code
    finally:
        cli.stop(launched)
    marker = json.loads((out / "preempted.json").read_text())
    after = run_in(project, cli, "launch", "devmachine", "--action", "status").stdout
    assert "process: not running" in after and f"stopped by SIGTERM at step {marker['step']}" in after, after
    assert f"checkpoint: {out / 'checkpoints'}" in after
    # Following the logs of a run that has ended prints them once and returns.
    followed = run_in(project, cli, "launch", "devmachine", "--action", "logs", "--follow", timeout=60).stdout
    assert followed.count(f"step {marker['step']:>6}/100000") <= 1 and "loss" in followed
    nothing = run_in(project, cli, "launch", "devmachine", "--action", "cancel").stdout
    assert nothing == f"job {record['id']} ended: pid {launched.pid} has exited; nothing signalled\n", nothing


@pytest.mark.part("devmachine")
def test_a_finished_run_whose_pid_was_reused_is_not_signalled(cli, demo_data, train_overrides, tmp_path):
    """pids wrap and a restarted container numbers from 1: the recorded launcher's pid, once its run
    has finished, may name an unrelated process. Neither cancel nor status may take it for the run."""
    out = tmp_path / "run"
    project = own_project(cli, tmp_path / "project")
    short = [*train_overrides, "schedule.max_steps=2", "schedule.warmup_steps=1", f"run.output_dir={out}"]
    run_in(project, cli, "launch", "devmachine", "--nproc-per-node", "1", *short, f"data.dir={demo_data}")
    host = socket.gethostname()
    stranger = subprocess.Popen(["sleep", "300"])  # a process the number went to after the run ended
    try:
        rewrite_record(project, lambda record: give_pid_to(record, stranger.pid))
        cancel = run_in(project, cli, "launch", "devmachine", "--action", "cancel").stdout
        line = f"job {host}:{stranger.pid} ended: pid {stranger.pid} is now another process (started "
        assert cancel.startswith(line) and cancel.endswith(", `sleep 300`); nothing signalled\n"), cancel
        assert len(cancel.splitlines()) == 1 and stranger.poll() is None
        status = run_in(project, cli, "launch", "devmachine", "--action", "status").stdout
        assert f"process: not running (launcher pid {stranger.pid} is now another process (started " in status
        assert "process: running" not in status and "finished: reached max_steps 2" in status, status

        # An older record (the pid alone): `sleep 300` is not the recorded launch command.
        rewrite_record(project, without_identity)
        legacy = run_in(project, cli, "launch", "devmachine", "--action", "cancel").stdout
        assert legacy.startswith(line) and len(legacy.splitlines()) == 1 and stranger.poll() is None, legacy
        assert "process: running" not in run_in(project, cli, "launch", "devmachine", "--action", "status").stdout

        # An older record that names neither the command nor when it was written: no telling, so no signal.
        rewrite_record(project, lambda record: record.update(command=[], submitted=""))
        refused = subprocess.run(
            cli.command("launch", "devmachine", "--action", "cancel"),
            cwd=project,
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert refused.returncode == 1 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert f"pid {stranger.pid} runs `sleep 300`" in refused.stderr, refused.stderr
        assert f"nothing signalled: if it is this run, stop it with `kill -TERM {stranger.pid}`" in refused.stderr
        assert "Traceback" not in refused.stderr and stranger.poll() is None
        unknown = run_in(project, cli, "launch", "devmachine", "--action", "status").stdout
        assert f"process: unknown (pid {stranger.pid} runs `sleep 300`" in unknown, unknown
    finally:
        stranger.kill()
        stranger.wait()


@pytest.mark.part("devmachine")
def test_verbs_without_a_recorded_run_say_how_to_start_one(cli, tmp_path):
    proc = cli("launch", "devmachine", "--action", "status", "--id", "elsewhere:1", expect=1)
    assert proc.stderr.startswith("error: no devmachine job --id elsewhere:1") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# --- Code from the shared storage, in a ready-made image -----------------------------------------


def test_code_copy_runs_in_any_python_that_has_the_dependencies(pkg, cfg_with, cli, tmp_path):
    cfg = cfg_with(f"run.output_dir={tmp_path}/shared/proj/runs")
    copy = pkg.code_copy.copy_project(cfg)
    assert copy.parent == tmp_path / "shared" / "proj" / "code"
    assert sorted(p.name for p in copy.iterdir()) == ["config", "launch", "pyproject.toml", "src"]
    assert (copy / "src" / pkg.name / "cluster" / "ready_image.py").is_file()
    assert not list(copy.rglob("__pycache__")) and not list(copy.rglob("*.egg-info"))
    assert pkg.code_copy.copy_project(cfg) == copy  # the same files: the same copy
    entry = pkg.code_copy.entry(copy, pkg.name)

    # The tests' Python has every dependency: the check passes and names the copy it checked.
    ok = cli.run([sys.executable, entry, "--check"])
    assert ok.stdout.strip() == f"image OK for {copy}"
    # A Python without torch (a bare virtual environment): one line naming what it lacks.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "bare")], check=True)
    bare = cli.run([str(tmp_path / "bare" / "bin" / "python"), entry, "node", "--dry-run"], expect=1)
    lines = bare.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: the image's Python") and "lacks torch, " in lines[0]
    assert "Traceback" not in bare.stderr and bare.stdout == ""
