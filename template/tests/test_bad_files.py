"""Every file the project reads back, damaged every way a crash, an editor or another program damages
it, through the real command that reads it: one `error:` line naming the file (or, where the rest
of a file of records is still useful, one `warning:` line per damaged record and the command goes
on), no traceback, and no other file changed.

    python -m pytest -q tests/test_bad_files.py

Each command runs in a folder of its own holding a copy of config/ and launch/ (the project folder the command
finds), so the job records it reads are the test's, never the checkout's.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import PACKAGE, ROOT, Cli, subprocess_env

# What a record file or a JSON file may hold instead of what belongs there.
GARBAGE = b"\xc3" + random.Random(28).randbytes(300)  # starts with a UTF-8 lead byte and no follower
DAMAGED = {
    "cut short": b'{"platform": "devmachine", "id": "host:4',
    "random bytes": GARBAGE.replace(b"\n", b" "),  # one line
    "latin-1 text": '{"platform": "devmachine", "id": "caf\u00e9"}'.encode("latin-1"),
    "NUL bytes": '{"id": "x"}'.encode("utf-16-le"),
    "a JSON array": b"[1, 2, 3]",
    "a number": b"42",
    "a string": b'"text"',
    "null": b"null",
    "a mapping without its keys": b'{"unrelated": 1}',
    "a key of another type": b'{"platform": "devmachine", "id": 7, "command": "not a list"}',
    # what a platform keeps to find its job again (log paths, the run's folder), of another type
    "an extra field of another type": b'{"platform": "devmachine", "id": "h:5", "extra": {"output_dir": [1], '
    b'"stdout": 5, "max_steps": "ten"}}',
}
PLATFORMS = [p for p in ("devmachine", "slurm") if (ROOT / "launch" / p).is_dir()]


def tree_hashes(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def run_in(folder: Path, *args) -> subprocess.CompletedProcess:
    """`python -m <package> ARGS` with folder as the project folder (a copy of config/ and launch/)."""
    for part in ("config", "launch"):
        if not (folder / part).is_dir():
            shutil.copytree(ROOT / part, folder / part)
    command = Cli().command(*args)
    return subprocess.run(command, cwd=folder, env=subprocess_env(), capture_output=True, text=True, timeout=240)


def stderr_lines(proc) -> list[str]:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    return [line for line in proc.stderr.splitlines() if line.strip()]


def job(platform: str, job_id: str) -> bytes:
    return json.dumps({"platform": platform, "id": job_id, "name": "kept", "extra": {}}).encode()


@pytest.mark.parametrize("platform", [pytest.param(name, marks=pytest.mark.part(name)) for name in PLATFORMS])
@pytest.mark.parametrize("damage", DAMAGED)
def test_a_damaged_job_record_is_skipped_with_a_warning(tmp_path, platform, damage):
    records = tmp_path / ".jobs" / f"{platform}.jsonl"
    records.parent.mkdir()
    content = job(platform, "1001") + b"\n" + DAMAGED[damage] + b"\n" + b"\n"
    records.write_bytes(content)
    run_in(tmp_path, "--help")  # copies config/ before the tree is taken
    before = tree_hashes(tmp_path)
    proc = run_in(tmp_path, "launch", platform, "--action", "cancel", "--dry-run")
    lines = stderr_lines(proc)
    assert proc.returncode == 0, proc.stderr
    assert f"would cancel {platform} job 1001 (kept)" in proc.stdout
    assert len(lines) == 1 and lines[0].startswith(f"warning: {records}:2: "), proc.stderr
    assert tree_hashes(tmp_path) == before


@pytest.mark.parametrize("damage", DAMAGED)
def test_only_damaged_job_records_end_in_one_error_after_the_warning(tmp_path, damage):
    records = tmp_path / ".jobs" / "devmachine.jsonl"
    records.parent.mkdir()
    records.write_bytes(DAMAGED[damage])  # no newline at the end: a write cut short
    proc = run_in(tmp_path, "launch", "devmachine", "--action", "status")
    lines = stderr_lines(proc)
    assert proc.returncode == 1, proc.stderr
    assert [line.split(":")[0] for line in lines] == ["warning", "error"], proc.stderr
    assert f"{records}:1: " in lines[0] and str(records) in lines[1]
    assert records.read_bytes() == DAMAGED[damage]


def test_a_record_after_a_line_cut_short_starts_a_line_of_its_own(tmp_path):
    records = tmp_path / ".jobs" / "devmachine.jsonl"
    records.parent.mkdir()
    records.write_bytes(DAMAGED["cut short"])
    run_in(tmp_path, "--help")
    code = f"from {PACKAGE}.launch import jobs; jobs.record(jobs.new_job('devmachine', 'h:9'))"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=subprocess_env(), capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert records.read_bytes().split(b"\n")[0] == DAMAGED["cut short"]
    proc = run_in(tmp_path, "launch", "devmachine", "--action", "cancel", "--dry-run")
    assert "would cancel devmachine job h:9" in proc.stdout and len(stderr_lines(proc)) == 1


# config/train.yaml (and a --config file): another encoding, binary, another shape.
ORIGINAL_YAML = (ROOT / "config" / "train.yaml").read_text()
BAD_CONFIG = {
    "cut short in a list": (b"model:\n  arch: [gpt\n", ":3: not valid YAML"),
    "random bytes": (GARBAGE, ": byte 0x"),
    "latin-1 text": (("# caf\u00e9\n" + ORIGINAL_YAML).encode("latin-1"), ":1: byte 0xe9 is not UTF-8"),
    "utf-16 without a byte-order mark": (ORIGINAL_YAML.encode("utf-16-le"), ":1: holds NUL bytes"),
    "a list": (b"- 1\n- 2\n", "must hold a mapping"),
    "a number": (b"42\n", "must hold a mapping"),
    "a string": (b"just text\n", "must hold a mapping"),
    "a section that is a number": (b"model: 5\n", "must be a mapping"),
    "a section named by a number": (b"1: {}\n", "unknown section '1'"),
    "a key named by a number": (b"model:\n  1: 2\n", "unknown key 'model.1'"),
}


@pytest.mark.parametrize("damage", BAD_CONFIG)
def test_a_damaged_config_file_is_one_line_from_check(tmp_path, damage):
    content, words = BAD_CONFIG[damage]
    config = tmp_path / "mine.yaml"
    config.write_bytes(content)
    run_in(tmp_path, "--help")
    before = tree_hashes(tmp_path)
    proc = run_in(tmp_path, "check", "--config", config)
    lines = stderr_lines(proc)
    assert proc.returncode in (1, 2), proc.stdout + proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: ") and str(config) in lines[0], lines
    assert words in lines[0], (words, lines[0])
    assert tree_hashes(tmp_path) == before


def test_an_emptied_project_config_is_refused_and_an_empty_config_given_by_path_is_the_defaults(tmp_path):
    """config/train.yaml emptied (a slip, a failed write) would train on the code's defaults, another run
    than the one written for; an empty file passed with --config asks for exactly those."""
    run_in(tmp_path, "--help")
    own = tmp_path / "config" / "train.yaml"
    own.write_text("# nothing left\n")
    proc = run_in(tmp_path, "check")
    lines = stderr_lines(proc)
    assert proc.returncode == 1 and len(lines) == 1 and "holds no settings" in lines[0], proc.stdout + proc.stderr
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert run_in(tmp_path, "check", "--config", empty).returncode == 0


@pytest.mark.parametrize("encoding", ["utf-16", "utf-8-sig"])
def test_a_config_saved_with_a_byte_order_mark_is_read(tmp_path, encoding):
    config = tmp_path / "mine.yaml"
    config.write_bytes(ORIGINAL_YAML.encode(encoding))
    proc = run_in(tmp_path, "check", "--config", config)
    assert proc.returncode == 0, proc.stderr
    assert "config OK" in proc.stdout


# meta.json of prepared data, read by every command that trains or evaluates (here: launch, which
# refuses before torchrun starts).
BAD_META = {
    "empty": (b"", "(empty)"),
    "cut short": (b'{"dtype": "uint16", "voc', "(not readable JSON"),
    "random bytes": (GARBAGE, "is not UTF-8"),
    "a JSON array": (b"[]", "(not a JSON object)"),
    "a number": (b"3", "(not a JSON object)"),
    "without its keys": (b'{"dtype": "uint16"}', "(no vocab_size, tokenizer, train, val)"),
    "a dtype of floats": (
        b'{"dtype": "float32", "vocab_size": 9, "tokenizer": "tokenizer.json", "train": [], "val": []}',
        "dtype 'float32' is not an unsigned integer type",
    ),
    "a tokenizer that is no file name": (
        b'{"dtype": "uint16", "vocab_size": 9, "tokenizer": 5, "train": [], "val": []}',
        "tokenizer 5 is not a file name",
    ),
}


@pytest.mark.parametrize("damage", BAD_META)
def test_a_damaged_meta_json_is_one_line_from_launch(tmp_path, damage):
    content, words = BAD_META[damage]
    data = tmp_path / "data"
    data.mkdir()
    (data / "meta.json").write_bytes(content)
    run_in(tmp_path, "--help")
    before = tree_hashes(tmp_path)
    args = ["launch", "devmachine", "--nproc-per-node", 1, f"data.dir={data}", f"run.output_dir={tmp_path / 'run'}"]
    proc = run_in(tmp_path, *args)
    lines = stderr_lines(proc)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"error: {data / 'meta.json'} is damaged"), lines
    assert words in lines[0] and "prepare-data --force" in lines[0], lines[0]
    assert tree_hashes(tmp_path) == before


# A run's own files beside its checkpoints, damaged: the checkpoint manifest and the `latest` pointer
# (eval passes over the damaged checkpoint to the one before, or finds the newest on disk), and what
# an interrupted save and a killed run leave (the next start removes our temporaries, never a user's
# file, and treats a damaged run lock as released).
CKPT = Path("checkpoints")
MANIFEST_DAMAGE = ["cut short", "random bytes", "a JSON array", "a mapping without its keys", "a key of another type"]


def copy_of_run(run_2proc, tmp_path) -> Path:
    """run_2proc's checkpoints (10, 20, 30 with their manifests and `latest`) and metrics."""
    out = tmp_path / "run"
    shutil.copytree(run_2proc[0] / CKPT, out / CKPT)
    shutil.copy(run_2proc[0] / "metrics.jsonl", out / "metrics.jsonl")
    return out


