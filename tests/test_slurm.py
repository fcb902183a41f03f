"""Slurm for real: tests/infra/slurm.sh starts a two-node Slurm cluster on this host, and the
GENERATED launch/slurm/train.sbatch trains through `<slug> launch slurm --wait` with 2 processes
on 2 nodes (Gloo on CPU). Projects generated with strategy deepspeed also get
launch/slurm/train-deepspeed.sbatch: `launch slurm --launcher deepspeed` trains a DeepSpeed ZeRO-2
job through `deepspeed --launcher slurm` (one srun task per rank) on the same cluster. Also the
scripts' #SBATCH lines for given answers, --dry-run, and the message when sbatch is missing.
Preemption: `scontrol requeue` of a running job and SIGUSR1 to its steps (`scancel --signal=USR1`,
what `--signal=USR1@N` sends) both end in a resumed job with the uninterrupted run's final loss; a
real 2-minute time limit delivers the USR1 warning to the ranks and not to the batch shell.
The job's life from the login node: `launch slurm` without --wait records the job, and
`--action status`, `logs [--follow]` and `cancel` act on it while it runs.

    python -m pytest -q tests/test_slurm.py      # as root; installs slurm-wlm and munge with apt when missing

The cluster has no GPUs and 2 CPUs per node, so the job is submitted the way a user of a CPU-only
cluster would: --sbatch-arg=--gpus-per-node=0 --sbatch-arg=--cpus-per-task=1 run.device=cpu.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import BIN, TEMPLATE, copy_demo_corpus, render, run, run_project_suite, slug_of
from test_generated_project import part_tests

SLURM_SH = TEMPLATE / "tests" / "infra" / "slurm.sh"
SLURM_DIR = Path(os.environ.get("SLURM_TEST_DIR", "/tmp/dtt-slurm"))
CPU_CLUSTER = ["--sbatch-arg=--gpus-per-node=0", "--sbatch-arg=--cpus-per-task=1"]
TINY_RUN = [
    "model.size=tiny",
    "model.sequence_len=64",
    "batch.global_batch_size=8",
    "batch.micro_batch_size=4",
    "batch.grad_accum_steps=null",
    "schedule.max_steps=10",
    "schedule.warmup_steps=2",
    "logging.every_steps=5",
    "logging.eval_every_steps=0",
    "checkpoint.every_steps=0",
    "run.device=cpu",
    "run.compile=false",
]
SIGNAL_SECONDS = 300  # --signal=USR1@N: cluster.stop_grace_seconds (120) + Slurm's 60 s timer slack + margin


@pytest.fixture(scope="session")
def slurm_cluster():
    """The two-node cluster, started (or found running) by tests/infra/slurm.sh; stopped at the end
    only when this session started it."""
    env = {"SLURM_TEST_DIR": str(SLURM_DIR)}
    first = run(["bash", str(SLURM_SH)], env=env, timeout=300)
    if first.returncode != 0:
        pytest.fail(
            f"tests/infra/slurm.sh could not start the Slurm test cluster (needs root, slurm-wlm, munge):\n"
            f"{first.stdout}\n{first.stderr}"
        )
    again = run(["bash", str(SLURM_SH)], env=env, timeout=30)
    assert again.returncode == 0 and "running" in again.stderr, f"a second start is not idempotent:\n{again.stderr}"
    conf = {"SLURM_CONF": str(SLURM_DIR / "slurm.conf")}
    # A cluster found running may still hold jobs of a session that was stopped midway: they are this
    # test cluster's only, so they are cancelled, and the nodes waited for until idle.
    run(["scancel", "--user", getpass.getuser()], env=conf, timeout=30)
    deadline, nodes = time.monotonic() + 120, []
    while time.monotonic() < deadline:
        info = run(["sinfo", "-h", "-N", "-o", "%N %t"], env=conf)
        nodes = sorted(info.stdout.splitlines())
        if nodes == ["node1 idle", "node2 idle"]:
            break
        time.sleep(1)
    assert nodes == ["node1 idle", "node2 idle"], nodes
    yield {"SLURM_CONF": str(SLURM_DIR / "slurm.conf")}
    if "up:" in first.stderr:
        run(["bash", str(SLURM_SH), "stop"], env=env, timeout=60)


def sbatch_options(script: str) -> dict[str, str]:
    """--key=value of every '#SBATCH --key=value' line."""
    options = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH "):
            key, _, value = line.split(None, 1)[1].removeprefix("--").partition("=")
            options[key] = value
    return options


def cli(project: Path, *args: str, env: dict | None = None, timeout: int = 300):
    """`python -m <slug> ARGS` from the project root, as a user runs it, with its source on PYTHONPATH."""
    slug = slug_of(project)
    full_env = {"PYTHONPATH": str(project / "src"), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **(env or {})}
    return run([sys.executable, "-m", slug, *args], cwd=project, env=full_env, timeout=timeout)


@pytest.fixture(scope="module")
def slurm_project(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("slurm")
    return render(
        root / "project",
        project_name="Slurm CI",
        platforms="[devmachine,slurm]",
        nodes=2,
        gpus_per_node=1,
        slurm_time="00:10:00",
        data_dir=str(root / "data"),
        output_dir=str(root / "runs"),
    )


def test_slurm_project_own_slurm_tests_pass(slurm_cluster, slurm_project):
    """The project's Slurm tests (its platform folder's: node lists through the real scontrol, sinfo and
    partition verdicts, its damaged launch files) pass in a project made with Slurm."""
    log = run_project_suite(slurm_project, *part_tests(), name="slurm-project", timeout=900)
    assert "test_partition_verdicts_name_the_change" in log and "test_a_platform_module_that_cannot_be_loaded" in log


ANSWER_SETS = {
    "defaults": dict(nodes=2, gpus_per_node=1),
    "all-given": dict(
        nodes=4,
        gpus_per_node=8,
        slurm_cpus_per_gpu=6,
        slurm_time="2-00:00:00",
        slurm_partition="gpu",
        slurm_account="proj-1",
        slurm_modules="cuda/12.4 nccl/2.21",
    ),
    "gres-typed": dict(nodes=2, gpus_per_node=4, slurm_gpu_request="gres", slurm_gpu_type="v100"),
}


def gpu_option(answers: dict) -> tuple[str, str]:
    """The #SBATCH option and value that ask for the answers' GPUs per node."""
    amount = f"{answers['slurm_gpu_type']}:{answers['gpus_per_node']}" if answers.get("slurm_gpu_type") else ""
    amount = amount or str(answers["gpus_per_node"])
    return ("gres", f"gpu:{amount}") if answers.get("slurm_gpu_request") == "gres" else ("gpus-per-node", amount)


@pytest.mark.parametrize("name", list(ANSWER_SETS))
def test_sbatch_lines_follow_the_answers(tmp_path, name):
    answers = ANSWER_SETS[name]
    project = render(
        tmp_path / "p",
        project_name="Slurm Shape",
        platforms="[devmachine,slurm]",
        data_dir=str(tmp_path / "data"),
        output_dir=str(tmp_path / "runs"),
        **answers,
    )
    path = project / "launch" / "slurm" / "train.sbatch"
    script = path.read_text()
    check = run(["bash", "-n", str(path)])
    assert check.returncode == 0, check.stderr
    assert script.isascii()
    opts = sbatch_options(script)
    assert opts["job-name"] == "slurmshape"
    assert opts["nodes"] == str(answers["nodes"])
    assert opts["ntasks-per-node"] == "1"  # one node launcher per node; torchrun starts one process per GPU
    option, value = gpu_option(answers)
    assert opts[option] == value and not {"gres", "gpus-per-node"} - {option} & set(opts)  # one way, not both
    assert opts["cpus-per-task"] == str(answers.get("slurm_cpus_per_gpu", 8) * answers["gpus_per_node"])
    assert opts["time"] == answers.get("slurm_time", "24:00:00")
    assert opts["output"] == f'"{tmp_path}/runs/slurm/%x-%j.out"'
    assert opts["error"] == f'"{tmp_path}/runs/slurm/%x-%j.err"'
    for key in ("partition", "account"):
        assert opts.get(key) == answers.get(f"slurm_{key}"), key  # the line only when answered
    modules = [
        line.strip() for line in script.splitlines() if "module load" in line and not line.lstrip().startswith("#")
    ]
    if "slurm_modules" in answers:
        assert modules == ["module load $MODULES"]
        assert f'MODULES=${{MODULES-"{answers["slurm_modules"]}"}}' in script
    else:
        assert modules == [] and "MODULES" not in script
    assert "srun --kill-on-bad-exit=1" in script and '"$PYTHON" "${node_start[@]}" node' in script
    assert "node_start=(-m slurmshape)" in script  # `python -m <slug> node`, unless CODE_COPY names a copy
    outside = run(["bash", str(path)], env={"SLURM_JOB_ID": ""})  # run by mistake without sbatch
    assert outside.returncode == 2 and "not inside a Slurm job" in outside.stderr, outside.stderr
    # Preemption: back into the queue, and a save warning before the time limit (to the steps only).
    assert opts["requeue"] == "" and opts["signal"] == f"USR1@{SIGNAL_SECONDS}" and opts["open-mode"] == "append"
    assert "exec srun" not in script and "Not yet" not in script
    assert (project / "launch" / "slurm" / "README.md").is_file()


