"""Nothing a user does by mistake with the data loses a run: prepare-data refuses unusable inputs
and never replaces prepared data unasked, and a run refuses data other than the data it was
trained on. Every case runs the real command line and checks that the files it must not touch
(the data folder, the run folder) are byte-identical afterwards.

    python -m pytest -q tests/test_data_safety.py
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest
import torch

# The shared suite's family (conftest TINY_MODEL), whatever the project's: a BPE tokenizer.
FAMILY = ["model.arch=gpt", "model.pretrained="]
PREPARE = [*FAMILY, "data.raw=", "data.tokenizer=", "data.vocab_size=300", "model.sequence_len=64"]


def snapshot(folder: Path) -> dict[str, str]:
    """Every file (its SHA-256) and folder under folder, by relative path."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "folder"
        for p in sorted(folder.rglob("*"))
    }


def documents(n: int) -> list[str]:
    words = ["data", "model", "token", "shard", "batch", "rank", "node", "step", "loss", "grad"]
    return [f"document {i}: " + " ".join(words[(i * 7 + j * 3) % 10] for j in range(30)) + "." for i in range(n)]


def parquet(path: Path, **columns) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table(columns), path)
    return path


def truncated_parquet(path: Path) -> None:
    whole = parquet(path.with_name("whole.parquet"), text=documents(200)).read_bytes()
    path.with_name("whole.parquet").unlink()
    path.write_bytes(whole[: len(whole) // 2])


def jsonl(path: Path, texts) -> int:
    return path.write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))


# name -> (writes the inputs into raw/, extra overrides, what the one-line message must hold)
UNUSABLE = {
    "binary file": (
        lambda raw: (raw / "a.txt").write_bytes(bytes(range(256)) * 40),
        [],
        ["a.txt", "NUL bytes", "convert it to UTF-8"],
    ),
    "not UTF-8": (
        lambda raw: (raw / "a.txt").write_bytes("café au lait ".encode("latin-1") * 50),
        [],
        ["a.txt", "byte 3 is not UTF-8", "convert it to UTF-8"],
    ),
    "empty file": (lambda raw: (raw / "a.jsonl").write_text(""), [], ["a.jsonl", "is empty", "data.raw"]),
    "only empty documents": (  # packed into one part with a file that has text: still named
        lambda raw: (raw / "a.jsonl").write_text('\n{"text": ""}\n\n') + jsonl(raw / "b.jsonl", documents(200)),
        [],
        ["a.jsonl", "holds no text", "data.raw"],
    ),
    "corrupt parquet": (
        lambda raw: (raw / "a.parquet").write_bytes(b"PAR1" + bytes(range(256)) * 20),
        [],
        ["a.parquet", "not a readable parquet file", "write it again"],
    ),
    "truncated parquet": (
        lambda raw: truncated_parquet(raw / "a.parquet"),
        [],
        ["a.parquet", "not a readable parquet file", "write it again"],
    ),
    "parquet without text": (
        lambda raw: parquet(raw / "a.parquet", body=documents(50)),
        [],
        ["a.parquet", "no 'text' column", "rename"],
    ),
    "no input files": (lambda raw: None, [], ["no input files match", "raw/*", "--demo-corpus"]),
    "shorter than one sequence": (
        lambda raw: (raw / "a.txt").write_text("Only a few words."),
        [],
        ["a.txt", "too short for one sequence", "model.sequence_len=64 needs 65", "add documents"],
    ),
    "validation split shorter than one sequence": (
        lambda raw: jsonl(raw / "a.jsonl", documents(200)),
        ["data.val_fraction=0.001"],  # one document held out
        ["a.jsonl", "too short for one sequence", "in val;", "raise data.val_fraction"],
    ),
}


def assert_one_line_error(proc, *needles: str) -> str:
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.mark.parametrize("case", UNUSABLE)
def test_unusable_input_is_refused_and_leaves_the_folder_as_it_was(cli, tmp_path, case):
    write, overrides, needles = UNUSABLE[case]
    data_dir = tmp_path / "data"
    (data_dir / "raw").mkdir(parents=True)
    write(data_dir / "raw")
    before = snapshot(data_dir)
    proc = cli("prepare-data", f"data.dir={data_dir}", *PREPARE, *overrides, expect=None)
    assert_one_line_error(proc, *needles)
    assert snapshot(data_dir) == before  # no tokenizer, shard, meta.json or staging folder left


def test_a_refused_run_creates_no_data_folder(cli, tmp_path):
    """The inputs elsewhere (data.raw): a run refused after tokenizing removes the folder it made."""
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    (inputs / "a.txt").write_text("Only a few words.")
    proc = cli("prepare-data", f"data.dir={tmp_path / 'data'}", *PREPARE, f"data.raw={inputs}/*", expect=None)
    assert_one_line_error(proc, "too short for one sequence")
    assert not (tmp_path / "data").exists()


def tiny_run(train_overrides, data_dir: Path, out: Path, *extra: str) -> list[str]:
    return [
        *train_overrides,
        f"data.dir={data_dir}",
        f"run.output_dir={out}",
        "logging.every_steps=2",
        "logging.tensorboard=false",
        "checkpoint.every_steps=2",
        "schedule.warmup_steps=1",
        *extra,
    ]