def evaluated_step(cli, demo_data, out, tmp_path) -> tuple[int, str]:
    proc = cli("eval", f"data.dir={demo_data}", f"run.output_dir={out}", "run.device=cpu", "logging.eval_batches=1")
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    return json.loads((out / "eval.json").read_text())["step"], proc.stderr


@pytest.mark.parametrize("damage", MANIFEST_DAMAGE)
def test_a_damaged_checkpoint_manifest_is_passed_over(cli, run_2proc, demo_data, tmp_path, damage):
    out = copy_of_run(run_2proc, tmp_path)
    manifest = out / CKPT / "step_00000030.pt.json"
    manifest.write_bytes(DAMAGED[damage])
    step, stderr = evaluated_step(cli, demo_data, out, tmp_path)
    assert step == 20, stderr
    assert f"skipping damaged checkpoint {out / CKPT / 'step_00000030.pt'}" in stderr, stderr
    assert manifest.read_bytes() == DAMAGED[damage]  # reported, never rewritten


@pytest.mark.parametrize("pointer", [GARBAGE, b"step_00000099.pt", b"../../etc/passwd", b""], ids=str)
def test_a_damaged_latest_pointer_falls_back_to_the_newest_checkpoint_on_disk(
    cli, run_2proc, demo_data, tmp_path, pointer
):
    out = copy_of_run(run_2proc, tmp_path)
    (out / CKPT / "latest").write_bytes(pointer)
    step, _ = evaluated_step(cli, demo_data, out, tmp_path)
    assert step == 30


