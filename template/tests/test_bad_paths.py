"""Folders that cannot be written, met by every command that writes: one `error:` line naming the
key and the fix, exit 1, no traceback, nothing written and nothing changed. Then the failures met
inside the ranks that a restart cannot fix, links that loop under data.raw, and `sample`'s progress.

The tests run as root, where chmod denies nothing: an unwritable folder here is one in /sys, which
refuses new files to root too, and a folder "under" a regular file.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import subprocess_env
from test_bad_input import assert_one_line, tree_hashes

UNWRITABLE = "/sys/kernel/run"  # EACCES/EPERM for root as for anyone


def bad_folders(tmp_path: Path, project: Path, data_dir: Path) -> dict[str, tuple[str, str]]:
    """{case: (folder, words of the error line besides the key)}."""
    a_file = tmp_path / "a_file"
    a_file.write_text("kept\n")
    return {
        "a file where a folder is expected": (str(a_file), "is a file"),
        "a folder under a file": (str(a_file / "run"), "is a file"),
        "unwritable": (UNWRITABLE, "cannot be written"),
        "empty": ("", "is empty"),
        "the project folder": (str(project), "project folder"),
        "the data folder": (str(data_dir), "is also data.dir"),
    }


# command: (the key of the folder it writes, its arguments with the folder as {folder})
COMMANDS = {
    "train": ("run.output_dir", ["train", "run.output_dir={folder}"]),
    "launch devmachine": (
        "run.output_dir",
        ["launch", "devmachine", "--nproc-per-node", "2", "run.output_dir={folder}"],
    ),
    "eval": ("run.output_dir", ["eval", "run.output_dir={folder}"]),
    "prepare-data": ("data.dir", ["prepare-data", "--demo-corpus", "data.dir={folder}", "run.output_dir={other}"]),
    "export": ("out_dir", ["export", "{folder}", "run.output_dir={other}"]),
}


def snapshot(*folders: Path) -> dict[str, dict[str, str]]:
    """Every file's hash (Python's byte-code caches aside, which any command may write)."""
    return {
        str(f): {name: h for name, h in tree_hashes(f).items() if "__pycache__" not in name}
        for f in folders
        if f.is_dir()
    }


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_refuses_a_folder_it_cannot_write(command, cli, demo_data, train_overrides, tmp_path):
    key, arguments = COMMANDS[command]
    data_dir = tmp_path / "data"
    shutil.copytree(demo_data, data_dir)
    other = tmp_path / "other_run"
    # The commands run in a project folder of their own (config/ and launch/ copied, the package from the
    # source tree): the suite's other tests write into the shared one meanwhile (a launch's job record).
    project = tmp_path / "project"
    for part in ("config", "launch"):
        shutil.copytree(cli.root / part, project / part)
    cases = bad_folders(tmp_path, project, data_dir)
    if key == "data.dir":  # prepare-data: its folder as the run's, in place of data.dir as its own
        cases["the data folder"] = (str(other), "is also run.output_dir")
        other.mkdir()
    before = snapshot(tmp_path)
    tried = 0
    for case, (folder, words) in cases.items():
        if key == "out_dir" and case in ("empty", "the data folder"):
            continue  # export takes a folder argument, compared with neither
        argv = [a.format(folder=folder, other=other) for a in arguments]
        data = [] if key == "data.dir" else [f"data.dir={data_dir}"]
        command = cli.command(*argv, *train_overrides, *data)
        proc = subprocess.run(command, cwd=project, env=subprocess_env(), capture_output=True, text=True, timeout=120)
        assert proc.returncode in (1, 2), (case, proc.returncode, proc.stdout + proc.stderr)
        line = assert_one_line(proc, [words])
        assert line.startswith(f"error: {key}"), (case, line)
        assert snapshot(tmp_path) == before, case  # nothing written, nothing lost (the project folder included)
        tried += 1
    assert tried == (4 if key == "out_dir" else 6)


def test_a_disk_without_room_is_one_line_before_any_work(cli, demo_data, train_overrides, tmp_path):
    """A run folder on a disk with less than the 1 MiB the first writes need (a real 512 KiB tmpfs,
    mounted in a mount namespace of its own): `train` names the key and the room in one line and
    writes nothing there."""
    disk = tmp_path / "small-disk"
    disk.mkdir()
    train = cli.command("train", *train_overrides, f"data.dir={demo_data}", f"run.output_dir={disk / 'run'}")
    mount_then_run = 'mount -t tmpfs -o size=512k tmpfs "$0" && exec "$@"'
    proc = cli.run(
        ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", mount_then_run, disk, *train], expect=None
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    line = assert_one_line(proc, [f"run.output_dir={disk / 'run'} has 0 MiB free", "make room there"])
    assert line.startswith("error: run.output_dir"), line
    assert not any(disk.iterdir())  # the tmpfs went with its namespace; nothing was written beneath it


def test_a_link_loop_under_data_raw_reads_each_file_once(cli, tmp_path):
    """raw/**/*.txt with raw/sub/loop -> .. would name every file again at every depth of the loop
    (each text in train and in validation): each real file is read once, the rest counted."""
    data_dir = tmp_path / "data"
    raw = data_dir / "raw"
    (raw / "sub").mkdir(parents=True)
    words = " ".join(f"word{i}" for i in range(400))
    for n in range(6):
        (raw / f"doc{n}.txt").write_text(f"document {n} {words}\n" * 40)
    (raw / "sub" / "loop").symlink_to("..")

    def prepare(folder: Path):
        return cli(
            "prepare-data",
            "model.arch=gpt",
            "model.pretrained=",
            f"data.dir={folder}",
            "data.raw=raw/**/*.txt",
            "data.tokenizer=",
            "data.vocab_size=512",
            "data.val_fraction=0.2",
            "run.seed=1",
            timeout=240,
        )

    proc = prepare(data_dir)
    assert "Traceback" not in proc.stdout + proc.stderr
    skipped = [line for line in proc.stdout.splitlines() if line.startswith("data.raw: skipped")]
    assert len(skipped) == 1 and int(skipped[0].split()[2].replace(",", "")) >= 6, proc.stdout
    meta = json.loads((data_dir / "meta.json").read_text())
    once = tmp_path / "once"
    shutil.copytree(raw, once / "raw", ignore=shutil.ignore_patterns("sub"))
    prepare(once)
    same = json.loads((once / "meta.json").read_text())
    for split in ("train", "val"):  # the same shards as without the loop
        for a, b in zip(meta[split], same[split], strict=True):
            assert (data_dir / a["file"]).read_bytes() == (once / b["file"]).read_bytes()


def damage_shard(data_dir: Path, shard: str, how: str) -> list[str]:
    """Damage the prepared data as `how` says; the words the one line must hold."""
    if how == "missing":
        (data_dir / shard).unlink()
        return [shard, "prepare-data"]
    if how == "cut short":  # a copy that stopped a token early: every later id would shift
        path = data_dir / shard
        path.write_bytes(path.read_bytes()[:-2])
        return [shard, "bytes", "meta.json says", "prepare-data --force"]
    meta = json.loads((data_dir / "meta.json").read_text())  # a dtype edited by hand
    meta["dtype"] = "uint32"
    (data_dir / "meta.json").write_text(json.dumps(meta))
    return [shard, "uint32", "prepare-data --force"]


# Each command meets another damage (they share the check, data/tokens.py's require_shards).
@pytest.mark.parametrize(
    "command, how", [("train", "missing"), ("eval", "cut short"), ("launch devmachine", "a dtype edited")]
)
def test_a_missing_or_altered_shard_is_one_line(command, how, cli, demo_data, run_1proc, train_overrides, tmp_path):
    data_dir = tmp_path / "data"
    shutil.copytree(demo_data, data_dir)
    shard = json.loads((data_dir / "meta.json").read_text())["train" if command != "eval" else "val"][0]["file"]
    words = damage_shard(data_dir, shard, how)
    out = tmp_path / "run"
    shutil.copytree(run_1proc[0], out)
    before = snapshot(data_dir, out)
    argv = COMMANDS[command][1]
    proc = cli(
        *[a.format(folder=out) for a in argv], *train_overrides, f"data.dir={data_dir}", expect=None, timeout=180
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert_one_line(proc, words)
    assert snapshot(data_dir, out) == before


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_checkpoint_that_cannot_be_written_ends_the_job_at_once(cli, demo_data, train_overrides, tmp_path, strategy):
    """A file where the checkpoints folder should be: every attempt would train to the first save
    and fail there. The job ends at its first attempt with one line, not after max_restarts more:
    rank 0 shares the failure, so no other rank is left waiting for it in a collective."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "checkpoints").write_text("not a folder\n")
    proc = cli(
        *COMMANDS["launch devmachine"][1][:4],
        *train_overrides,
        f"data.dir={demo_data}",
        f"run.output_dir={out}",
        "cluster.max_restarts=3",
        "schedule.max_steps=10",
        f"run.strategy={strategy}",
        expect=1,
        timeout=240,
    )
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stdout + proc.stderr
    assert "closing signal" not in proc.stderr, proc.stderr  # every rank ended by itself
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and str(out / "checkpoints") in errors[0] and "move it away" in errors[0], proc.stderr
    attempts = {p.name for p in (out / "logs").rglob("attempt_*")}
    assert attempts == {"attempt_0"}, attempts
    assert len((proc.stdout + proc.stderr).splitlines()) < 40, proc.stdout + proc.stderr
    assert (out / "checkpoints").read_text() == "not a folder\n"


def test_sample_shows_progress_on_stderr_and_only_text_on_stdout(cli, demo_data, run_1proc, train_overrides):
    tokens = 300
    proc = cli(
        "sample",
        *train_overrides,
        f"data.dir={demo_data}",
        f"run.output_dir={run_1proc[0]}",
        "--prompt",
        "The",
        "--max-new-tokens",
        tokens,
        timeout=240,
    )
    assert f"sampling {tokens:,} tokens" in proc.stderr
    assert f"sampled {tokens:,}/{tokens:,} tokens" in proc.stderr
    assert "sampl" not in proc.stdout.replace("sampling from", ""), proc.stdout
    assert "--- 'The'" in proc.stdout
