"""Every bad input is refused in one line that names it and the fix, through the real command line:
config values out of range (bounds.py), command-line numbers (argparse types), platform variables
(topology.py), sample's options, and the mistakes torchrun would otherwise restart into.

    python -m pytest -q tests/test_bad_input.py        # about a minute; the torchrun cases train first

Each case asserts the exit code, exactly one non-empty line on stderr (`error: ...`) holding the
words that name the input and the fix, and no traceback anywhere in the output.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import sys
import time
import typing
from pathlib import Path

import pytest
import torch
from conftest import by_platform, subprocess_env

# --- config values: bounds.py, checked by cli.py before any command computes with them ----------
CONFIG = {
    "check cluster.nodes=0": (["check", "cluster.nodes=0"], ["cluster.nodes=0", "at least 1", "e.g. cluster.nodes=1"]),
    "plan cluster.nodes=0": (["plan", "cluster.nodes=0"], ["cluster.nodes=0", "at least 1"]),
    "plan cluster.gpus_per_node=0": (["plan", "cluster.gpus_per_node=0"], ["cluster.gpus_per_node=0", "at least 1"]),
    "plan micro batch 0": (["plan", "batch.micro_batch_size=0"], ["batch.micro_batch_size=0", "at least 1"]),
    "plan global batch -8": (["plan", "batch.global_batch_size=-8"], ["batch.global_batch_size=-8", "at least 1"]),
    "plan max_steps -1": (["plan", "schedule.max_steps=-1"], ["schedule.max_steps=-1", "at least 1"]),
    "plan n_kv_head 0": (["plan", "model.n_kv_head=0"], ["model.n_kv_head=0", "at least 1", "e.g. null"]),
    "plan sequence_len 0": (["plan", "model.sequence_len=0"], ["model.sequence_len=0", "at least 1"]),
    "check parallel.tensor=0": (["check", "parallel.tensor=0"], ["parallel.tensor=0", "at least 1"]),
    "check parallel.pipeline=-2": (["check", "parallel.pipeline=-2"], ["parallel.pipeline=-2", "at least 1"]),
    "check grad_accum_steps 0": (["check", "batch.grad_accum_steps=0"], ["batch.grad_accum_steps=0", "e.g. null"]),
    "check lr nan": (["check", "optim.lr=nan"], ["optim.lr=nan", "at least 0"]),
    "check lr inf": (["check", "optim.lr=inf"], ["optim.lr=inf"]),
    "check beta2 1": (["check", "optim.beta2=1"], ["optim.beta2=1", "below 1", "e.g. optim.beta2=0.95"]),
    "check val_fraction 0": (["check", "data.val_fraction=0"], ["data.val_fraction=0", "above 0 and below 1"]),
    "check min_lr_ratio 2": (["check", "schedule.min_lr_ratio=2"], ["schedule.min_lr_ratio=2", "at most 1"]),
    "check timeout 0": (["check", "run.collective_timeout_minutes=0"], ["run.collective_timeout_minutes=0", "above 0"]),
    "check seed -1": (["check", "run.seed=-1"], ["run.seed=-1", "at least 0"]),
    # Waits past what threading.Timer or signal.alarm take: the watchdog's thread died of the overflow
    # and the run went on without it.
    "train first-step timeout of a year": (
        ["train", "run.first_step_timeout_minutes=525600"],
        ["run.first_step_timeout_minutes=525600", "at most 10080 (a week; 0 turns the watchdog off)"],
    ),
    "check collective timeout 1e9": (
        ["check", "run.collective_timeout_minutes=1e9"],
        ["run.collective_timeout_minutes=1000000000", "at most 10080 (a week)"],
    ),
    "launch stop grace of a year": (
        ["launch", "devmachine", "--dry-run", "cluster.stop_grace_seconds=31536000"],
        ["cluster.stop_grace_seconds=31536000", "at most 86400 (a day)"],
    ),
    "check two at once": (
        ["check", "cluster.nodes=0", "logging.every_steps=0"],
        ["cluster.nodes=0", "logging.every_steps=0"],
    ),
    "launch max_restarts -1": (
        ["launch", "devmachine", "--dry-run", "cluster.max_restarts=-1"],
        ["cluster.max_restarts=-1", "at least 0"],
    ),
    "launch keep_last 0": (
        ["launch", "devmachine", "--dry-run", "checkpoint.keep_last=0"],
        ["checkpoint.keep_last=0", "at least 1"],
    ),
    "eval eval_batches 0": (["eval", "logging.eval_batches=0"], ["logging.eval_batches=0", "at least 1"]),
}

# --- command-line numbers: argparse types (exit 2, argparse's code for a usage mistake) ----------
OPTIONS = {
    "--nnodes 0": (["launch", "devmachine", "--dry-run", "--nnodes", "0"], ["--nnodes", "at least 1", "'0'"]),
    "--nnodes -1": (["launch", "devmachine", "--dry-run", "--nnodes", "-1"], ["--nnodes", "at least 1"]),
    "--nnodes two": (["launch", "devmachine", "--dry-run", "--nnodes", "two"], ["--nnodes", "'two'"]),
    "--nproc-per-node 0": (["launch", "devmachine", "--dry-run", "--nproc-per-node", "0"], ["--nproc-per-node"]),
    "--node-rank -1": (["launch", "devmachine", "--dry-run", "--node-rank", "-1"], ["--node-rank", "at least 0"]),
    "--master-port -1": (["launch", "devmachine", "--dry-run", "--master-port", "-1"], ["--master-port", "1-65535"]),
    "--master-port 70000": (["launch", "devmachine", "--dry-run", "--master-port", "70000"], ["--master-port"]),
    "--wait-timeout 0": (["launch", "devmachine", "--dry-run", "--wait-timeout", "0"], ["--wait-timeout", "above 0"]),
    "logs --rank -1": (["launch", "devmachine", "--action", "logs", "--rank", "-1"], ["--rank", "at least 0"]),
    "check --world-size 0": (["check", "--world-size", "0"], ["--world-size", "at least 1"]),
    "plan --tokens 0": (["plan", "--tokens", "0"], ["--tokens", "above 0"]),
    "node --wait-timeout -5": (["node", "--dry-run", "--wait-timeout", "-5"], ["--wait-timeout", "above 0"]),
    "eval --batches 0": (["eval", "--batches", "0"], ["--batches", "at least 1"]),
    "ray-train --num-nodes 0": (["ray-train", "--dry-run", "--num-nodes", "0"], ["--num-nodes", "at least 1"]),
    "doctor --iters 0": (["doctor", "--iters", "0"], ["--iters", "at least 1"]),
    "prepare-data --workers 0": (["prepare-data", "--workers", "0"], ["--workers", "at least 1", "'0'"]),
    "prepare-data --part-mb 0.001": (["prepare-data", "--part-mb", "0.001"], ["--part-mb", "at least 0.01", "'0.001'"]),
    "sample --top-k -5": (["sample", "--top-k", "-5"], ["--top-k", "at least 0", "'-5'"]),
    "sample --max-new-tokens 0": (["sample", "--max-new-tokens", "0"], ["--max-new-tokens", "at least 1"]),
    "sample --max-new-tokens -3": (["sample", "--max-new-tokens", "-3"], ["--max-new-tokens", "at least 1"]),
    "sample --temperature -1": (["sample", "--temperature", "-1"], ["--temperature", "at least 0"]),
    "sample --temperature nan": (["sample", "--temperature", "nan"], ["--temperature", "'nan'"]),
    "sample --seed -1": (["sample", "--seed", "-1"], ["--seed", "at least 0"]),
}

# --- platform variables: `node --dry-run` reads them (topology.py) --------------------------------
TIONE_DDP = {"GPU_NUM_PER_NODE": "1", "WORLD_SIZE": "2", "RANK": "0", "MASTER_ADDR": "10.0.0.1"}
KUBEFLOW = {"PET_NNODES": "2", "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "job-master-0"}
OPENMPI = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1"}
SLURM = {"SLURM_JOB_ID": "42", "SLURM_NNODES": "2", "SLURM_JOB_NODELIST": "node[1-2]"}
VARIABLES = {
    "GPU_NUM_PER_NODE=0": ({**TIONE_DDP, "GPU_NUM_PER_NODE": "0"}, ["GPU_NUM_PER_NODE='0'", "at least 1"]),
    "GPU_NUM_PER_NODE=x": ({**TIONE_DDP, "GPU_NUM_PER_NODE": "x"}, ["GPU_NUM_PER_NODE='x'", "whole number"]),
    "tione WORLD_SIZE=0": ({**TIONE_DDP, "WORLD_SIZE": "0"}, ["WORLD_SIZE='0'", "at least 1"]),
    "tione RANK=2 of 2": ({**TIONE_DDP, "RANK": "2"}, ["RANK=2", "0..1", "WORLD_SIZE=2"]),
    "tione MASTER_PORT=-5": ({**TIONE_DDP, "MASTER_PORT": "-5"}, ["MASTER_PORT='-5'", "1-65535"]),
    "PET_NNODES=0": ({**KUBEFLOW, "PET_NNODES": "0"}, ["PET_NNODES='0'", "between 1 and the maximum"]),
    "PET_NPROC_PER_NODE=0": ({**KUBEFLOW, "PET_NPROC_PER_NODE": "0"}, ["PET_NPROC_PER_NODE='0'", "at least 1"]),
    "PET_NODE_RANK=-1": ({**KUBEFLOW, "PET_NODE_RANK": "-1"}, ["PET_NODE_RANK='-1'", "at least 0"]),
    "PET_NODE_RANK=2 of 2": ({**KUBEFLOW, "PET_NODE_RANK": "2"}, ["PET_NODE_RANK=2", "PET_NNODES=2"]),
    "PET_MASTER_PORT=http": ({**KUBEFLOW, "PET_MASTER_PORT": "http"}, ["PET_MASTER_PORT='http'", "1-65535"]),
    "PET_MAX_RESTARTS=-1": ({**KUBEFLOW, "PET_MAX_RESTARTS": "-1"}, ["PET_MAX_RESTARTS='-1'"]),
    "SLURM_NNODES=0": ({**SLURM, "SLURM_NNODES": "0"}, ["SLURM_NNODES='0'", "at least 1"]),
    "SLURM_NNODES=abc": ({**SLURM, "SLURM_NNODES": "abc"}, ["SLURM_NNODES='abc'"]),
    "SLURM_NODEID=-1": ({**SLURM, "SLURM_NODEID": "-1"}, ["SLURM_NODEID='-1'"]),
    "SLURM_NODEID=5 of 2": ({**SLURM, "SLURM_NODEID": "5"}, ["SLURM_NODEID=5", "SLURM_NNODES=2"]),
    "OMPI_COMM_WORLD_SIZE=0": ({**OPENMPI, "OMPI_COMM_WORLD_SIZE": "0"}, ["OMPI_COMM_WORLD_SIZE='0'"]),
    "OMPI local size 0": ({**OPENMPI, "OMPI_COMM_WORLD_LOCAL_SIZE": "0"}, ["OMPI_COMM_WORLD_LOCAL_SIZE='0'"]),
    "OMPI local rank x": ({**OPENMPI, "OMPI_COMM_WORLD_LOCAL_RANK": "x"}, ["OMPI_COMM_WORLD_LOCAL_RANK='x'"]),
    "NODE_IP_SLOT_LIST slots 0": ({"NODE_IP_SLOT_LIST": "10.0.0.1:0"}, ["NODE_IP_SLOT_LIST", "slots at least 1"]),
    "HEAD_PORT=-1": ({"HEAD_ADDR": "10.0.0.1", "HEAD_PORT": "-1"}, ["HEAD_PORT='-1'", "1-65535"]),
}
PLATFORM_PREFIXES = ("PET_", "SLURM_", "OMPI_", "PMIX_", "TORCHELASTIC_")
PLATFORM_NAMES = {"MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "GPU_NUM_PER_NODE", "GPU_NUM"}
PLATFORM_NAMES |= {"NODE_IP_SLOT_LIST", "HEAD_ADDR", "HEAD_PORT", "TF_CONFIG", "INDEX", "NODE_LIST"}


def only(variables: dict) -> dict:
    """The runner's environment without any platform's variables, plus these (SLURM_CONF, where
    scontrol finds the cluster, is the machine's, not the job's)."""
    cleared = {k: None for k in os.environ if k.startswith(PLATFORM_PREFIXES) or k in PLATFORM_NAMES}
    cleared.pop("SLURM_CONF", None)
    return {**cleared, "OMPI_MCA_orte_default_hostfile": None, **variables}


def assert_one_line(proc, words: list[str]) -> str:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])
    return lines[0]


def test_every_number_in_the_config_has_a_range(pkg):
    """A new numeric setting gets its range in bounds.py (deepspeed.zero_stage has its choices)."""
    cfg = pkg.config.Config()
    numbers = set()
    for section in dataclasses.fields(cfg):
        hints = typing.get_type_hints(type(getattr(cfg, section.name)))
        for setting in dataclasses.fields(getattr(cfg, section.name)):
            types = set(typing.get_args(hints[setting.name])) or {hints[setting.name]}
            if types & {int, float}:
                numbers.add(f"{section.name}.{setting.name}")
    assert numbers - {"deepspeed.zero_stage"} == set(pkg.bounds.BOUNDS)


def test_the_longest_waits_allowed_are_waits_their_takers_accept(pkg):
    """The first-step watchdog's threading.Timer takes run.first_step_timeout_minutes (past
    threading.TIMEOUT_MAX its thread died of an OverflowError and the run went on unwatched), and
    preemption's signal.alarm takes cluster.stop_grace_seconds."""
    import signal
    import threading

    bounds = pkg.bounds.BOUNDS
    for key in ("run.first_step_timeout_minutes", "run.collective_timeout_minutes", "run.debug_timeout_minutes"):
        assert bounds[key].high * 60 <= threading.TIMEOUT_MAX, key
    assert signal.alarm(int(bounds["cluster.stop_grace_seconds"].high)) == 0
    assert signal.alarm(0) > 0  # it was armed, and is no more