@pytest.fixture
def small_corpus(demo_data, tmp_path) -> Path:
    """A data folder whose raw/ holds 600 documents of the demo corpus (a few seconds to prepare)."""
    data_dir = tmp_path / "data"
    (data_dir / "raw").mkdir(parents=True)
    lines = (demo_data / "raw" / "stdlib_docstrings.jsonl").read_text().splitlines()
    (data_dir / "raw" / "docs.jsonl").write_text("\n".join(lines[:600]) + "\n")
    return data_dir


def prepare(cli, data_dir: Path, *extra: str):
    settings = [
        *FAMILY,
        "data.raw=",
        "data.tokenizer=",
        "data.vocab_size=512",
        "data.val_fraction=0.05",
        "model.sequence_len=64",
    ]
    return cli("prepare-data", f"data.dir={data_dir}", *settings, *extra, expect=None)


@pytest.mark.parametrize("strategy", ["ddp", pytest.param("deepspeed", marks=pytest.mark.part("deepspeed"))])
def test_a_run_refuses_data_prepared_again(cli, small_corpus, train_overrides, tmp_path, strategy):
    if strategy == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        pytest.fail("DeepSpeed is not installed: DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed")
    data_dir, out = small_corpus, tmp_path / "run"
    assert prepare(cli, data_dir).returncode == 0
    first = json.loads((data_dir / "meta.json").read_text())
    layout = [f"run.strategy={strategy}", "deepspeed.zero_stage=1"] if strategy == "deepspeed" else []
    run = tiny_run(train_overrides, data_dir, out, *layout)
    cli("train", *run, "schedule.max_steps=4")
    run_files, data_files = snapshot(out), snapshot(data_dir)

    # Again without --force: refused, nothing changes.
    assert_one_line_error(prepare(cli, data_dir), str(data_dir), first["fingerprint"], "--force", "previous-")
    assert snapshot(data_dir) == data_files

    # The same vocabulary size over one more document: every token id may now mean another token.
    with (data_dir / "raw" / "docs.jsonl").open("a") as f:
        f.write(json.dumps({"text": "One more document, and the tokenizer is trained again."}) + "\n")
    forced = prepare(cli, data_dir, "--force")
    assert forced.returncode == 0, forced.stderr
    (previous,) = data_dir.glob("previous-*")
    assert f"is in {previous}" in forced.stdout and f"continue with data.dir={previous}" in forced.stdout
    second = json.loads((data_dir / "meta.json").read_text())
    assert second["vocab_size"] == first["vocab_size"] and second["fingerprint"] != first["fingerprint"]
    # The replaced files are kept whole: the previous folder is the data the run was trained on.
    assert snapshot(previous) == {k: v for k, v in data_files.items() if not k.startswith("raw")}

    for command in (["train", *run, "schedule.max_steps=6"], ["eval", *run], ["sample", *run, "--max-new-tokens", 4]):
        proc = cli(*command, expect=None)
        line = assert_one_line_error(proc, first["fingerprint"], second["fingerprint"], f"data.dir={previous}")
        assert f"(data.dir={data_dir})" in line, line
        assert snapshot(out) == run_files, command[0]

    # The way out the message names: the run continues on the data it was trained on.
    resumed = cli("train", *tiny_run(train_overrides, previous, out, *layout), "schedule.max_steps=6")
    assert re.search(r"resumed from \S+step_00000004\S* at step 4", resumed.stdout), resumed.stdout


def test_checkpoints_without_a_data_fingerprint_still_load(pkg, cli, small_corpus, train_overrides, tmp_path):
    """Written before checkpoints recorded their data (and before they had manifests): eval, sample
    and resume pass unchecked."""
    data_dir, out = small_corpus, tmp_path / "run"
    assert prepare(cli, data_dir).returncode == 0
    run = tiny_run(train_overrides, data_dir, out)
    cli("train", *run, "schedule.max_steps=2")
    path = out / "checkpoints" / "step_00000002.pt"
    state = torch.load(path, weights_only=False)
    assert state.pop("data_fingerprint") == json.loads((data_dir / "meta.json").read_text())["fingerprint"]
    torch.save(state, path)
    pkg.checkpoint_files.manifest_path(path).unlink()
    assert "step 2 | val loss" in cli("eval", *run).stdout
    assert "resumed from" in cli("train", *run, "schedule.max_steps=4").stdout
    assert torch.load(out / "checkpoints" / "step_00000004.pt", weights_only=False)["data_fingerprint"]


def test_data_prepared_before_fingerprints_gets_one(pkg, demo_data, tmp_path):
    """meta.json without a fingerprint (an older prepare-data): computed from the same files."""
    copy = tmp_path / "old"
    shutil.copytree(demo_data, copy, ignore=shutil.ignore_patterns("raw"))
    meta = json.loads((copy / "meta.json").read_text())
    stored = meta.pop("fingerprint")
    (copy / "meta.json").write_text(json.dumps(meta))
    assert pkg.tokens.data_fingerprint(copy) == stored
    shard = copy / meta["train"][0]["file"]
    data = bytearray(shard.read_bytes())
    data[5] ^= 1  # one token id changed within the sampled head of a shard
    shard.write_bytes(bytes(data))
    assert pkg.tokens.data_fingerprint(copy) != stored