def test_the_next_start_removes_what_interrupted_writes_left_and_reads_a_damaged_lock_as_released(
    cli, run_2proc, demo_data, train_overrides, tmp_path
):
    out = copy_of_run(run_2proc, tmp_path)
    leftovers = [out / CKPT / ".step_00000040.pt.tmp-4242", out / CKPT / ".latest.tmp-4242", out / ".job.json.4242"]
    for path in leftovers:
        path.write_bytes(b"half a write")
    kept = [out / CKPT / ".notes.tmp-1", out / CKPT / "step_00000040.pt.tmp-4242"]  # not names we write
    for path in kept:
        path.write_bytes(b"the user's")
    (out / "run.lock").write_bytes(GARBAGE)
    (out / "job.json").write_bytes(GARBAGE[:40])  # the job that last trained here: unreadable = another job
    proc = cli("train", *train_overrides, f"data.dir={demo_data}", f"run.output_dir={out}", "checkpoint.reshard=true")
    assert "Traceback" not in proc.stdout + proc.stderr
    assert "removed 3 unfinished temporary file(s) of an interrupted write" in proc.stdout, proc.stdout
    assert "already trained to step 30" in proc.stdout and "its lock file is unreadable" in proc.stderr
    assert not any(path.exists() for path in leftovers)
    assert all(path.read_bytes() == b"the user's" for path in kept)