@pytest.mark.parametrize("name", CONFIG)
def test_config_value_out_of_range(cli, name):
    args, words = CONFIG[name]
    assert_one_line(cli(*args, expect=1, timeout=120), words)


def command_parts(argv: list[str]) -> list[str]:
    """The platform a command belongs to: `launch <platform>`, TI-ONE's `ray-train`."""
    return argv[1:2] if argv[0] == "launch" else ["tione"] if argv[0] == "ray-train" else []


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=[pytest.mark.part(*p)] if (p := command_parts(OPTIONS[name][0])) else [])
        for name in OPTIONS
    ],
)
def test_command_line_number_out_of_range(cli, name):
    args, words = OPTIONS[name]
    line = assert_one_line(cli(*args, expect=2, timeout=120), words)
    assert "--help" in line  # where the usage is, instead of printing it


@pytest.mark.parametrize("name", by_platform(VARIABLES))
def test_platform_variable_out_of_range(cli, name):
    variables, words = VARIABLES[name]
    proc = cli("node", "--dry-run", env=only(variables), expect=1, timeout=120)
    assert "the platform sets it" in assert_one_line(proc, words)  # so the fix is in the job's settings
    assert "$ " not in proc.stdout


@pytest.mark.part("tione")
@pytest.mark.parametrize("variable, value", [("RAY_NUM_NODES", "0"), ("RAY_NUM_WORKERS", "x")])
def test_ray_counts_from_the_environment(cli, variable, value):
    proc = cli("ray-train", "--dry-run", env={variable: value}, expect=1)
    assert_one_line(proc, [f"{variable}={value!r}", "at least 1", "unset it"])


