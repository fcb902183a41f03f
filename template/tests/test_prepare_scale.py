"""prepare-data at corpus scale: parts encoded by worker processes write the same tokens for any
number of them, an interrupted run continues from its finished parts, long documents are cut into
segments without changing their tokens and stay whole in one split, progress is shown, and two
runs never write one folder.

    python -m pytest -q tests/test_prepare_scale.py        # about a minute
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pty
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import subprocess_env

PREPARE = [
    "model.arch=gpt",
    "model.pretrained=",
    "data.raw=",
    "data.tokenizer=",
    "data.vocab_size=500",
    "data.val_fraction=0.05",
    "data.shard_tokens=20000",
    "model.sequence_len=64",
    "--part-mb",  # the reference's 12 files of about 200 KB, packed two to a part: 6 parts
    "0.2",
]
REFERENCE_PARTS = 6


def corpus(raw: Path, files: int, docs_per_file: int) -> None:
    """`files` files of generated English-like documents, about 200 KB each."""
    words = "the data model token shard batch rank node step loss grad of and to in is for".split()
    raw.mkdir(parents=True)
    for f in range(files):
        lines = []
        for d in range(docs_per_file):
            n = 40 + (f * 31 + d * 17) % 200
            text = " ".join(words[(f * 7 + d * 5 + i * i) % len(words)] for i in range(n))
            lines.append(json.dumps({"text": f"File {f}, document {d}.\n{text}."}))
        (raw / f"part-{f:02d}.jsonl").write_text("\n".join(lines) + "\n")


def outputs(data_dir: Path) -> dict[str, str]:
    """The prepared files (not raw/), by name: their SHA-256; and the fingerprint."""
    found = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in data_dir.iterdir() if p.suffix == ".bin"}
    meta = json.loads((data_dir / "meta.json").read_text())
    return {
        **found,
        "tokenizer": hashlib.sha256((data_dir / "tokenizer.json").read_bytes()).hexdigest(),
        "fingerprint": meta["fingerprint"],
        "shards": json.dumps([meta["train"], meta["val"]]),
    }


@pytest.fixture(scope="module")
def reference(cli, tmp_path_factory):
    """A corpus of 6 parts prepared by one worker: the tokens every other way must write."""
    data_dir = tmp_path_factory.mktemp("reference")
    corpus(data_dir / "raw", files=12, docs_per_file=300)
    cli("prepare-data", f"data.dir={data_dir}", *PREPARE, "--workers", "1")
    return data_dir


def copy_inputs(reference: Path, data_dir: Path) -> None:
    (data_dir / "raw").mkdir(parents=True)
    for path in (reference / "raw").iterdir():
        target = data_dir / "raw" / path.name
        target.write_bytes(path.read_bytes())
        os.utime(target, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns))


def test_any_number_of_workers_writes_the_same_tokens(cli, reference, tmp_path):
    copy_inputs(reference, tmp_path)
    proc = cli("prepare-data", f"data.dir={tmp_path}", *PREPARE, "--workers", "3")
    assert "on 3 workers" in proc.stdout, proc.stdout
    assert proc.stderr == "", proc.stderr  # off a terminal, progress is on stdout: stderr is for errors
    assert outputs(tmp_path) == outputs(reference)
    meta = json.loads((tmp_path / "meta.json").read_text())
    for split in ("train", "val"):  # the parts' shards joined: all but the last hold shard_tokens
        assert all(s["tokens"] >= 20000 for s in meta[split][:-1]), meta[split]
    assert len(meta["val"]) < REFERENCE_PARTS  # not one small validation shard per part
    assert not (tmp_path / ".prepare-data").exists()


def documents_per_split(data_dir: Path) -> dict[str, int]:
    """Documents per split: the separators in its shards."""
    meta = json.loads((data_dir / "meta.json").read_text())
    return {
        split: sum(int((np.fromfile(data_dir / s["file"], meta["dtype"]) == meta["bos_id"]).sum()) for s in meta[split])
        for split in ("train", "val")
    }


def test_the_validation_share_holds_whatever_the_files(cli, reference, tmp_path):
    """data.val_fraction of the documents are held out whether a corpus is a few big files or a
    folder of one-document files (each its own part): counted per part and rounded, all 240 of
    these went to validation and training had none."""
    raw = tmp_path / "raw"
    raw.mkdir()
    for i in range(240):
        (raw / f"doc-{i:03d}.txt").write_text(f"Document {i}. " + "the model reads tokens " * (40 + i % 17))
    cli("prepare-data", f"data.dir={tmp_path}", *PREPARE)
    many = documents_per_split(tmp_path)
    assert many["train"] + many["val"] == 240 and 2 <= many["val"] <= 30, many  # 5%: 12 expected
    few = documents_per_split(reference)  # 12 files of 300 documents
    assert 0.03 < few["val"] / (few["train"] + few["val"]) < 0.07, few


def finished_parts(parts_dir: Path) -> int:
    """Parts in place: a writer's temporary folder (00003.<pid>.tmp) holds its done.json before its rename."""
    return sum(path.parent.name.isdigit() for path in parts_dir.glob("*/done.json"))