@pytest.mark.parametrize("damage", ["random bytes", "a JSON array", "a key of another type"])
def test_a_damaged_preemption_marker_or_metrics_line_is_passed_over_in_status(run_2proc, tmp_path, damage):
    out = copy_of_run(run_2proc, tmp_path)
    (out / "preempted.json").write_bytes(DAMAGED[damage])
    with open(out / "metrics.jsonl", "ab") as metrics:  # lines that are no metrics record: passed over
        metrics.write(DAMAGED[damage] + b"\n" + b'{"step": "x", "loss": []}\n' + DAMAGED["cut short"])
    records = tmp_path / ".jobs" / "devmachine.jsonl"
    records.parent.mkdir()
    record = {"platform": "devmachine", "id": "elsewhere:1", "name": "kept", "extra": {"output_dir": str(out)}}
    records.write_text(json.dumps(record) + "\n")
    proc = run_in(tmp_path, "launch", "devmachine", "--action", "status")
    lines = stderr_lines(proc)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "latest: step     30/" in proc.stdout, proc.stdout
    assert all(line.startswith("warning: ") for line in lines) and str(out / "preempted.json") in proc.stderr


# Launch files the user edits, damaged: read by the same reader (one line naming the file and line).
LAUNCH_FILES = {
    platform: path
    for platform, path in (("kubeflow", "launch/kubeflow/pytorchjob.yaml"), ("tione", "launch/tione/task.yaml"))
    if (ROOT / path).is_file()
}
YAML_DAMAGE = {
    "latin-1 text": ("name: caf\u00e9\n".encode("latin-1"), ":1: byte 0xe9 is not UTF-8"),
    "unparsable": (b"spec:\n  replicas: [1\n", "not valid YAML"),
    "binary": (GARBAGE, "is not UTF-8"),
}


if LAUNCH_FILES:  # a project with Kubeflow or TI-ONE launch files (the default has neither)

    @pytest.mark.parametrize("platform", [pytest.param(name, marks=pytest.mark.part(name)) for name in LAUNCH_FILES])
    @pytest.mark.parametrize("damage", YAML_DAMAGE)
    def test_a_damaged_launch_file_is_one_line_from_its_dry_run(tmp_path, platform, damage):
        content, words = YAML_DAMAGE[damage]
        run_in(tmp_path, "--help")
        path = tmp_path / LAUNCH_FILES[platform]
        path.write_bytes(content)
        before = tree_hashes(tmp_path)
        proc = run_in(tmp_path, "launch", platform, "--dry-run")
        lines = stderr_lines(proc)
        assert proc.returncode == 1, proc.stdout + proc.stderr
        assert len(lines) == 1 and lines[0].startswith(f"error: {path}") and words in lines[0], lines
        assert tree_hashes(tmp_path) == before