@pytest.mark.parametrize("fabric", ["infiniband", "tcp"])
def test_memlock_and_train_debug_reach_srun(tmp_path, fabric):
    """Under a low hard memlock limit (a node whose slurmd runs with one) the script raises what it
    may, warns on an RDMA fabric, and srun inherits the limit and TRAIN_DEBUG. A stand-in srun
    records what it got; the real cluster run is test_two_node_training_job."""
    project = render(
        tmp_path / "p",
        project_name="Slurm Limits",
        platforms="[slurm]",
        fabric=fabric,
        data_dir=str(tmp_path / "data"),
        output_dir=str(tmp_path / "runs"),
    )
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "srun").write_text(
        '#!/bin/sh\necho "srun memlock=$(ulimit -l) hard=$(ulimit -H -l) TRAIN_DEBUG=$TRAIN_DEBUG"\n'
    )
    (fake / "srun").chmod(0o755)
    env = {
        "SLURM_JOB_ID": "7",
        "SLURM_NNODES": "1",
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_CPUS_PER_TASK": "1",
        "PATH": os.pathsep.join([str(fake), str(BIN), os.environ["PATH"]]),
    }
    script = str(project / "launch" / "slurm" / "train.sbatch")
    low = 'ulimit -S -l 64 && ulimit -H -l 128 && exec bash "$0" "$@"'  # hard 128 KiB, soft 64
    for debug in ("0", "1"):
        result = run(["bash", "-c", low, script], cwd=project, env={**env, "TRAIN_DEBUG": debug})
        assert result.returncode == 0, result.stderr
        assert f"srun memlock=128 hard=128 TRAIN_DEBUG={debug}" in result.stdout, (
            result.stdout
        )  # raised to the hard limit
        assert ("warning: locked-memory limit is 128 KiB, not unlimited" in result.stderr) == (fabric != "tcp")
    # Unset: the default 0 is exported to srun.
    result = run(["bash", "-c", low, script], cwd=project, env={**env, "TRAIN_DEBUG": ""})
    assert "TRAIN_DEBUG=0" in result.stdout, result.stdout + result.stderr


# A stand-in for the program the batch script waits on (srun for train.sbatch; PYTHON, i.e. DeepSpeed's
# runner, for train-deepspeed.sbatch). It answers --version, hands `-c` (the script reading the config)
# to the real interpreter, logs its call, writes preempted.json as rank 0 does after a save when
# FAKE_SAVES=1, then ends as FAKE_END says: a number is its exit status; "scancel" is what scancel and
# `scontrol requeue` do: SIGTERM to the batch shell (its parent) while the ranks save, then 143.
# The stand-in scontrol logs `requeue` calls.
FAKE_LAUNCH = """#!/bin/bash
if [ "${1:-}" = --version ]; then echo "Python 3 (stand-in)"; exit 0; fi
if [ "${1:-}" = -c ]; then exec "$REAL_PYTHON" "$@"; fi
echo "launch $*" >>"$FAKE_LOG"
if [ "$FAKE_SAVES" = 1 ]; then mkdir -p "$(dirname "$FAKE_MARKER")"; echo '{"step": 3}' >"$FAKE_MARKER"; fi
if [ "$FAKE_END" = scancel ]; then kill -TERM "$PPID"; sleep 0.2; exit 143; fi
exit "$FAKE_END"
"""
FAKE_SCONTROL = """#!/bin/bash
if [ "$1 $2" = "show hostnames" ]; then echo node1; exit 0; fi
echo "scontrol $*" >>"$FAKE_LOG"
exit "${FAKE_REQUEUE_STATUS:-0}"
"""
# case: (launcher's end, writes preempted.json, SLURM_RESTART_COUNT, scontrol's status, job's status, requeued)
REQUEUE_CASES = {
    "preempted": ("143", "1", "", "0", 143, True),
    "preempted-budget-spent": ("143", "1", "3", "0", 143, False),
    "requeue-fails": ("143", "1", "", "1", 143, True),
    "scancel": ("scancel", "1", "", "0", 143, False),
    "killed-after-another-node-failed": ("143", "0", "", "0", 143, False),  # a stale marker is there
    "failed": ("1", "0", "", "0", 1, False),
    "done": ("0", "0", "", "0", 0, False),
}


@pytest.fixture(scope="module")
def both_scripts(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("slurm-requeue")
    return render(
        root / "p",
        project_name="Slurm Requeue",
        platforms="[slurm]",
        strategy="deepspeed",
        data_dir=str(root / "data"),
        output_dir=str(root / "runs"),
    )


@pytest.mark.parametrize("script", ["train.sbatch", "train-deepspeed.sbatch"])
@pytest.mark.parametrize("case", list(REQUEUE_CASES))
def test_preempted_step_requeues_the_job(tmp_path, both_scripts, script, case):
    """The batch script's branch after its launcher ends, with stand-in srun/runner and scontrol that
    record their arguments (this tests our script's logic only; the real Slurm path is
    test_usr1_saves_requeues_and_resumes). 143 with preempted.json written by this run and no SIGTERM
    to the shell (the USR1 before the time limit reached the ranks only, they saved) -> `scontrol
    requeue $SLURM_JOB_ID`, at most MAX_REQUEUES times. No requeue for: 143 after scancel or `scontrol
    requeue` (the shell got SIGTERM too: Slurm decides), 143 without a save (srun's --kill-on-bad-exit
    after another node failed; a marker left from an earlier run does not count), other statuses."""
    end, saves, restarts, requeue_status, expected_status, requeued = REQUEUE_CASES[case]
    fake = tmp_path / "bin"
    fake.mkdir()
    for name, text in (("srun", FAKE_LAUNCH), ("python", FAKE_LAUNCH), ("scontrol", FAKE_SCONTROL)):
        (fake / name).write_text(text)
        (fake / name).chmod(0o755)
    log, out = tmp_path / "calls.log", tmp_path / "out"
    out.mkdir()
    (out / "preempted.json").write_text('{"step": 1}\n')  # from an earlier run: removed before srun
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_NNODES": "1",
        "SLURM_JOB_NODELIST": "node1",
        "SLURM_CPUS_PER_TASK": "1",
        "SLURM_NTASKS_PER_NODE": "1",
        "SLURM_RESTART_COUNT": restarts,
        "MAX_REQUEUES": "3",
        "PYTHON": str(fake / "python"),
        "REAL_PYTHON": sys.executable,
        "PYTHONPATH": str(both_scripts / "src"),
        "FAKE_END": end,
        "FAKE_SAVES": saves,
        "FAKE_MARKER": str(out / "preempted.json"),
        "FAKE_LOG": str(log),
        "FAKE_REQUEUE_STATUS": requeue_status,
        "PATH": os.pathsep.join([str(fake), os.environ["PATH"]]),
    }
    result = run(
        ["bash", str(both_scripts / "launch" / "slurm" / script), "schedule.max_steps=7", f"run.output_dir={out}"],
        cwd=both_scripts,
        env=env,
        timeout=60,
    )
    calls = log.read_text().splitlines()
    assert calls[0].startswith("launch ") and calls[0].endswith(f"run.output_dir={out}"), calls  # it ran the job
    assert re.search(rf"^job 4242: .*restart {restarts or 0}$", result.stdout, re.MULTILINE), result.stdout
    assert result.returncode == expected_status, result.stdout + result.stderr
    assert calls[1:] == (["scontrol requeue 4242"] if requeued else []), calls
    assert (out / "preempted.json").exists() == (saves == "1")  # the stale one is gone
    if case == "preempted":
        assert "checkpoint saved; requeued (1 of 3)" in result.stdout
    if case == "preempted-budget-spent":
        assert "not requeued, it already ran 4 time(s) (MAX_REQUEUES=3)" in result.stderr
    if case == "requeue-fails":
        assert "`scontrol requeue` failed: submit again" in result.stderr


def test_no_slurm_folder_without_the_platform(default_project):
    assert not (default_project / "launch" / "slurm").exists()


