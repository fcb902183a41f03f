"""`launch devmachine`: the torchrun command for one node and for several, and its mistakes; the
verbs every platform has (status, logs, cancel) against a real 2-process run, and the job records.

    python -m pytest -q tests/test_launch.py       # about a minute on 2 cores
"""

from __future__ import annotations

import ast
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
        return pkg.module("launch.devmachine").devmachine_topology(Namespace(**{**args, **kwargs}), cfg)

    return _topology


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


def test_verbs_without_a_recorded_run_say_how_to_start_one(cli, tmp_path):
    proc = cli("launch", "devmachine", "--action", "status", "--id", "elsewhere:1", expect=1)
    assert proc.stderr.startswith("error: no devmachine job --id elsewhere:1") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


# --- Slurm: what the partition's nodes hold (sinfo) ---------------------------------------------

# `sinfo -h -N -o "%P|%N|%c|%m|%G"` as clusters print it: typed GPUs with a socket list, untyped
# ones, none, several generic resources, and a line that is no node (a warning).
SINFO = """\
gpu*|v100-01|20|191000|gpu:v100:4(S:0-1)
gpu*|v100-02|20|191000|gpu:4
cpu|c01|64|256000|(null)
big|a01|128|1000000|gpu:a100:8(S:0-1),nvme:1
sinfo: warning: some partitions are hidden
"""
# sbatch reads #SBATCH lines up to the first command: the --mem below it is not part of the request.
SEED_SCRIPT = "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=1\n#SBATCH --gpus-per-node=4\n"
SEED_SCRIPT += "#SBATCH --cpus-per-task=32   # 8 per GPU\nset -e\n#SBATCH --mem=1T\n"


def test_sinfo_lines_of_every_shape(pkg):
    nodes = pkg.slurm_partition.parse_sinfo(SINFO)
    assert [(n.partition, n.default_partition, n.name, n.cpus, n.memory_mb) for n in nodes] == [
        ("gpu", True, "v100-01", 20, 191000),
        ("gpu", True, "v100-02", 20, 191000),
        ("cpu", False, "c01", 64, 256000),
        ("big", False, "a01", 128, 1000000),
    ]
    assert [n.gpus for n in nodes] == [{"v100": 4}, {"": 4}, {}, {"a100": 8}]
    assert nodes[0].gpu_count("v100") == 4 and nodes[1].gpu_count("v100") == 0 and nodes[1].gpu_count(None) == 4


# What a broken or hostile sinfo prints: other scripts' digits, a count of 5000 digits (int() refuses
# past 4300), more GPUs or CPUs than any node holds, bytes decoded with replacement characters. A node
# line with such a count is no node that can be judged (a 5000-digit GPU count is not 0 GPUs).
ODD_SINFO = [
    "gpu*|n1|\u00b2\u00b2|1000|gpu:4",  # superscript digits: str.isdigit says yes, int() says no
    "gpu*|n2|\u0663\u0662|1000|gpu:4",  # Arabic-Indic digits
    f"gpu*|n3|{'9' * 5000}|1000|gpu:4",
    f"gpu*|n4|8|1000|gpu:{'9' * 5000}",
    "gpu*|n5|8|1000|gpu:\u00b2",
    "gpu*|n6|8|1000|gpu:a100:129",  # 16 GPUs of 7 MIG slices are 112
    "gpu*|n7|99999|1000|gpu:4",
    "\ufffd\ufffd|\ufffd|8|\ufffd|\ufffd",
]


def test_odd_sinfo_lines_are_unreadable_nodes_not_a_traceback(pkg):
    nodes = pkg.slurm_partition.parse_sinfo("\n".join(ODD_SINFO))
    assert [(n.name, n.unreadable) for n in nodes] == [
        ("n1", "CPUs (%c) '\u00b2\u00b2'"),
        ("n2", "CPUs (%c) '\u0663\u0662'"),
        ("n3", f"CPUs (%c) '{'9' * 20}'... (5000 characters)"),
        ("n4", f"generic resources (%G) 'gpu:{'9' * 16}'... (5004 characters)"),
        ("n5", "generic resources (%G) 'gpu:\u00b2'"),
        ("n6", "generic resources (%G) 'gpu:a100:129'"),
        ("n7", "CPUs (%c) '99999'"),
        ("\ufffd", "memory in MB (%m) '\ufffd'"),
    ]
    mig = pkg.slurm_partition.parse_sinfo("gpu*|m1|224|2000000|gpu:1g.10gb:112(S:0-1)")
    assert [(n.gpus, n.unreadable) for n in mig] == [({"1g.10gb": 112}, "")]


def test_a_partition_with_a_node_sinfo_cannot_count_is_not_judged(pkg):
    """A 5000-digit GPU count read as 0 GPUs gave the advice to ask for 0: the partition is not
    judged (sbatch judges the request), and the caller's warning names the node and the value."""
    partition = pkg.slurm_partition
    nodes = partition.parse_sinfo(f"gpu*|g1|64|512000|gpu:{'9' * 5000}\ncpu|c1|64|256000|(null)\n")
    notes: list[str] = []
    assert partition.partition_problem(partition.requested(SEED_SCRIPT, []), nodes, notes) is None
    assert notes == [
        f"slurm default partition gpu: sinfo reports generic resources (%G) 'gpu:{'9' * 16}'... (5004 characters) "
        "for node g1, which is no count a node can hold, so the request is not checked against the partition "
        "(sbatch judges it)"
    ]
    # Another partition's nodes are judged as before.
    cpu_job = partition.requested(SEED_SCRIPT, ["--partition=cpu", "--gpus-per-node=0", "--cpus-per-task=128"])
    assert "(c1) has 64" in partition.partition_problem(cpu_job, nodes, notes) and len(notes) == 1