def test_node_rank_past_the_nodes_and_a_rank_variable_that_is_no_number(cli):
    proc = cli("launch", "devmachine", "--dry-run", "--nnodes", 2, "--node-rank", 2, "--master-addr", "h", expect=1)
    assert_one_line(proc, ["--node-rank 2", "between 0 and 1"])
    # `train` started by hand with a broken RANK: refused before any process group is made
    proc = cli("train", env=only({"RANK": "x", "LOCAL_RANK": "0", "WORLD_SIZE": "2"}), expect=1, timeout=120)
    assert_one_line(proc, ["RANK='x'", "whole number"])


@pytest.mark.parametrize("command", [["check"], ["plan"], ["launch", "devmachine", "--dry-run"]], ids=" ".join)
def test_output_whose_reader_has_gone_ends_quietly(cli, command):
    """`<package> plan | head -1`: the reader closes the pipe while the command still writes. The
    command ends as a tool that SIGPIPE ended (exit 141), without a BrokenPipeError traceback."""
    import subprocess

    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line is written
    try:
        run = {"cwd": cli.root, "env": subprocess_env(), "stderr": subprocess.PIPE, "text": True, "timeout": 240}
        proc = subprocess.run(cli.command(*command), stdout=write, **run)
    finally:
        os.close(write)
    assert proc.returncode == 128 + 13 and proc.stderr == "", (proc.returncode, proc.stderr)