# A family folder a user added or edited (models/<name>/descriptor.py and the model it names), broken:
# named by its file, in one line, by the commands that need that family; the others go on, and a
# command that lists every family (sample's help) names it in one warning.
FORMULAS = """from dataclasses import dataclass

from ..family import Family


@dataclass(frozen=True)
class Mine(Family):
    def num_params(self, shape, vocab_size, sequence_len):
        return 12 * shape["n_layer"] * shape["n_embd"] ** 2 + 2 * vocab_size * shape["n_embd"]

    def flops_per_token(self, shape, vocab_size, sequence_len):
        return 6 * self.num_params(shape, vocab_size, sequence_len)

    def layer_activations(self, shape, seq, micro, tp, mode, scores_stored):
        return 34 * seq * micro * shape["n_embd"]
"""
TINY = '{"tiny": {"n_layer": 2, "n_embd": 64, "n_head": 4}}'
DESCRIPTOR = FORMULAS + f'\n\nFAMILY = Mine(name="mine", summary="mine", builder="model:build", sizes={TINY})\n'
FAMILY_LINE = DESCRIPTOR.splitlines().index(DESCRIPTOR.splitlines()[-1]) + 1
BROKEN_DESCRIPTORS = {
    "a syntax error": ('FAMILY = Family(name="mine"\n', "line 1: SyntaxError: '(' was never closed"),
    "an import error": (
        "import a_module_nobody_has\nFAMILY = 1\n",
        "line 1: ModuleNotFoundError: No module named 'a_module_nobody_has'",
    ),
    "an error as it runs": (
        DESCRIPTOR.replace('name="mine"', "name=mine"),
        f"line {FAMILY_LINE}: NameError: name 'mine' is not defined",
    ),
    "FAMILY of another type": ('FAMILY = {"name": "mine"}\n', "FAMILY is dict, not a Family"),
    "named otherwise than its folder": (
        DESCRIPTOR.replace('name="mine"', 'name="yours"'),
        "FAMILY.name 'yours' is not its folder's name 'mine'",
    ),
    "a field of another type": (
        DESCRIPTOR.replace("sizes=", 'sample_top_k="5", sizes='),
        "FAMILY.sample_top_k='5' is not a whole number",
    ),
    "sizes of another shape": (DESCRIPTOR.replace(TINY, '["tiny"]'), "FAMILY.sizes=['tiny'] is not of the type dict"),
    "a size without its heads": (
        DESCRIPTOR.replace(', "n_head": 4', ""),
        "FAMILY.sizes['tiny'] needs n_layer, n_embd, n_head as whole numbers",
    ),
    "a recipe without its learning rate": (
        DESCRIPTOR.replace(
            "sizes=", 'recipe_defaults={"global_batch": 8, "micro_batch": 4, "sequence_len": 64}, sizes='
        ),
        "FAMILY.recipe_defaults lacks lr",
    ),
    "a tokenizer of its own kind without its trainer": (
        DESCRIPTOR.replace("sizes=", 'tokenizer="wordpiece", sizes='),
        "FAMILY.tokenizer='wordpiece' is its own kind: name its tokenizer_trainer",
    ),
    "a formula left out": (
        DESCRIPTOR.replace("= Mine(", "= Family("),
        "FAMILY's class defines no num_params(...) of its own",
    ),
}


def project_with_family(folder: Path, descriptor: str, model: str | None = None) -> Path:
    """A copy of the project (its source, config/ and launch/) in folder with a family folder
    models/mine holding `descriptor` (and model.py, if given); the descriptor's path."""
    shutil.copytree(ROOT / "src", folder / "src", ignore=shutil.ignore_patterns("__pycache__"))
    mine = folder / "src" / PACKAGE / "models" / "mine"
    mine.mkdir()
    (mine / "__init__.py").write_text("")
    (mine / "descriptor.py").write_text(descriptor)
    if model is not None:
        (mine / "model.py").write_text(model)
    run_in(folder, "--help")  # config/ and launch/
    return mine / "descriptor.py"


def run_copy(folder: Path, *args) -> subprocess.CompletedProcess:
    """`python -m <package> ARGS` of the copy in folder (nothing of it compiled to __pycache__)."""
    env = subprocess_env({"PYTHONPATH": str(folder / "src"), "PYTHONDONTWRITEBYTECODE": "1"})
    return subprocess.run(Cli().command(*args), cwd=folder, env=env, capture_output=True, text=True, timeout=240)