NOT_UTF8 = b"JobId=7 JobName=caf\xe9 JobState=RUNNING Restarts=0\n   StdOut=/runs/caf\xe9 log-7.out\n"


def test_every_slurm_client_output_is_read_as_text_whatever_its_bytes(pkg, tmp_path):
    """scontrol, sacct and sinfo print a job's or node's name in the bytes it was given: output that is
    not UTF-8 reads with replacement characters (slurm_output), never a UnicodeDecodeError."""
    partition, slurm = pkg.slurm_partition, pkg.module("launch.slurm")
    printer = [sys.executable, "-c", f"import sys; sys.stdout.buffer.write({NOT_UTF8!r})"]
    out = partition.slurm_output(printer)
    assert out.returncode == 0 and "caf\ufffd" in out.stdout
    fields = slurm.parse_job_fields(out.stdout)
    assert (fields["JobId"], fields["JobName"], fields["JobState"]) == ("7", "caf\ufffd", "RUNNING")
    assert fields["StdOut"] == "/runs/caf\ufffd log-7.out"
    assert partition.slurm_output([str(tmp_path / "no-such-client")]) is None
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    assert partition.slurm_output(sleeper, timeout=0.5) is None  # does not answer: None, not a traceback
    # sacct's -P lines: a warning, a line cut short and an empty state are no job's line.
    columns = "|".join(slurm.ACCOUNTING_COLUMNS)
    assert slurm.parse_accounting("sacct: error: Problem talking to the database\n7|x|\n7|x||1|n1|00:01|0:0\n") == {}
    row = slurm.parse_accounting(f"{columns}\n7|caf\ufffd|COMPLETED|1|n1|00:01:02|0:0\n")
    assert row["State"] == "COMPLETED" and row["JobName"] == "caf\ufffd"


def test_slurm_clients_are_all_run_through_one_reader(pkg):
    """Every subprocess the Slurm modules start decodes its output as slurm_output does (the fix once
    made for sinfo alone): inside slurm_output, or with its SLURM_TEXT."""
    for name in ("planning.slurm_partition", "launch.slurm"):
        path = pkg.module(name).__file__
        tree = ast.parse(open(path).read())
        helpers = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "slurm_output"]
        inside = {id(n) for helper in helpers for n in ast.walk(helper)}
        for call in ast.walk(tree):
            starts = isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            if not (starts and isinstance(call.func.value, ast.Name) and call.func.value.id == "subprocess"):
                continue
            spread = [k.value for k in call.keywords if k.arg is None]
            shared = any(isinstance(v, ast.Name) and v.id == "SLURM_TEXT" for v in spread)
            assert id(call) in inside or shared, (
                f"{path}:{call.lineno}: subprocess.{call.func.attr} outside slurm_output"
            )


@pytest.mark.parametrize(
    "given, words",
    [
        # The seed's V100 node: 20 cores for 4 GPUs, asked 8 per GPU by the script (the answer's line).
        (
            [],
            ["default partition gpu", "asks 32 CPUs per node for 4 GPU(s)", "(v100-01) has 20", "slurm_cpus_per_gpu=5"],
        ),
        (["--cpus-per-task=40"], ["asks 40 CPUs", "change --sbatch-arg=--cpus-per-task=20"]),
        (
            ["--cpus-per-task=20", "--gpus-per-node=a100:4"],
            ["4 GPU(s) of type a100 (its types: v100)", "--sbatch-arg=--gpus-per-node=v100:4"],
        ),
        (["--cpus-per-task=20", "--gpus-per-node=6"], ["no node has 6 GPU(s) (the most: 4)", "--gpus-per-node=4"]),
        (["--cpus-per-task=20", "--nodes=3"], ["2 node(s) hold 20 CPUs and 4 GPU(s) each", "asks 3", "--nodes=2"]),
        (["--cpus-per-task=20", "--mem=200G"], ["204800 MB", "has 191000 MB", "--mem=191000M"]),
        (["--partition=big", "--cpus-per-task=128"], []),
    ],
)
def test_partition_verdicts_name_the_change(pkg, given, words):
    partition = pkg.slurm_partition
    problem = partition.partition_problem(partition.requested(SEED_SCRIPT, given), partition.parse_sinfo(SINFO))
    if not words:
        assert problem is None
        return
    assert problem.startswith("slurm ") and "\n" not in problem
    for word in words:
        assert word in problem, (word, problem)


def test_requests_that_fit_or_cannot_be_judged(pkg):
    partition = pkg.slurm_partition
    nodes = partition.parse_sinfo(SINFO)
    fits = partition.requested(SEED_SCRIPT, ["--cpus-per-task=20", "--nodes=2"])
    assert partition.partition_problem(fits, nodes) is None
    cpu_job = partition.requested(SEED_SCRIPT, ["--partition=cpu", "--gpus-per-node=0", "--cpus-per-task=64"])
    assert partition.partition_problem(cpu_job, nodes) is None
    # No sinfo answer, or a partition it does not list: sbatch speaks for itself.
    assert partition.partition_problem(partition.requested(SEED_SCRIPT, []), []) is None
    assert partition.partition_problem(partition.requested(SEED_SCRIPT, ["--partition=gone"]), nodes) is None


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