# --- what torchrun would restart into: found before it starts, or ended at once -------------------


def tree_hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


DAMAGED_META = {
    "meta.json cut short": '{"dtype": "uint16", "vocab_si',
    "meta.json not an object": "[]",
    "meta.json without shards": '{"dtype": "uint16", "vocab_size": 512, "tokenizer": "tokenizer.json"}',
    "meta.json with a bad dtype": '{"dtype": "int3", "vocab_size": 512, "tokenizer": "t", "train": [], "val": []}',
}


@pytest.fixture
def broken_data(demo_data, tmp_path):
    """Copies of the demo data, each broken in one way."""

    def _broken(how: str) -> Path:
        data = tmp_path / how
        shutil.copytree(demo_data, data)
        if how == "no tokenizer":
            (data / "tokenizer.json").unlink()
        elif how == "no shard":
            sorted(data.glob("train_*.bin"))[0].unlink()
        elif how in DAMAGED_META:
            (data / "meta.json").write_text(DAMAGED_META[how])
        return data

    return _broken


@pytest.mark.parametrize(
    "how, overrides, words",
    [
        ("no tokenizer", [], ["tokenizer.json not found", "prepare-data"]),
        ("no shard", [], ["train_00000.bin", "missing", "run prepare-data again"]),
        ("meta.json cut short", [], ["meta.json is damaged (not readable JSON", "prepare-data --force"]),
        ("meta.json not an object", [], ["meta.json is damaged (not a JSON object)", "prepare-data --force"]),
        ("meta.json without shards", [], ["meta.json is damaged (no train, val)", "prepare-data --force"]),
        ("meta.json with a bad dtype", [], ["dtype 'int3' is not a NumPy dtype", "prepare-data --force"]),
        ("intact", ["model.sequence_len=100000"], ["fewer than 100001 tokens", "model.sequence_len"]),
        ("intact", ["schedule.warmup_steps=50", "schedule.max_steps=10"], ["schedule.warmup_steps=50"]),
    ],
)
def test_mistakes_every_rank_would_meet_are_found_before_torchrun(
    cli, train_overrides, broken_data, tmp_path, how, overrides, words
):
    data = broken_data(how)
    before = tree_hashes(data)
    args = ["launch", "devmachine", "--nproc-per-node", 2, *train_overrides, f"data.dir={data}"]
    proc = cli(*args, f"run.output_dir={tmp_path / 'run'}", "cluster.max_restarts=3", *overrides, expect=1)
    assert_one_line(proc, words)
    assert not (tmp_path / "run" / "logs").exists()  # torchrun never started
    assert tree_hashes(data) == before
    # A refused launch is no job: no record names its run (the suite's other launches add theirs meanwhile).
    records = cli.root / ".jobs" / "devmachine.jsonl"
    lines = records.read_text().splitlines() if records.exists() else []
    assert not [line for line in lines if f'"output_dir": "{tmp_path / "run"}"' in line], lines[-3:]