def start_and_wait_for_parts(cli, data_dir: Path, workers: int, parts: int, group: bool = False) -> subprocess.Popen:
    """prepare-data started in the background, returned once `parts` parts are finished. Each part
    then waits a second (faults.py), so a signal sent now lands before the next one or two finish:
    unslowed, the six parts took a second in all and the run could end before the signal. group: in
    a process group of its own, as a terminal's foreground job (its pid is the group's)."""
    proc = subprocess.Popen(
        cli.command("prepare-data", f"data.dir={data_dir}", *PREPARE, "--workers", str(workers)),
        cwd=cli.root,
        env=subprocess_env({"TRAIN_FAULT_PART_SECONDS": "1"}),
        # Ctrl-C's SIGINT as a terminal delivers it, even where the suite itself runs with SIGINT
        # ignored (started in the background: `cmd &`, nohup), which Python would inherit and obey.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=group,
    )
    # The tokenizer is trained before the first part: on two loaded cores that alone took minutes.
    deadline = time.monotonic() + 600
    while finished_parts(data_dir / ".prepare-data" / "parts") < parts:
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            stdout, stderr = proc.communicate()
            pytest.fail(
                f"prepare-data did not finish {parts} part(s) and keep going:\n{stdout[-3000:]}{stderr[-3000:]}"
            )
        time.sleep(0.01)
    return proc


def test_an_interrupted_run_continues_from_its_finished_parts(cli, reference, tmp_path):
    copy_inputs(reference, tmp_path)
    parts = tmp_path / ".prepare-data" / "parts"
    proc = start_and_wait_for_parts(cli, tmp_path, workers=1, parts=3)
    proc.send_signal(signal.SIGINT)  # Ctrl-C
    stdout, stderr = proc.communicate(timeout=60)
    kept = finished_parts(parts)
    assert 3 <= kept <= REFERENCE_PARTS - 2, (
        f"the run was to be stopped after 3 parts, it had {kept}:\n{stdout}{stderr}"
    )
    assert proc.returncode != 0 and "Traceback" not in stderr, stderr
    assert f"{kept} finished part(s) stay" in stdout and "the same command continues" in stdout, stdout
    assert not (tmp_path / "meta.json").exists()  # nothing half done in data.dir itself

    # What a writer killed between its done.json and its rename leaves is not a finished part: not
    # counted when a second interrupted run says what stays, and cleaned when a run continues.
    unfinished = next(i for i in range(REFERENCE_PARTS) if not (parts / f"{i:05d}").is_dir())
    leftover = parts / f"{unfinished:05d}.4242.tmp"
    shutil.copytree(parts / "00000", leftover)
    proc = start_and_wait_for_parts(cli, tmp_path, workers=1, parts=kept + 1)
    proc.send_signal(signal.SIGTERM)  # a scheduler's stop: as Ctrl-C (runtime/process_exit.py)
    stdout, stderr = proc.communicate(timeout=60)
    kept = finished_parts(parts)
    assert f"{kept} finished part(s) stay" in stdout and not leftover.exists(), stdout + stderr
    assert proc.returncode == 143 and stderr.strip().endswith("prepare-data: stopped by SIGTERM"), stderr
    assert kept < REFERENCE_PARTS

    proc = cli("prepare-data", f"data.dir={tmp_path}", *PREPARE, "--workers", "2")
    assert "continuing the prepare-data interrupted" in proc.stdout, proc.stdout
    told = f"{kept} of {REFERENCE_PARTS} parts were finished before: encoding the other {REFERENCE_PARTS - kept}"
    assert told in proc.stdout, proc.stdout
    assert "using the tokenizer the interrupted run made" in proc.stdout
    assert outputs(tmp_path) == outputs(reference)
    assert not (tmp_path / ".prepare-data").exists()