@pytest.mark.parametrize("damage", BROKEN_DESCRIPTORS)
def test_a_family_folder_that_cannot_be_loaded_is_named_and_stops_only_its_own_commands(tmp_path, damage):
    text, words = BROKEN_DESCRIPTORS[damage]
    descriptor = project_with_family(tmp_path, text)
    before = tree_hashes(tmp_path)
    said = f"{descriptor} cannot be loaded: {words}"

    proc = run_copy(tmp_path, "plan", "model.arch=mine", "model.size=tiny")  # the family's own command
    lines = stderr_lines(proc)
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith(f"error: {said}"), lines

    proc = run_copy(tmp_path, "check")  # the project's family: not touched by the broken folder
    assert proc.returncode == 0 and not stderr_lines(proc) and "config OK" in proc.stdout, proc.stdout + proc.stderr

    proc = run_copy(tmp_path, "sample", "--help")  # every family's top-k: the broken one left out, named
    lines = stderr_lines(proc)
    assert proc.returncode == 0 and "--top-k" in proc.stdout, proc.stdout + proc.stderr
    assert len(lines) == 1 and lines[0].startswith(f"warning: {said}") and "family mine left out" in lines[0], lines
    assert tree_hashes(tmp_path) == before


@pytest.mark.parametrize(
    "model, words",
    [
        (None, "model.py does not exist (the descriptor names 'model:build')"),
        (
            "def build(cfg, vocab_size, load_weights=True):\n    return (\n",
            "model.py cannot be imported: line 2: Syntax",
        ),
        ("def make(cfg, vocab_size, load_weights=True):\n    pass\n", "model.py has no function build"),
    ],
)
def test_a_family_whose_model_cannot_be_built_is_one_line_from_train(
    tmp_path, demo_data, train_overrides, model, words
):
    """The model the descriptor names, missing or broken: `train` refuses in one line before it writes anything."""
    project_with_family(tmp_path, DESCRIPTOR, model)
    before = tree_hashes(tmp_path)
    out = tmp_path / "run"
    args = [*train_overrides, f"data.dir={demo_data}", f"run.output_dir={out}", "model.arch=mine", "model.size=tiny"]
    proc = run_copy(tmp_path, "train", *args)
    lines = stderr_lines(proc)
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("error: model.arch=mine: "), lines
    assert words in lines[0], lines[0]
    assert tree_hashes(tmp_path) == before and not out.exists()


@pytest.mark.parametrize(
    "platform, damage, words",
    [
        pytest.param("slurm", "\ndef broken(:\n", "SyntaxError: invalid syntax", marks=pytest.mark.part("slurm")),
        pytest.param(
            "devmachine",
            "\nimport a_module_nobody_has\n",
            "ModuleNotFoundError: No module named 'a_module_nobody_has'",
            marks=pytest.mark.part("devmachine"),
        ),
    ],
)
def test_a_platform_module_that_cannot_be_loaded_stops_only_its_own_launch(tmp_path, platform, damage, words):
    """launch/<platform>/platform.py as an edit left it: `launch <platform>` says so in one line naming
    the file and the line; the other platforms' launches, and every other command, go on."""
    project_with_family(tmp_path, DESCRIPTOR)  # a copy of the project (its families intact)
    folder = tmp_path / "src" / PACKAGE / "launch" / platform
    path = folder / "platform.py"
    path.write_text(path.read_text() + damage)
    line = path.read_text().count("\n")
    before = tree_hashes(tmp_path)
    name = platform
    proc = run_copy(tmp_path, "launch", name, "--dry-run")
    lines = stderr_lines(proc)
    assert proc.returncode == 1 and len(lines) == 1, proc.stdout + proc.stderr
    assert lines[0] == f"error: {path} cannot be loaded: line {line}: {words}; fix it", lines[0]
    other = "slurm" if name == "devmachine" else "devmachine"
    proc = run_copy(tmp_path, "launch", other, "--dry-run")  # runs, or says the project has no launch files for it
    assert proc.returncode in (0, 1) and "cannot be loaded" not in proc.stdout + proc.stderr, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert run_copy(tmp_path, "check").returncode == 0
    assert tree_hashes(tmp_path) == before