@pytest.mark.parametrize("command", [["eval"], ["sample", "--prompt", "a"], ["prepare-data"]])
def test_a_damaged_meta_json_is_one_line_for_every_command(cli, run_2proc, broken_data, train_overrides, command):
    data = broken_data("meta.json cut short")
    before = tree_hashes(data)
    overrides = [f"data.dir={data}", f"run.output_dir={run_2proc[0]}"]
    if command == ["prepare-data"]:  # replacing it is what --force is for; unasked, it stays
        proc = cli("prepare-data", *overrides, expect=1)
        assert_one_line(proc, ["already holds prepared data (fingerprint unreadable)", "--force"])
    else:
        proc = cli(*command, *train_overrides, *overrides, expect=1)
        assert_one_line(proc, [f"{data / 'meta.json'} is damaged", "prepare-data --force"])
    assert tree_hashes(data) == before


def test_a_mistake_met_in_the_ranks_ends_the_job_at_once(cli, run_2proc, demo_data, train_overrides, tmp_path):
    """A checkpoint of another model is found by the ranks when they resume. Under
    cluster.max_restarts=3 torchrun would restart them into it three times; instead the job ends
    at the first attempt with the message printed once, and the checkpoints stay as they were."""
    out = tmp_path / "run"
    shutil.copytree(run_2proc[0], out)
    before = tree_hashes(out / "checkpoints")
    start = time.monotonic()
    proc = cli(
        "launch",
        "devmachine",
        "--nproc-per-node",
        2,
        *train_overrides,
        f"data.dir={demo_data}",
        f"run.output_dir={out}",
        "cluster.max_restarts=3",
        "schedule.max_steps=40",
        "model.sequence_len=32",  # another model than the checkpoint's
        expect=1,
        timeout=180,
    )
    elapsed = time.monotonic() - start
    # The way out is a folder of its own (checkpoint.resume=false would not start over on this one).
    line = assert_one_line(proc, ["step_00000030.pt", "different model", f"run.output_dir={out}-2"])
    assert (proc.stdout + proc.stderr).count(line.removeprefix("error: ")) == 1
    assert elapsed < 90, elapsed  # one attempt (restarts would each import torch and load again)
    attempts = {p.name for p in (out / "logs").rglob("attempt_*")}
    assert attempts == {"attempt_0"}, attempts
    assert tree_hashes(out / "checkpoints") == before