@pytest.mark.quick
def test_dry_run_prints_the_sbatch_command_without_sbatch(slurm_project):
    # PATH holds only the interpreter's folder: --dry-run must not need sbatch.
    result = cli(
        slurm_project,
        "launch",
        "slurm",
        "--dry-run",
        "--partition",
        "debug",
        "--sbatch-arg=--qos=high",
        "schedule.max_steps=7",
        env={"PATH": str(BIN)},
    )
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith(f"$ cd {slurm_project} && sbatch "), first
    argv = shlex.split(first.split("&& ", 1)[1])
    runs = slurm_project.parent / "runs"
    assert argv == [
        "sbatch",
        "--parsable",
        f"--output={runs}/slurm/%x-%j.out",
        f"--error={runs}/slurm/%x-%j.err",
        "--partition=debug",
        "--qos=high",
        "launch/slurm/train.sbatch",
        "schedule.max_steps=7",
    ]
    assert "--- launch/slurm/train.sbatch" in result.stdout
    assert "#SBATCH --nodes=2" in result.stdout
    assert not (runs / "slurm").exists(), "a dry run creates nothing"


def test_missing_sbatch_names_the_fix(slurm_project):
    result = cli(slurm_project, "launch", "slurm", env={"PATH": str(BIN)})
    assert result.returncode == 1
    assert "sbatch is not on PATH" in result.stderr and "--dry-run" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def slurm_data(slurm_project, demo_corpus) -> Path:
    # the answer's data_dir: on "shared storage" (both slurmd are local)
    return copy_demo_corpus(demo_corpus, slurm_project.parent / "data")


def job_record(job_id: str) -> dict[str, str]:
    """The job's line in jobcomp.txt (kept after scontrol forgets the job): field -> value."""
    lines = [
        line
        for line in (SLURM_DIR / "log" / "jobcomp.txt").read_text().splitlines()
        if line.startswith(f"JobId={job_id} ")
    ]
    assert lines, f"job {job_id} is not in {SLURM_DIR}/log/jobcomp.txt"
    return dict(f.split("=", 1) for f in lines[-1].split() if "=" in f)  # the newest, should ids start over


def submitted_job(output: str) -> str:
    match = re.search(r"^submitted job (\d+)$", output, re.MULTILINE)
    assert match, output
    return match.group(1)