def test_a_damaged_part_record_is_encoded_again_and_a_damaged_plan_starts_over(cli, reference, tmp_path):
    """What a crash or a hand leaves in an interrupted run's staging folder: a finished part whose
    done.json is cut short or of another shape is encoded again, a plan.json that is not JSON starts
    the run over; each said in one warning line naming the file, and the data equals a clean run's."""
    copy_inputs(reference, tmp_path)
    proc = start_and_wait_for_parts(cli, tmp_path, workers=1, parts=3)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    parts = tmp_path / ".prepare-data" / "parts"
    done_files = sorted(path for path in parts.glob("*/done.json") if path.parent.name.isdigit())
    assert len(done_files) >= 3
    done_files[0].write_bytes(done_files[0].read_bytes()[:20])  # a write cut short
    done_files[1].write_text(json.dumps({"train": [{"file": 7}], "val": [], "files": {}}))  # a shard of another shape
    proc = cli("prepare-data", f"data.dir={tmp_path}", *PREPARE, "--workers", "2")
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert all("the part is encoded again" in line for line in warnings), warnings
    assert str(done_files[0]) in warnings[0] and str(done_files[1]) in warnings[1], warnings
    told = f"{len(done_files) - 2} of {REFERENCE_PARTS} parts were finished before"
    assert told in proc.stdout, proc.stdout
    assert outputs(tmp_path) == outputs(reference)

    again = tmp_path / "again"
    again.mkdir()
    copy_inputs(reference, again)
    (again / ".prepare-data").mkdir()
    (again / ".prepare-data" / "plan.json").write_bytes(b"\xff\xfe not json")
    proc = cli("prepare-data", f"data.dir={again}", *PREPARE)
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "plan.json" in warnings[0] and "starting over" in warnings[0], proc.stderr
    assert outputs(again) == outputs(reference)


def test_changed_inputs_start_over(cli, reference, tmp_path):
    copy_inputs(reference, tmp_path)
    # An interrupted run's leftovers, made from other files or settings: a finished part among them.
    finished = tmp_path / ".prepare-data" / "parts" / "00000"
    finished.mkdir(parents=True)
    (finished / "done.json").write_text(json.dumps({"documents": 1, "tokens": 3, "train": [], "val": []}))
    (finished.parents[1] / "plan.json").write_text(json.dumps({"files": "an older corpus"}))
    proc = cli("prepare-data", f"data.dir={tmp_path}", *PREPARE)
    assert "was for other input files or settings: starting over" in proc.stdout, proc.stdout
    assert "parts were finished before" not in proc.stdout
    assert outputs(tmp_path) == outputs(reference)


def test_a_second_prepare_data_on_the_folder_is_refused(cli, reference, tmp_path):
    copy_inputs(reference, tmp_path)
    staging = tmp_path / ".prepare-data"
    staging.mkdir()
    with (staging / "lock").open("a+") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        held.write("pid 4242 on gpu-07")
        held.flush()
        proc = cli("prepare-data", f"data.dir={tmp_path}", *PREPARE, expect=1)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "another prepare-data (pid 4242 on gpu-07) is writing" in lines[0] and "another data.dir" in lines[0]
    assert not (tmp_path / "meta.json").exists()