RANK_PROGRAM = """
import os, sys, time
sys.path.insert(0, {src!r})
from {package}.runtime.unrecoverable import hand_over
if os.environ["RANK"] == "1":
    hand_over("data.dir: only rank 1 found this mistake")
    sys.exit(0)
open({pid_file!r}, "w").write(str(os.getpid()))
time.sleep(600)  # rank 0 waits, as in a collective, for a rank that is gone
"""


def test_a_rank_left_waiting_is_stopped(pkg, cli, tmp_path):
    """When only one rank meets the mistake the others would wait in their next collective: the
    supervisor gives torchrun FAILURE_GRACE_SECONDS to end, then stops it and the waiting rank."""
    program = tmp_path / "rank.py"
    pid_file = tmp_path / "rank0.pid"
    program.write_text(RANK_PROGRAM.format(src=str(cli.root / "src"), package=pkg.name, pid_file=str(pid_file)))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["--max-restarts", "3", "--shutdown-timeout", "5", str(program)]
    start = time.monotonic()
    with pytest.raises(pkg.config.ConfigError) as err:
        pkg.supervise.run_supervised(cmd, str(tmp_path), forward_signals=True)
    assert str(err.value) == "data.dir: only rank 1 found this mistake"
    assert time.monotonic() - start < pkg.supervise.FAILURE_GRACE_SECONDS + 60
    waiting = int(pid_file.read_text())
    assert not Path(f"/proc/{waiting}").exists() or "zombie" in Path(f"/proc/{waiting}/status").read_text()


# --- sample: options, prompts, and generation past the context -------------------------------------


def test_sample_past_the_context_slides_and_repeats(pkg, cli, run_2proc, demo_data):
    """sequence_len 64: a prompt of about 150 tokens and 100 new ones. The prompt is read from its
    end and the generation slides over the context; the same seed gives the same text."""
    out, _ = run_2proc
    prompt = "Return the list of values in the given order. " * 15
    where = [f"data.dir={demo_data}", f"run.output_dir={out}", "run.device=cpu"]
    args = ["sample", "--prompt", prompt, "--max-new-tokens", 100, "--temperature", 1, "--top-k", 50, "--seed", 5]
    args += where
    first, again = cli(*args), cli(*args)
    assert "note: the prompt is" in first.stdout and "reads its last 64 (model.sequence_len)" in first.stdout
    assert first.stdout == again.stdout and "Traceback" not in first.stderr
    empty = cli("sample", "--prompt", "", "--max-new-tokens", 100, "--temperature", 0, *where)
    assert "--- ''" in empty.stdout and "each new one is read from the last 64" in empty.stdout
    cfg = pkg.config.load_config(None, where)
    model, _, _, _ = pkg.trained_model.load_trained_model(cfg, None, torch.device("cpu"))
    tok = pkg.tokens.load_tokenizer(demo_data / "tokenizer.json")
    ids = [pkg.tokens.bos_id(tok), *tok.encode(prompt, add_special_tokens=False).ids]
    assert len(ids) > 64
    generator = torch.Generator().manual_seed(5)
    new = model.eval().generate(ids, 100, temperature=1.0, top_k=50, generator=generator)
    assert len(new) == 100
    assert f"--- {prompt!r}\n{prompt + tok.decode(new)}\n" in first.stdout