def test_two_node_training_job(slurm_cluster, slurm_project, slurm_data):
    result = cli(slurm_project, "launch", "slurm", "--wait", *CPU_CLUSTER, *TINY_RUN, env=slurm_cluster, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    job_id = submitted_job(result.stdout)
    assert f"job {job_id} ended: exit 0" in result.stdout

    runs = slurm_project.parent / "runs"
    log = (runs / "slurm" / f"slurmci-{job_id}.out").read_text()
    errors = (runs / "slurm" / f"slurmci-{job_id}.err").read_text()
    assert f"  log:    {runs}/slurm/slurmci-{job_id}.out" in result.stdout
    assert f"project {slurm_project}" in log  # ran in the submit folder
    assert re.search(r", memlock (unlimited|\d+), TRAIN_DEBUG=0, restart 0$", log, re.MULTILINE), log
    # Both node launchers ran, one on each node, and agreed on the master.
    assert re.findall(r"^node rank\s+(\d)$", log, re.MULTILINE) in (["0", "1"], ["1", "0"]), log + errors
    assert len(re.findall(r"^platform\s+slurm$", log, re.MULTILINE)) == 2, log
    assert len(re.findall(r"^nodes\s+2$", log, re.MULTILINE)) == 2, log
    assert len(set(re.findall(r"^master\s+(node1:\d+)$", log, re.MULTILINE))) == 1, log
    # Rank 0 saw the whole world: 2 processes, one per node.
    assert "2 process(es) on cpu" in log, log + errors
    steps = [r["step"] for r in map(json.loads, (runs / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert steps == [5, 10], steps

    record = job_record(job_id)
    assert record["JobState"] == "COMPLETED", record
    assert record["NodeList"] == "node[1-2]" and record["NodeCnt"] == "2", record
    assert record["TimeLimit"] == "10", record  # the answer's slurm_time reached the job


def test_gres_request_is_scheduled_and_trains(slurm_cluster, slurm_data, tmp_path):
    """slurm_gpu_request=gres: `#SBATCH --gres=gpu:standin:1` goes to a real slurmctld, whose nodes
    offer stand-in GPUs of that type (tests/infra/slurm.sh); the job holds one per node and trains
    on both nodes (on CPU). A type the nodes lack is refused at submit: the answer reaches Slurm."""
    answers = dict(project_name="Slurm Gres", platforms="[devmachine,slurm]", nodes=2, gpus_per_node=1)
    answers |= dict(slurm_time="00:10:00", slurm_gpu_request="gres", data_dir=str(slurm_data))
    project = render(tmp_path / "p", **answers, slurm_gpu_type="standin", output_dir=str(tmp_path / "runs"))
    opts = sbatch_options((project / "launch" / "slurm" / "train.sbatch").read_text())
    assert opts["gres"] == "gpu:standin:1" and "gpus-per-node" not in opts

    result = cli(project, "launch", "slurm", "--sbatch-arg=--cpus-per-task=1", *TINY_RUN, env=slurm_cluster)
    assert result.returncode == 0, result.stdout + result.stderr
    job_id = submitted_job(result.stdout)
    held = run(["scontrol", "show", "job", job_id], env=slurm_cluster).stdout
    assert re.search(r"\bTresPerNode=gres:gpu:standin:1\b", held), held
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        jobcomp = SLURM_DIR / "log" / "jobcomp.txt"
        if f"JobId={job_id} " in (jobcomp.read_text() if jobcomp.is_file() else ""):
            break
        time.sleep(2)
    log = (tmp_path / "runs" / "slurm" / f"slurmgres-{job_id}.out").read_text()
    errors = (tmp_path / "runs" / "slurm" / f"slurmgres-{job_id}.err").read_text()
    assert job_record(job_id)["JobState"] == "COMPLETED", log + errors
    assert re.findall(r"^node rank\s+(\d)$", log, re.MULTILINE) in (["0", "1"], ["1", "0"]), log + errors
    assert "2 process(es) on cpu" in log, log + errors
    metrics = (tmp_path / "runs" / "metrics.jsonl").read_text().splitlines()
    assert [r["step"] for r in map(json.loads, metrics) if "loss" in r] == [5, 10], metrics

    other = render(tmp_path / "v100", **answers, slurm_gpu_type="v100", output_dir=str(tmp_path / "runs-v100"))
    test_only = ["sbatch", "--test-only", "--cpus-per-task=1", "launch/slurm/train.sbatch"]
    accepted = run(test_only, cwd=project, env=slurm_cluster)
    assert accepted.returncode == 0 and "to start at" in accepted.stderr, accepted
    refused = run(test_only, cwd=other, env=slurm_cluster)
    assert refused.returncode != 0 and "Requested node configuration is not available" in refused.stderr, refused


def test_modules_load_before_srun_and_dry_run(slurm_cluster, tmp_path):
    """The answered modules are loaded in the job (a stand-in `module` command records the call),
    and DRY_RUN=1 makes every node print its topology and torchrun command without training."""
    project = render(
        tmp_path / "p",
        project_name="Slurm Mod",
        platforms="[devmachine,slurm]",
        nodes=2,
        gpus_per_node=1,
        slurm_modules="cuda/12.4 nccl",
        data_dir=str(tmp_path / "data"),
        output_dir=str(tmp_path / "runs"),
    )
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "module").write_text('#!/bin/sh\necho "stand-in module: $*"\n')
    (fake / "module").chmod(0o755)
    env = {**slurm_cluster, "DRY_RUN": "1", "PATH": os.pathsep.join([str(fake), str(BIN), os.environ["PATH"]])}
    result = cli(project, "launch", "slurm", "--wait", *CPU_CLUSTER, *TINY_RUN, env=env, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    log = (tmp_path / "runs" / "slurm" / f"slurmmod-{submitted_job(result.stdout)}.out").read_text()
    assert log.startswith("stand-in module: load cuda/12.4 nccl\n"), log
    assert sorted(re.findall(r"^node rank\s+(\d)$", log, re.MULTILINE)) == ["0", "1"], log
    # Both nodes meet at the first host's c10d rendezvous (torchrun restarts a failed group from there),
    # the ordered one that keeps SLURM_NODEID 0 at global rank 0 (rendezvous.py).
    rendezvous = re.findall(
        r"-m slurmmod\.cluster\.rendezvous --nproc-per-node 1 .*--nnodes 2 --rdzv-backend c10d-ordered "
        r"--rdzv-endpoint node1:\d+ --rdzv-conf is_host=(true|false),node_rank=([01]) ",
        log,
    )
    assert sorted(rendezvous) == [("false", "1"), ("true", "0")], log
    assert "process(es)" not in log and not (tmp_path / "runs" / "metrics.jsonl").exists()


def test_failing_job_returns_its_exit_status(slurm_cluster, slurm_project, tmp_path):
    empty = tmp_path / "no-data"
    empty.mkdir()
    # cluster.max_restarts=0: one attempt; torchrun's restarts of a failed group are not this test's subject.
    result = cli(
        slurm_project,
        "launch",
        "slurm",
        "--wait",
        *CPU_CLUSTER,
        *TINY_RUN,
        f"data.dir={empty}",
        f"run.output_dir={tmp_path / 'runs'}",
        "cluster.max_restarts=0",
        env=slurm_cluster,
        timeout=240,
    )
    assert result.returncode != 0, result.stdout + result.stderr
    job_id = submitted_job(result.stdout)
    record = job_record(job_id)
    assert record["JobState"] == "FAILED", record
    # The job's own status: 1 from the failed rank, or 143 when srun's kill of the other node wins the race.
    assert result.returncode == int(record["ExitCode"].split(":")[0]), (result.returncode, record)
    assert f"job {job_id} ended: exit {result.returncode}, FAILED" in result.stdout
    assert f"last lines of {tmp_path}/runs/slurm/slurmci-{job_id}.err" in result.stderr  # logs follow run.output_dir
    # --kill-on-bad-exit: one failed node ends the whole step instead of leaving the other waiting.
    assert "exited with exit code 1" in result.stderr.lower()


# --- DeepSpeed's own launcher: launch/slurm/train-deepspeed.sbatch -----------------------------------

DS_SCRIPT = Path("launch") / "slurm" / "train-deepspeed.sbatch"


@pytest.mark.parametrize("name", list(ANSWER_SETS))
def test_deepspeed_sbatch_lines_follow_the_answers(tmp_path, name):
    answers = ANSWER_SETS[name]
    project = render(
        tmp_path / "p",
        project_name="Slurm Shape",
        platforms="[devmachine,slurm]",
        strategy="deepspeed",
        data_dir=str(tmp_path / "data"),
        output_dir=str(tmp_path / "runs"),
        **answers,
    )
    path = project / DS_SCRIPT
    script = path.read_text()
    check = run(["bash", "-n", str(path)])
    assert check.returncode == 0, check.stderr
    assert script.isascii()
    opts = sbatch_options(script)
    assert opts["job-name"] == "slurmshape" and opts["nodes"] == str(answers["nodes"])
    # One Slurm task per GPU: DeepSpeed's slurm launcher starts every rank with srun.
    assert opts["ntasks-per-node"] == str(answers["gpus_per_node"])
    option, value = gpu_option(answers)
    assert opts[option] == value and not {"gres", "gpus-per-node"} - {option} & set(opts)  # one way, not both
    assert opts["cpus-per-task"] == str(answers.get("slurm_cpus_per_gpu", 8))  # per rank, not per node
    assert opts["time"] == answers.get("slurm_time", "24:00:00")
    assert opts["output"] == f'"{tmp_path}/runs/slurm/%x-%j.out"'
    for key in ("partition", "account"):
        assert opts.get(key) == answers.get(f"slurm_{key}"), key
    assert ("module load $MODULES" in script) == ("slurm_modules" in answers)
    assert "-m deepspeed.launcher.runner" in script and "--launcher slurm" in script
    assert "-- -m slurmshape train" in script
    assert opts["requeue"] == "" and opts["signal"] == f"USR1@{SIGNAL_SECONDS}" and opts["open-mode"] == "append"
    outside = run(["bash", str(path)], env={"SLURM_JOB_ID": ""})
    assert outside.returncode == 2 and "not inside a Slurm job" in outside.stderr, outside.stderr
    # The torchrun script is generated next to it, unchanged.
    assert (project / "launch" / "slurm" / "train.sbatch").is_file()


@pytest.mark.parametrize("slurm_time, lead", [("00:10:00", 150), ("00:19:59", 299), ("1-00:00:00", 300)])
def test_usr1_lead_time_follows_a_short_time_limit(tmp_path, slurm_time, lead):
    """USR1@300 under a 5-minute limit would arrive at once: a limit under 20 min gets a quarter of it,
    in both scripts and the README."""
    project = render(
        tmp_path / "p",
        project_name="Slurm Lead",
        platforms="[slurm]",
        strategy="deepspeed",
        slurm_time=slurm_time,
        data_dir=str(tmp_path / "data"),
        output_dir=str(tmp_path / "runs"),
    )
    for script in ("train.sbatch", "train-deepspeed.sbatch"):
        text = (project / "launch" / "slurm" / script).read_text()
        assert text.startswith("#!/bin/bash\n# Train Slurm Lead on Slurm"), text[:80]
        assert sbatch_options(text)["signal"] == f"USR1@{lead}", script
    assert f"`--signal=USR1@{lead}`" in (project / "launch" / "slurm" / "README.md").read_text()


@pytest.mark.parametrize(
    "given, signals",
    [
        ([], []),  # the script's own line applies
        (["--time", "00:08:00"], ["--signal=USR1@120"]),  # a quarter of a short limit
        (["--time", "2-00:00:00"], ["--signal=USR1@300"]),
        (["--sbatch-arg=--time=12"], ["--signal=USR1@180"]),  # minutes, as sbatch reads "12"
        (["--time", "00:08:00", "--sbatch-arg=--signal=USR1@30"], ["--signal=USR1@30"]),  # the user's own wins
    ],
)
def test_time_given_at_submit_moves_the_usr1_warning(slurm_project, given, signals):
    """A time limit given to `launch slurm` replaces the script's, so the USR1 lead time follows it."""
    result = cli(slurm_project, "launch", "slurm", "--dry-run", *given, env={"PATH": str(BIN)})
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout.splitlines()[0].split("&& ", 1)[1])
    assert [a for a in argv if a.startswith("--signal=")] == signals, argv
    assert argv.index("launch/slurm/train.sbatch") > max((argv.index(x) for x in signals), default=0)


def test_deepspeed_launcher_needs_a_deepspeed_project(slurm_project):
    """A DDP project has no train-deepspeed.sbatch: the error says how to get it."""
    assert not (slurm_project / DS_SCRIPT).exists()
    result = cli(slurm_project, "launch", "slurm", "--launcher", "deepspeed", "--dry-run", env={"PATH": str(BIN)})
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("error: launch slurm --launcher deepspeed: this project was made without DeepSpeed")
    assert "`copier update --data strategy=deepspeed`" in result.stderr


@pytest.fixture(scope="module")
def ds_project(tmp_path_factory, demo_corpus) -> Path:
    root = tmp_path_factory.mktemp("slurm-ds")
    project = render(
        root / "project",
        project_name="Slurm DS",
        platforms="[devmachine,slurm]",
        strategy="deepspeed",
        zero_stage=2,
        nodes=2,
        gpus_per_node=1,
        slurm_time="00:10:00",
        data_dir=str(root / "data"),
        output_dir=str(root / "runs"),
    )
    copy_demo_corpus(demo_corpus, root / "data")
    return project


def test_deepspeed_dry_run_submits_the_deepspeed_script(ds_project):
    result = cli(
        ds_project,
        "launch",
        "slurm",
        "--launcher",
        "deepspeed",
        "--dry-run",
        "schedule.max_steps=7",
        env={"PATH": str(BIN)},
    )
    assert result.returncode == 0, result.stderr
    argv = shlex.split(result.stdout.splitlines()[0].split("&& ", 1)[1])
    assert argv[-2:] == [str(DS_SCRIPT), "schedule.max_steps=7"]
    assert f"--- {DS_SCRIPT}" in result.stdout and "--launcher slurm" in result.stdout


def test_deepspeed_zero2_job_through_deepspeed_launcher_slurm(slurm_cluster, ds_project):
    """The tiny ZeRO-2 job: sbatch -> train-deepspeed.sbatch -> `deepspeed --launcher slurm` -> one srun
    with a task on each node -> `train` in each rank. Both ranks took part: rank 0 reports a world of 2,
    and the checkpoint holds one ZeRO optimizer shard per rank."""
    runs = ds_project.parent / "runs"
    result = cli(
        ds_project,
        "launch",
        "slurm",
        "--launcher",
        "deepspeed",
        "--wait",
        *CPU_CLUSTER,
        *TINY_RUN,
        "checkpoint.every_steps=10",
        env=slurm_cluster,
        timeout=300,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    job_id = submitted_job(result.stdout)
    assert f"job {job_id} ended: exit 0" in result.stdout
    log = (runs / "slurm" / f"slurmds-{job_id}.out").read_text()
    errors = (runs / "slurm" / f"slurmds-{job_id}.err").read_text()
    # The batch script wrote a hostfile of the allocation and ran DeepSpeed's runner with it.
    assert re.search(r"^  node1 slots=1\n  node2 slots=1$", log, re.MULTILINE), log
    assert f"master node1:{20000 + int(job_id) % 20000}" in log, log
    # DeepSpeed's slurm launcher turned it into one srun over both nodes, a task per rank, running train.
    srun = re.search(r"cmd = (srun .*)$", log, re.MULTILINE)  # DeepSpeed's runner logs to stdout
    assert srun, log + errors
    assert srun.group(1).startswith("srun -n 2 --ntasks-per-node=1 --cpus-per-task=1 --kill-on-bad-exit=1 --nodes 2 ")
    assert " -u -m slurmds train model.size=tiny " in srun.group(1)
    assert "2 process(es) on cpu" in log and "strategy deepspeed ZeRO 2" in log, log + errors
    steps = [r["step"] for r in map(json.loads, (runs / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert steps == [5, 10], steps
    shards = sorted(p.name for p in (runs / "checkpoints" / "step_00000010").glob("zero_pp_rank_*_optim_states.pt"))
    assert shards == ["zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    record = job_record(job_id)
    assert record["JobState"] == "COMPLETED" and record["NodeList"] == "node[1-2]", record
    assert not list(Path("/tmp").glob(f"slurmds-{job_id}.hostfile")), "the hostfile is removed at the end"


# --- Preemption and requeue on the real cluster -----------------------------------------------------

FAULT_STEPS = 30
FAULT_RUN = [a for a in TINY_RUN if not a.startswith(("schedule.max_steps=", "checkpoint.every_steps="))] + [
    f"schedule.max_steps={FAULT_STEPS}",
    "checkpoint.every_steps=5",
]


def final_loss(output_dir: Path) -> tuple[list[int], float]:
    """The logged steps of metrics.jsonl and the loss of the last one."""
    records = [r for r in map(json.loads, (output_dir / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    return [r["step"] for r in records], records[-1]["loss"]


@pytest.fixture(scope="module")
def reference_run(slurm_cluster, slurm_project, slurm_data) -> float:
    """The same 2-node job, never interrupted: the loss a resumed job must reach bit for bit."""
    out = slurm_project.parent / "reference"
    result = cli(
        slurm_project,
        "launch",
        "slurm",
        "--wait",
        *CPU_CLUSTER,
        *FAULT_RUN,
        f"run.output_dir={out}",
        env=slurm_cluster,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    steps, loss = final_loss(out)
    assert steps == list(range(5, FAULT_STEPS + 1, 5)), steps
    return loss


def wait_until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")


def job_state(job_id: str, env: dict) -> str:
    return run(["squeue", "-h", "-j", job_id, "-o", "%T"], env=env).stdout.strip()


def interrupted_job(
    project: Path, out: Path, env: dict, interrupt, launcher: tuple[str, ...] = ()
) -> tuple[str, str, str, int]:
    """`launch slurm --wait` in the background with slow steps (TRAIN_FAULT_STEP_SECONDS reaches the
    ranks: sbatch exports the submitter's environment); once the first checkpoint exists,
    interrupt(job_id). The requeued job waits for its BeginTime (cred_expire + 1 = 121 s on a default
    slurm.conf) before it may start again: `scontrol update StartTime=now` shortens that wait here, a
    little after the job is pending again.
    Returns job id, the wait's stdout, the job's .out log, the wait's exit status."""
    stdout, stderr = out.parent / f"{out.name}-launch.out", out.parent / f"{out.name}-launch.err"
    slug = next(p.name for p in (project / "src").iterdir() if (p / "__main__.py").is_file())
    full_env = {
        **os.environ,
        "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(project / "src"),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "TRAIN_FAULT_STEP_SECONDS": "0.5",
        **env,
    }
    with stdout.open("w") as o, stderr.open("w") as e:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                slug,
                "launch",
                "slurm",
                *launcher,
                "--wait",
                *CPU_CLUSTER,
                *FAULT_RUN,
                f"run.output_dir={out}",
            ],
            cwd=project,
            env=full_env,
            stdout=o,
            stderr=e,
            text=True,
        )
    job_id = None
    try:
        job_id = wait_until(
            lambda: (m := re.search(r"^submitted job (\d+)$", stdout.read_text(), re.MULTILINE)) and m.group(1),
            60,
            "the job id",
        )
        # DDP saves step_00000005.pt, DeepSpeed a folder step_00000005 (renamed into place when complete).
        wait_until(lambda: list((out / "checkpoints").glob("step_00000005*")), 180, "the first checkpoint")
        interrupt(job_id)
        # Requeued: pending again (after its processes ended), with one restart counted.
        wait_until(lambda: job_state(job_id, env) == "PENDING", 90, f"job {job_id} back in the queue")
        # Not within the second its old processes were killed: slurmd refuses a credential issued in the
        # same second as the revocation ("Job credential revoked", the job FAILS), hence Slurm's wait.
        time.sleep(2)
        update = run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=env)
        assert update.returncode == 0, update.stderr
        try:
            code = proc.wait(timeout=300)
        except subprocess.TimeoutExpired:
            pytest.fail(f"job {job_id} did not end within 300 s of its restart:\n" + _job_logs(out, stdout, stderr))
    finally:
        if proc.poll() is None:  # a failed check: leave no job behind
            proc.kill()
            if job_id:
                run(["scancel", job_id], env=env)
    log = next((out / "slurm").glob(f"*-{job_id}.out")).read_text()
    return job_id, stdout.read_text() + stderr.read_text(), log, code


def _job_logs(out: Path, *launch_logs: Path) -> str:
    """The tails of the launch's output and of the job's own .out/.err, for a failure message."""
    logs = [*launch_logs, *sorted((out / "slurm").glob("*"))]
    return "".join(f"\n--- {log}\n{log.read_text(errors='replace')[-3000:]}" for log in logs if log.is_file())


def assert_resumed_exactly(job_id: str, wait_output: str, log: str, code: int, out: Path, reference: float):
    assert code == 0, wait_output + log
    # `sbatch --wait` (Slurm 22.05) keeps waiting across a requeue and returns the final run's status.
    assert f"job {job_id} ended: exit 0, COMPLETED, after 1 requeue(s)" in wait_output, wait_output
    # The log is appended to on requeue: the first run, then the second, counted by SLURM_RESTART_COUNT.
    assert re.findall(rf"^job {job_id}: 2 node\(s\) .*restart (\d)$", log, re.MULTILINE) == ["0", "1"], log
    assert f"steps 0->{FAULT_STEPS}" in log, log
    resumed = re.findall(rf"steps (\d+)->{FAULT_STEPS}", log)
    assert len(resumed) == 2 and 5 <= int(resumed[1]) < FAULT_STEPS, log  # resumed from its checkpoint
    steps, loss = final_loss(out)
    assert steps == list(range(5, FAULT_STEPS + 1, 5)), steps  # records past the checkpoint were redone, once
    assert loss == reference, (loss, reference)  # bit for bit the uninterrupted run's loss
    records = [
        line
        for line in (SLURM_DIR / "log" / "jobcomp.txt").read_text().splitlines()
        if line.startswith(f"JobId={job_id} ")
    ]
    assert len(records) == 2 and "JobState=COMPLETED" in records[-1], records  # the requeue, then the end
    assert not (out / "preempted.json").exists()  # cleared by the run that resumed


def test_scontrol_requeue_resumes_from_the_checkpoint(slurm_cluster, slurm_project, slurm_data, reference_run):
    """`scontrol requeue` of a running 2-node job: Slurm sends SIGTERM to every process, the ranks save
    at the next logging step and exit 143, the batch script leaves the requeue to Slurm, and the job
    runs again, resumes from that checkpoint and ends with the uninterrupted run's loss."""
    out = slurm_project.parent / "requeued"

    def requeue(job_id):
        result = run(["scontrol", "requeue", job_id], env=slurm_cluster)
        assert result.returncode == 0, result.stderr

    job_id, wait_output, log, code = interrupted_job(slurm_project, out, slurm_cluster, requeue)
    assert "preempted (SIGTERM)" in log, log
    assert "requeued (" not in log  # Slurm requeued it, not the script
    assert_resumed_exactly(job_id, wait_output, log, code, out, reference_run)


def test_usr1_saves_requeues_and_resumes(slurm_cluster, slurm_project, slurm_data, reference_run):
    """The time-limit warning path: SIGUSR1 to the job steps only (what `--signal=USR1@N` sends N s
    before the limit; `scancel --signal=USR1` sends it now). The ranks save and exit 143, the node
    launchers report the preemption, and the batch script, which got no signal, requeues the job
    itself; it resumes and ends with the uninterrupted run's loss."""
    out = slurm_project.parent / "usr1"

    def warn(job_id):
        result = run(["scancel", "--signal=USR1", job_id], env=slurm_cluster)
        assert result.returncode == 0, result.stderr

    job_id, wait_output, log, code = interrupted_job(slurm_project, out, slurm_cluster, warn)
    assert "preempted (SIGUSR1)" in log, log
    assert re.search(r"preempted by SIGUSR1 at step \d+: checkpoint .* is saved", log), log  # the node supervisor
    assert f"job {job_id}: checkpoint saved; requeued (1 of 10)" in log, log
    assert_resumed_exactly(job_id, wait_output, log, code, out, reference_run)


def test_deepspeed_job_saves_on_usr1_and_requeues(slurm_cluster, ds_project):
    """The same warning under train-deepspeed.sbatch: SIGUSR1 reaches the ranks (srun tasks), not
    DeepSpeed's runner nor the batch shell; the ranks save, the runner passes srun's 143 on, the script
    requeues; the job resumes and ends with an uninterrupted DeepSpeed run's loss."""
    reference = ds_project.parent / "ds-reference"
    result = cli(
        ds_project,
        "launch",
        "slurm",
        "--launcher",
        "deepspeed",
        "--wait",
        *CPU_CLUSTER,
        *FAULT_RUN,
        f"run.output_dir={reference}",
        env=slurm_cluster,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = ds_project.parent / "ds-usr1"

    def warn(job_id):
        result = run(["scancel", "--signal=USR1", job_id], env=slurm_cluster)
        assert result.returncode == 0, result.stderr

    job_id, wait_output, log, code = interrupted_job(ds_project, out, slurm_cluster, warn, ("--launcher", "deepspeed"))
    assert "preempted (SIGUSR1)" in log, log
    assert f"job {job_id}: checkpoint saved; requeued (1 of 10)" in log, log
    assert re.findall(rf"^job {job_id}: 2 node\(s\) .*restart (\d)$", log, re.MULTILINE) == ["0", "1"], log
    assert_resumed_exactly(job_id, wait_output, log, code, out, final_loss(reference)[1])


def test_time_limit_warning_reaches_the_ranks(slurm_cluster, slurm_project, slurm_data):
    """The real --signal=USR1@N before a real time limit: a 2-minute job (`launch slurm --time` sets
    USR1@30) that would train far longer. Slurm signals the steps 30-90 s after the start (its timer
    may be up to 60 s early); the ranks save and exit 143 before the limit, and the batch shell, not
    signalled, takes the requeue branch: with MAX_REQUEUES=0 it says so and ends with 143 (a requeued
    run would wait its BeginTime and meet the same limit; the tests above cover the resume)."""
    out = slurm_project.parent / "time-limit"
    long_run = [a for a in FAULT_RUN if not a.startswith("schedule.max_steps=")] + ["schedule.max_steps=1000"]
    started = time.monotonic()
    result = cli(
        slurm_project,
        "launch",
        "slurm",
        "--wait",
        "--time",
        "00:02:00",
        *CPU_CLUSTER,
        *long_run,
        f"run.output_dir={out}",
        env={**slurm_cluster, "TRAIN_FAULT_STEP_SECONDS": "0.5", "MAX_REQUEUES": "0"},
        timeout=240,
    )
    elapsed = time.monotonic() - started
    job_id = submitted_job(result.stdout)
    log = (out / "slurm" / f"slurmci-{job_id}.out").read_text()
    assert result.returncode == 143, result.stdout + result.stderr + log
    assert "--signal=USR1@30" in result.stdout  # the warning follows the shorter limit
    assert "preempted (SIGUSR1)" in log, log
    errors = (out / "slurm" / f"slurmci-{job_id}.err").read_text()
    assert f"job {job_id}: checkpoint saved; not requeued, it already ran 1 time(s) (MAX_REQUEUES=0)" in errors, errors
    marker = json.loads((out / "preempted.json").read_text())
    assert marker["signal"] == "SIGUSR1" and 0 < marker["step"] < 1000, marker
    assert Path(marker["checkpoint"]).exists(), marker
    record = job_record(job_id)
    assert record["JobState"] == "FAILED" and record["ExitCode"].startswith("143"), record  # not TIMEOUT
    assert elapsed < 120 + 30, elapsed  # ended before the time limit (plus submit and polling)


# --- The job's life from the login node: --action status | logs [--follow] | cancel ------------------

WATCH_RUN = [a for a in TINY_RUN if not a.startswith(("schedule.max_steps=", "logging.every_steps="))] + [
    "schedule.max_steps=1000",
    "logging.every_steps=1",
]


def read_or_empty(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def test_status_logs_follow_and_cancel_a_running_job(slurm_cluster, slurm_project, slurm_data):
    """`launch slurm` without --wait submits, records the job in .jobs/slurm.jsonl and prints the
    follow-up commands. Those act on the recorded job while it runs (TRAIN_FAULT_STEP_SECONDS: a step
    every 0.5 s, far from its 1000): status says RUNNING on both nodes, never requeued; logs prints the
    training lines so far; logs --follow, started in the background, prints lines as they come and
    ends by itself once the job has ended, having printed the whole log; cancel (scancel) gives the
    ranks SIGTERM, they save and exit 143, and the job ends CANCELLED with the batch script's exit code.
    Once Slurm has forgotten the job (MinJobAge, no accounting here), status answers from the project's
    records: the state last seen, the log's last lines, the run folder's step, checkpoint and stop."""
    out = slurm_project.parent / "watched"
    env = {**slurm_cluster, "TRAIN_FAULT_STEP_SECONDS": "0.5"}  # sbatch exports it to the ranks
    submit = cli(
        slurm_project, "launch", "slurm", *CPU_CLUSTER, *WATCH_RUN, f"run.output_dir={out}", env=env, timeout=60
    )
    assert submit.returncode == 0, submit.stdout + submit.stderr
    job_id = submitted_job(submit.stdout)
    log_path, err_path = out / "slurm" / f"slurmci-{job_id}.out", out / "slurm" / f"slurmci-{job_id}.err"
    assert submit.stdout.splitlines()[-4:] == [
        "  status:  slurmci launch slurm --action status",
        "  logs:    slurmci launch slurm --action logs --follow",
        "  cancel:  slurmci launch slurm --action cancel",
        "  save now and continue later: slurmci launch slurm --action cancel --signal USR1",
    ], submit.stdout
    assert "tail -f" not in submit.stdout and "squeue" not in submit.stdout
    record = json.loads((slurm_project / ".jobs" / "slurm.jsonl").read_text().splitlines()[-1])
    assert (record["id"], record["name"], record["where"]) == (job_id, "slurmci", "dtt"), record
    assert record["extra"]["stdout"] == str(log_path) and record["extra"]["stderr"] == str(err_path), record

    def action(*args: str):
        return cli(slurm_project, "launch", "slurm", "--action", *args, env=slurm_cluster, timeout=60)

    follow = None
    try:
        step = wait_until(
            lambda: re.search(r"^step +\d+/1000 \| loss .*$", read_or_empty(log_path), re.MULTILINE),
            120,
            "a training step in the log",
        ).group(0)

        status = action("status")
        assert status.returncode == 0, status.stdout + status.stderr
        lines = status.stdout.splitlines()
        assert lines[0].startswith(f"slurm job {job_id} (slurmci); submitted "), lines
        assert lines[1:4] == ["  state:    RUNNING", "  nodes:    2 node[1-2]", lines[3]], lines
        assert re.fullmatch(r"  elapsed:  \d\d:\d\d:\d\d of 00:10:00", lines[3]), lines  # the answer's slurm_time
        assert lines[4:] == ["  requeued: 0 time(s)", f"  log:      {log_path}"], lines  # no exit line yet

        logs = action("logs")
        assert logs.returncode == 0, logs.stdout + logs.stderr
        assert logs.stdout.startswith(f"job {job_id}: 2 node(s) node[1-2], project {slurm_project}"), logs.stdout
        assert step in logs.stdout, logs.stdout
        assert f"--- {log_path}" in logs.stderr.splitlines(), logs.stderr

        follow_env = {
            **os.environ,
            "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}",
            "PYTHONPATH": str(slurm_project / "src"),
            "PYTHONUNBUFFERED": "1",
            **slurm_cluster,
        }
        followed, follow_err = out / "follow.out", out / "follow.err"
        with followed.open("w") as o, follow_err.open("w") as e:
            follow = subprocess.Popen(
                [sys.executable, "-m", "slurmci", "launch", "slurm", "--action", "logs", "--follow"],
                cwd=slurm_project,
                env=follow_env,
                stdout=o,
                stderr=e,
            )
        wait_until(lambda: step in followed.read_text(), 30, "the followed log to reach the step seen")

        cancel = action("cancel")
        assert cancel.returncode == 0, cancel.stdout + cancel.stderr
        assert cancel.stdout.splitlines() == [
            f"$ scancel {job_id}",
            f"cancelled job {job_id}: its ranks get SIGTERM, save at the next step, and the job ends CANCELLED",
        ]

        # COMPLETING while the ranks save, then the final state, which scontrol keeps MinJobAge (5 s in
        # tests/infra/slurm.sh; the purge may come up to a minute later) on this cluster without
        # accounting: scontrol itself is polled closely and what it last showed is kept.
        shown_last = {}

        def ended():
            shown = run(["scontrol", "-o", "show", "job", job_id], env=slurm_cluster)
            if shown.returncode == 0:
                shown_last["job"] = shown.stdout
            return "JobState=CANCELLED" in shown.stdout or "Invalid job id" in shown.stderr

        wait_until(ended, 60, f"job {job_id} to end")
        # The batch shell noted the SIGTERM, waited for srun and passed the ranks' 143 on.
        assert re.search(r"\bJobState=CANCELLED\b.*\bExitCode=143:0\b", shown_last["job"]), shown_last
        assert follow.wait(timeout=30) == 0, follow_err.read_text()

        # Then Slurm forgets the job: status answers from what the project holds, and says so.
        wait_until(
            lambda: "Invalid job id" in run(["scontrol", "show", "job", job_id], env=slurm_cluster).stderr,
            180,
            f"Slurm to forget job {job_id}",
        )
        forgotten = action("status")
        assert forgotten.returncode == 0, forgotten.stdout + forgotten.stderr
        assert_forgotten_answer(forgotten.stdout, job_id, out, log_path)
    finally:
        if follow is not None and follow.poll() is None:
            follow.kill()
        run(["scancel", job_id], env=slurm_cluster)  # a failed check leaves no job behind (a no-op once ended)
    log, errors = log_path.read_text(), read_or_empty(err_path)
    # The follower printed the whole .out, its last line included, then the .err.
    assert followed.read_text() == log + errors, (followed.read_text()[-2000:], log[-2000:])
    assert follow_err.read_text().splitlines() == [f"--- {log_path}"] + ([f"--- {err_path}"] if errors else [])
    saved = re.search(r"^preempted \(SIGTERM\): checkpoint of step (\d+) saved", log, re.MULTILINE)
    assert saved, log + errors
    assert (out / "checkpoints" / f"step_{int(saved.group(1)):08d}.pt").is_file()
    assert json.loads((out / "preempted.json").read_text())["signal"] == "SIGTERM"
    assert "requeued (" not in log  # scancel ends the job: the script does not requeue it


def assert_forgotten_answer(text: str, job_id: str, out: Path, log_path: Path) -> None:
    """`--action status` of the cancelled job once Slurm forgot it: the record, the state it was last
    seen in, the log's last training line and last word, and the run folder's step, checkpoint and stop."""
    log = log_path.read_text()
    last_line = re.findall(r"^step +\d+/1000 \| loss .*$", log, re.MULTILINE)[-1]
    saved = int(re.search(r"^preempted \(SIGTERM\): checkpoint of step (\d+) saved", log, re.MULTILINE).group(1))
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    lines = text.splitlines()
    assert lines[0].startswith(f"slurm job {job_id} (slurmci); submitted "), lines
    assert lines[1].startswith(f"  Slurm no longer knows job {job_id}: it ended more than MinJobAge ago"), lines
    assert lines[2] == "  from this project's records:", lines
    # What was seen last: the end the follower polled, or else the cancel (after status and logs saw RUNNING).
    assert re.fullmatch(
        r"  last seen: (CANCELLED exit 143:0 at \S+Z \(--action logs\)|scancel sent while RUNNING at \S+Z \(--action cancel\))",
        lines[3],
    ), lines
    assert lines[4:7] == [
        f"  log: {log_path}",
        f"  last line: {last_line}",
        f"  last word: {re.search(r'^preempted .*$', log, re.MULTILINE).group(0)}",
    ], lines
    assert lines[7] == f"  run folder: {out}", lines
    assert lines[8].startswith(f"  latest: step {metrics[-1]['step']:>6}/1000 | loss "), lines
    assert lines[9:] == [
        f"  checkpoint: {out / 'checkpoints' / f'step_{saved:08d}.pt'}",
        f"  stopped by SIGTERM at step {saved} (saved; run again to resume)",
        f"  finished: no, step {saved} of max_steps 1000",
    ], lines


def test_status_without_a_recorded_job_names_the_records(tmp_path):
    """A project that never submitted: the error names .jobs/slurm.jsonl and how to go on (no Slurm needed)."""
    fresh = render(
        tmp_path / "p",
        project_name="Slurm Fresh",
        platforms="[slurm]",
        data_dir=str(tmp_path / "data"),
        output_dir=str(tmp_path / "runs"),
    )
    for action in ("status", "logs", "cancel"):
        result = cli(fresh, "launch", "slurm", "--action", action, env={"PATH": str(BIN)})
        assert result.returncode == 1 and result.stdout == "", result.stdout + result.stderr
        assert result.stderr.splitlines() == [
            f"error: no slurm job submitted from this project yet (none recorded in {fresh}/.jobs/slurm.jsonl): "
            "submit one with `slurmfresh launch slurm`, or pass --id of a job submitted elsewhere"
        ], result.stderr
    assert not (fresh / ".jobs").exists()


UNKNOWN_JOB = "999999"  # never reached by a test cluster's job ids


def unknown_job_action(project: Path, env: dict, action: str):
    """`launch slurm --action ACTION --id UNKNOWN_JOB`, which must end with 1 and no traceback."""
    result = cli(project, "launch", "slurm", "--action", action, "--id", UNKNOWN_JOB, env=env, timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    return result


def test_unknown_job_id_is_said_plainly(slurm_cluster, slurm_project):
    """--id of a job Slurm never had: status and logs say so in a line and exit 1, without a traceback."""
    status = unknown_job_action(slurm_project, slurm_cluster, "status")
    assert status.stdout.splitlines() == [
        f"  Slurm no longer knows job {UNKNOWN_JOB}: it ended more than MinJobAge ago on a cluster without "
        "accounting, or the id is mistyped (`squeue --me` lists your jobs)",
        "  and this project holds nothing of it: no status or logs seen, no log line, no run folder here",
    ], status.stdout
    logs = unknown_job_action(slurm_project, slurm_cluster, "logs")
    lines = logs.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: job {UNKNOWN_JOB}: Slurm does not know it"), lines
    assert lines[0].endswith(f"look in {slurm_project.parent / 'runs' / 'slurm'}"), lines  # where logs go


def test_cancel_of_an_unknown_job_id_fails(slurm_cluster, slurm_project):
    cancel = unknown_job_action(slurm_project, slurm_cluster, "cancel")
    assert f"job {UNKNOWN_JOB}" in cancel.stderr and "cancelled job" not in cancel.stdout, cancel.stdout + cancel.stderr
    assert (
        cancel.stderr.startswith(f"error: Slurm does not know job {UNKNOWN_JOB}")
        and len(cancel.stderr.splitlines()) == 1
    )


def test_a_job_named_in_another_encoding_is_read_not_a_traceback(slurm_cluster, slurm_project, tmp_path):
    """sbatch takes a job name's bytes as given (here latin-1) and scontrol prints them so: status reads
    Slurm's output with replacement characters (slurm_output), not a UnicodeDecodeError."""
    log = tmp_path / "job.out"
    name = os.fsdecode(b"caf\xe9")  # passed on to sbatch as the byte 0xe9
    sbatch = ["sbatch", "--parsable", f"--job-name={name}", f"--output={log}", "--wrap", "sleep 300"]
    submitted = run(sbatch, env=slurm_cluster)
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip().split(";")[0]
    try:
        raw = subprocess.run(
            ["scontrol", "show", "job", job_id], env={**os.environ, **slurm_cluster}, capture_output=True
        )
        assert b"JobName=caf\xe9\n" in raw.stdout, raw.stdout[:200]  # not UTF-8: what broke status
        status = cli(slurm_project, "launch", "slurm", "--action", "status", "--id", job_id, env=slurm_cluster)
        assert status.returncode == 0 and "Traceback" not in status.stderr, status.stdout + status.stderr
        assert re.search(r"state: +(PENDING|RUNNING)", status.stdout) and f"log:      {log}" in status.stdout
    finally:
        # Slurm shows an ended job for MinJobAge: under an ASCII name, for the other tests' own readers.
        run(["scontrol", "update", f"JobId={job_id}", "JobName=renamed"], env=slurm_cluster)
        run(["scancel", job_id], env=slurm_cluster)


# --- The partition's limits, read with sinfo before submitting ------------------------------------


def node_cpus(env: dict) -> int:
    [cpus] = set(run(["sinfo", "-h", "-N", "-o", "%c"], env=env).stdout.split())
    return int(cpus)


def test_request_no_node_holds_is_refused_before_sbatch(slurm_cluster, tmp_path):
    """As on the seed's V100 node (20 cores, 4 GPUs, 8 asked per GPU): each node here has 2 stand-in
    GPUs and this host's cores, and the project asks twice those cores for its 2 GPUs."""
    cpus = node_cpus(slurm_cluster)
    answers = dict(platforms="[devmachine,slurm]", nodes=1, gpus_per_node=2, slurm_time="00:05:00")
    paths = dict(data_dir=str(tmp_path / "data"), output_dir=str(tmp_path / "runs"))
    project = render(tmp_path / "big", project_name="Too Big", slurm_cpus_per_gpu=cpus, **answers, **paths)
    result = cli(project, "launch", "slurm", env=slurm_cluster)
    expected = (
        f"error: slurm default partition debug: the job asks {2 * cpus} CPUs per node for 2 GPU(s), but its "
        f"largest such node (node1) has {cpus}; change slurm_cpus_per_gpu={cpus // 2} "
        f"(`copier update --data slurm_cpus_per_gpu={cpus // 2}`; for one job --sbatch-arg=--cpus-per-task={cpus})"
    )
    assert result.returncode == 1 and result.stderr.strip() == expected, result.stdout + result.stderr
    assert result.stdout == "" and not (project / ".jobs").exists()  # nothing submitted
    # Slurm agrees: the same script given to sbatch directly is refused, in its own words.
    direct = run(["sbatch", "launch/slurm/train.sbatch"], cwd=project, env=slurm_cluster)
    assert direct.returncode != 0 and "node configuration is not available" in direct.stderr, direct.stderr
    # `check` says the same where sinfo answers, and nothing of it where it does not.
    check = cli(project, "check", env=slurm_cluster)
    assert check.returncode == 1 and f"  - {expected.removeprefix('error: ')}" in check.stderr.splitlines()
    elsewhere = cli(project, "check", env={"SLURM_CONF": str(tmp_path / "no-cluster.conf")})
    assert elsewhere.returncode == 0 and "slurm" not in elsewhere.stdout + elsewhere.stderr, elsewhere.stderr

    # The answer it names is accepted by Slurm: the job runs (DRY_RUN: each node prints its topology).
    fixed = render(tmp_path / "fixed", project_name="Too Big", slurm_cpus_per_gpu=cpus // 2, **answers, **paths)
    assert cli(fixed, "check", env=slurm_cluster).returncode == 0
    done = cli(fixed, "launch", "slurm", "--wait", env={**slurm_cluster, "DRY_RUN": "1"}, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert record_state(submitted_job(done.stdout)) == "COMPLETED"


def record_state(job_id: str) -> str:
    return job_record(job_id)["JobState"]


# --- Code from the shared storage -----------------------------------------------------------------


def test_job_runs_its_code_copy_without_the_checkout(slurm_cluster, demo_corpus, tmp_path):
    """code_from=storage: `launch slurm` copies the project to <shared>/<slug>/code/... and the job runs
    that copy with the nodes' Python (the "image"): the checkout is moved away before the job starts
    (held, then released) and it trains all the same."""
    shared = tmp_path / "shared"
    checkout = render(
        tmp_path / "checkout",
        project_name="From Storage",
        platforms="[devmachine,slurm]",
        code_from="storage",
        nodes=2,
        gpus_per_node=1,
        slurm_time="00:10:00",
        shared_mount=str(shared),
    )
    copy_demo_corpus(demo_corpus, shared / "fromstorage" / "data")
    submit = cli(checkout, "launch", "slurm", "--sbatch-arg=--hold", *CPU_CLUSTER, *TINY_RUN, env=slurm_cluster)
    assert submit.returncode == 0, submit.stdout + submit.stderr
    job_id = submitted_job(submit.stdout)
    [record] = [json.loads(line) for line in (checkout / ".jobs" / "slurm.jsonl").read_text().splitlines()]
    copy = Path(record["code_copy"])
    assert copy.parent == shared / "fromstorage" / "code" and record["id"] == job_id
    assert sorted(p.name for p in copy.iterdir()) == ["config", "launch", "pyproject.toml", "src"]

    moved = checkout.rename(tmp_path / "moved")
    released = run(["scontrol", "release", job_id], env=slurm_cluster)
    assert released.returncode == 0, released.stderr
    wait_until(lambda: job_state(job_id, slurm_cluster) == "", 240, f"job {job_id} to end")
    runs = shared / "fromstorage" / "runs"
    log = (runs / "slurm" / f"fromstorage-{job_id}.out").read_text()
    errors = (runs / "slurm" / f"fromstorage-{job_id}.err").read_text()
    assert record_state(job_id) == "COMPLETED", log + errors
    assert f"project {copy}," in log and str(moved) not in log + errors
    steps = [r["step"] for r in map(json.loads, (runs / "metrics.jsonl").read_text().splitlines()) if "loss" in r]
    assert steps == [5, 10], log + errors


def test_python_without_torch_fails_in_one_line(slurm_cluster, slurm_project, tmp_path):
    """The "image" lacks what the project needs: every node says so in one line and the job fails."""
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    out = tmp_path / "runs"
    result = cli(
        slurm_project,
        "launch",
        "slurm",
        "--wait",
        "--code-from-storage",
        *CPU_CLUSTER,
        f"run.output_dir={out}",
        env={**slurm_cluster, "PYTHON": str(bare / "bin" / "python")},
        timeout=180,
    )
    assert result.returncode != 0 and "FAILED" in result.stdout, result.stdout + result.stderr
    job_id = submitted_job(result.stdout)
    [copy] = (tmp_path / "code").iterdir()  # beside run.output_dir
    lines = (out / "slurm" / f"slurmci-{job_id}.err").read_text().splitlines()
    # The first node to fail has srun end the other (--kill-on-bad-exit): one such line, or two.
    errors = [line for line in lines if line.startswith("error: ")]
    assert errors and set(errors) == {
        f"error: the image's Python ({bare}/bin/python) lacks torch, numpy, pyyaml, tokenizers, pyarrow, tqdm, "
        f"tensorboard, py-spy, torchao (the project's dependencies, pyproject.toml): use an image that has them, or the "
        f"project's own image (code_from=image); code from {copy}"
    }, lines
    assert "Traceback" not in "\n".join(lines)


@pytest.fixture(scope="module")
def slurm_only_project(tmp_path_factory) -> Path:
    return render(tmp_path_factory.mktemp("no-slurm") / "p", project_name="No Slurm", platforms="[slurm]")


@pytest.mark.parametrize(
    "args, tool",
    [
        ([], "sbatch"),
        (["--action", "status", "--name", "any"], "squeue"),
        (["--action", "status", "--id", "12"], "scontrol"),
        (["--action", "logs", "--id", "12"], "scontrol"),
        (["--action", "cancel", "--id", "12"], "scancel"),
    ],
    ids=["submit", "status-by-name", "status", "logs", "cancel"],
)
def test_a_slurm_client_missing_from_path_is_one_line(slurm_only_project, tmp_path, args, tool):
    """A machine that is no Slurm login node: every verb names the missing tool, no traceback."""
    project = slurm_only_project
    tools = tmp_path / "python-only"
    tools.mkdir()
    (tools / "python").symlink_to(BIN / "python")
    env = {"HOME": str(tools), "PATH": str(tools), "PYTHONPATH": str(project / "src")}
    result = run(["python", "-m", slug_of(project), "launch", "slurm", *args], cwd=project, env=env)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1, result.stdout + result.stderr
    assert lines[0].startswith(f"error: {tool} is not on PATH") and "Traceback" not in result.stderr