def test_long_documents_are_cut_where_their_tokens_do_not_change(pkg, tmp_path):
    from tokenizers import Tokenizer

    documents = pkg.documents
    line = "A long document has many lines, each one a sentence or two of ordinary prose; "
    text = "".join(f"{line}{i}\n" for i in range(40_000))  # about 3.3 MB in one document
    segments = list(documents.cut_segments([text]))
    assert len(segments) >= 3 and "".join(segments) == text
    assert max(map(len, segments)) <= documents.SEGMENT_CHARS
    tok = Tokenizer.from_file(str(tokenizer(pkg, tmp_path, text[:200_000])))
    whole = tok.encode(text, add_special_tokens=False).ids
    assert [i for s in segments for i in tok.encode(s, add_special_tokens=False).ids] == whole

    # A .txt file with no line break at all is still read a segment at a time.
    (tmp_path / "one-line.txt").write_text("word " * 600_000)
    part = documents.plan_parts([tmp_path / "one-line.txt"])[0]
    pieces = list(documents.iter_segments(part))
    assert [starts for _, starts in pieces] == [True] + [False] * (len(pieces) - 1) and len(pieces) >= 3
    assert "".join(t for t, _ in pieces) == "word " * 600_000


def test_a_long_document_stays_whole_in_order_and_in_one_split(pkg, tmp_path, monkeypatch):
    """Documents longer than a segment, and than a shuffling block, are read on in order: each one's
    tokens lie contiguous in one shard of one split, wherever the blocks cut it, so a row that starts
    at it reads its own continuation and no document is on both sides of the split. A corpus of one
    long text holds out only its first segment and trains on the rest."""
    encode_parts, documents = pkg.encode_parts, pkg.documents
    monkeypatch.setattr(encode_parts, "BLOCK_CHARS", 1_500_000)  # blocks end inside the long documents
    line = "Long document {}, line {}: plain prose on tokens and shards.\n"
    longs = ["".join(line.format(d, i) for i in range(40_000)) for d in range(3)]
    shorts = [f"Short document {i}: " + "a few words of text " * (5 + i % 30) for i in range(300)]
    texts = shorts[:50] + longs[:1] + shorts[50:150] + longs[1:2] + shorts[150:] + longs[2:]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    tok = pkg.tokens.load_tokenizer(str(tokenizer(pkg, tmp_path, longs[0][:100_000] + "".join(shorts))))
    separator = pkg.tokens.bos_id(tok)

    def shards(path: Path, seed: int, val_fraction: float, index: int) -> dict[str, list[bytes]]:
        part = documents.plan_parts([path])[0]
        settings = encode_parts.EncodeSettings("uint16", separator, seed, val_fraction, shard_tokens=50_000)
        done = encode_parts.encode_part(tok, part, index, settings, tmp_path / "parts")
        folder = pkg.staging.part_folder(tmp_path / "parts", index)
        return {split: [(folder / s["file"]).read_bytes() for s in done[split]] for split in ("train", "val")}

    def ids(text: str) -> bytes:
        return np.asarray([separator, *tok.encode(text, add_special_tokens=False).ids], np.uint16).tobytes()

    blocks = list(encode_parts._blocks(documents.iter_segments(documents.plan_parts([tmp_path / "corpus.jsonl"])[0])))
    assert sum(goes_on for _, goes_on, _ in blocks) >= 2  # the case: documents cut by a block's end

    written = shards(tmp_path / "corpus.jsonl", seed=3, val_fraction=0.3, index=1)
    where = []
    for text in longs:
        whole = ids(text)
        where += [split for split, files in written.items() for data in files if data.find(whole) % 2 == 0]
    assert len(where) == len(longs), where  # each one whole, in one shard
    total = sum(len(data) for files in written.values() for data in files) // 2
    assert total == sum(len(ids(t)) // 2 for t in texts)  # and nothing else lost or doubled

    # One long text: its first segment is the validation split, the rest trains.
    (tmp_path / "book.txt").write_text(longs[0])
    written = shards(tmp_path / "book.txt", seed=3, val_fraction=1e-9, index=0)
    first, *rest = documents.cut_segments([longs[0]])
    assert b"".join(written["val"]) == ids(first)
    assert b"".join(written["train"]) == ids("".join(rest))[2:] and len(rest) >= 2


def tokenizer(pkg, folder: Path, sample: str) -> Path:
    tok = pkg.tokens.train_tokenizer(lambda purpose: iter([sample]), 400)
    tok.save(str(folder / "tokenizer.json"))
    return folder / "tokenizer.json"


def test_progress_is_a_bar_on_a_terminal_and_lines_in_a_log(cli, reference, tmp_path, pkg, capsys):
    copy_inputs(reference, tmp_path)
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        cli.command("prepare-data", f"data.dir={tmp_path}", *PREPARE),
        cwd=cli.root,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=follower,
        text=True,
    )
    os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        shown += chunk
    stdout, _ = proc.communicate(timeout=120)
    os.close(leader)
    assert proc.returncode == 0, stdout
    bar = shown.decode(errors="replace")
    for words in ("reading for the tokenizer", "encoding", "100%", "documents", "tokens/s"):
        assert words in bar, (words, bar[-2000:])
    assert "\r" in bar  # redrawn in place
    assert "wrote" in stdout and "tokens/s on" in stdout  # the one summary line

    progress = pkg.progress.Progress("encoding", total_bytes=4e6, every=0.0)
    progress.update(1e6, documents=10, tokens=250_000)
    line = capsys.readouterr().out
    assert line.startswith("encoding: 25% of 4.0MB, 10 documents, 250.0k tokens,") and "tokens/s" in line
    assert "left" in line and "\r" not in line


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        found += [int(c) for c in (task / "children").read_text().split()]
    return found


