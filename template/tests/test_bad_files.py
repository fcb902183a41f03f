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


@pytest.mark.parametrize("platform", PLATFORMS)
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