def test_a_worker_killed_by_the_system_is_one_line_and_the_run_continues(cli, reference, tmp_path):
    copy_inputs(reference, tmp_path)
    proc = start_and_wait_for_parts(cli, tmp_path, workers=2, parts=2)
    workers = [c for c in children(proc.pid) if b"spawn_main" in Path(f"/proc/{c}/cmdline").read_bytes()]
    assert workers, "no worker processes found"
    os.kill(workers[0], signal.SIGKILL)  # as the kernel's OOM killer would
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "Traceback" not in stderr, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "worker process died" in lines[0] and "run the same command again" in lines[0], stderr
    assert "finished part(s) stay" in stdout, stdout

    proc = cli("prepare-data", f"data.dir={tmp_path}", *PREPARE)
    assert "parts were finished before" in proc.stdout, proc.stdout
    assert outputs(tmp_path) == outputs(reference)


def group_members(group: int) -> list[int]:
    """The live processes of a process group (zombies, reaped by nobody yet, are gone already)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # ended while read
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


@pytest.mark.parametrize("stop", [signal.SIGHUP, signal.SIGINT, signal.SIGTERM, signal.SIGQUIT], ids=lambda s: s.name)
def test_a_stop_sent_to_the_whole_process_group_stops_as_ctrl_c_does(cli, reference, tmp_path, stop):
    """A closed terminal (SIGHUP), Ctrl-C or Ctrl-\\ at a terminal, a scheduler's SIGTERM to the job:
    each reaches the workers and multiprocessing's resource tracker too. The stop is this process's
    one line and exit code; the finished parts stay; no helper dies first (a tracker killed by SIGHUP
    printed a KeyError traceback per queue semaphore) or is left running."""
    copy_inputs(reference, tmp_path)
    proc = start_and_wait_for_parts(cli, tmp_path, workers=2, parts=2, group=True)
    os.killpg(proc.pid, stop)
    stdout, stderr = proc.communicate(timeout=60)
    said = "interrupted" if stop == signal.SIGINT else f"stopped by {signal.Signals(stop).name}"
    assert proc.returncode == 128 + stop and stderr.strip() == f"prepare-data: {said}", stderr
    kept = finished_parts(tmp_path / ".prepare-data" / "parts")
    assert kept >= 2 and f"{kept} finished part(s) stay" in stdout, stdout
    assert not (tmp_path / "meta.json").exists()
    deadline = time.monotonic() + 60  # the workers, ended by the parent, and the tracker, at its pipe's end
    while group_members(proc.pid):
        assert time.monotonic() < deadline, f"left running: {group_members(proc.pid)}"
        time.sleep(0.05)


@pytest.mark.parametrize("part_bytes", [1, 37, 500, 10**9])
def test_parts_cover_every_document_once(pkg, tmp_path, part_bytes):
    """Wherever the byte ranges fall (inside a line, on a line break, past a blank line), every
    document is read by exactly one part, in order; parquet parts are whole row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    documents = pkg.documents
    texts = [f"document {i} " + "é" * (i % 7) + "word " * (i % 23) for i in range(120)]
    lines = [json.dumps({"text": t}, ensure_ascii=i % 2 == 0) for i, t in enumerate(texts)]
    (tmp_path / "a.jsonl").write_text("\n".join(lines[:50] + ["", ""] + lines[50:]) + "\n")
    pq.write_table(pa.table({"text": texts}), tmp_path / "b.parquet", row_group_size=16)
    (tmp_path / "c.txt").write_text("".join(f"line {i} of one text document\n" for i in range(300)))

    def read(path: Path) -> list[tuple[str, bool]]:
        parts = documents.plan_parts([path], part_bytes=part_bytes)
        pieces = [piece for part in parts for piece in part.pieces]
        assert [p.start for p in pieces[1:]] == [p.stop for p in pieces[:-1]]  # contiguous, no gap or overlap
        return [segment for part in parts for segment in documents.iter_segments(part)]

    assert read(tmp_path / "a.jsonl") == [(t, True) for t in texts]
    assert read(tmp_path / "b.parquet") == [(t, True) for t in texts]
    txt = read(tmp_path / "c.txt")
    assert "".join(t for t, _ in txt) == (tmp_path / "c.txt").read_text()
    assert [starts for _, starts in txt] == [True] + [False] * (len(txt) - 1)


def test_small_files_are_packed_into_parts(pkg, tmp_path):
    """A folder of many small files is a few parts of about part_bytes, each file read whole by one
    of them, in order: not a part, a worker task and a staging folder per file."""
    texts = [f"document {i}: " + "tokens " * (100 + i % 40) for i in range(300)]
    paths = []
    for i, text in enumerate(texts):
        paths.append(tmp_path / f"doc-{i:03d}.txt")
        paths[-1].write_text(text)
    parts = pkg.documents.plan_parts(paths, part_bytes=64_000)
    total = sum(p.stat().st_size for p in paths)
    assert 1 < len(parts) <= -(-total // 64_000) and all(part.size >= 64_000 for part in parts[:-1])
    assert [piece.path for part in parts for piece in part.pieces] == [str(p) for p in paths]
    found: dict[str, int] = {}
    read = [segment for part in parts for segment in pkg.documents.iter_segments(part, documents=found)]
    assert read == [(t, True) for t in texts] and found == {str(p): 1 for p in paths}


def test_a_mistake_found_by_a_worker_is_one_line_and_leaves_nothing(cli, reference, tmp_path):
    copy_inputs(reference, tmp_path)
    bad = tmp_path / "raw" / "part-07.jsonl"
    bad.write_text(bad.read_text() + "not json\n")  # past the start that is checked before encoding
    before = sorted(p.name for p in tmp_path.rglob("*"))
    proc = cli("prepare-data", f"data.dir={tmp_path}", *PREPARE, "--workers", "2", expect=1)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "part-07.jsonl:301 is not a JSON object with a 'text' field" in lines[0], lines[0]
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # no staging folder, no output
