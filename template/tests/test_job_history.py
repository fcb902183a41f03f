"""launch/job_history.py: what the project keeps of a job for when its platform forgets it. The
training lines it picks out of a log (whatever the launcher puts before them, however the chunks
cut them), the seen records it keeps small, and where a finished run stands (run_2proc's run).
Each platform's answer for a forgotten job is checked against that platform in the template's
tests (tests/test_slurm.py, test_kubeflow_api.py, test_tione.py).

    python -m pytest -q tests/test_job_history.py
"""

from __future__ import annotations

import json

import pytest


@pytest.fixture
def history(pkg, tmp_path, monkeypatch):
    """job_history with this test's folder as the project root (it holds config/)."""
    (tmp_path / "config").mkdir()
    monkeypatch.chdir(tmp_path)
    return pkg.module("launch.job_history")


TRAINING = "step     12/40 | loss 5.4321 | lr 3.00e-04 | 9,876 tok/s | 210 ms/step"
STOPPED = "preempted (SIGTERM): checkpoint of step 12 saved; the same command resumes from it (exit code 143)"


def test_the_last_training_line_and_last_word_whatever_the_prefix_and_the_chunks(history):
    text = (
        "[default0]:step     10/40 | loss 6.0000 | lr 3.00e-04 | 9,000 tok/s | 220 ms/step\r\n"
        "a line that mentions step 3 and a loss of 4\n"  # not the loop's format
        f"[worker-1] [default0]:{TRAINING}\n"
        "node rank 0 done\n"
        f"[default0]:{STOPPED}"  # no newline yet: the log is still being written
    )
    for size in (1, 7, len(text)):  # chunks cut lines anywhere
        watcher = history.LogWatcher()
        for start in range(0, len(text), size):
            watcher.feed(text[start : start + size])
        watcher.close()
        assert (watcher.line, watcher.end) == (TRAINING, STOPPED), size


def test_seen_records_merge_per_job_and_stay_small(history, pkg, monkeypatch):
    job = pkg.module("launch.jobs").Job("slurm", "41")
    other = pkg.module("launch.jobs").Job("slurm", "42")
    history.remember(job, "status", "RUNNING")
    history.remember(other, "status", "PENDING")
    watcher = history.LogWatcher()
    watcher.feed(TRAINING + "\n")
    history.remember(job, "logs", None, watcher)
    history.remember(job, "logs", None, history.LogWatcher())  # saw nothing: nothing written
    seen = history.last_seen(job)
    assert (seen.state, seen.state_by, seen.line, seen.end, seen.entries) == ("RUNNING", "status", TRAINING, None, 2)

    # Past its size the file is rewritten with one line per job, keeping what last_seen answers.
    monkeypatch.setattr(history, "COMPACT_BYTES", 600)
    for _ in range(10):
        history.remember(job, "status", "COMPLETING")
    history.remember(job, "status", "CANCELLED exit 143:0")
    text = history.seen_path("slurm").read_text()
    lines = text.splitlines()
    assert len(text) <= 600 + max(map(len, lines)) and len(lines) < 14, lines  # 14 written, compacted
    assert {json.loads(line)["id"] for line in lines} == {"41", "42"}, lines
    seen = history.last_seen(job)
    assert (seen.state, seen.line) == ("CANCELLED exit 143:0", TRAINING)
    assert history.last_seen(other).state == "PENDING"


def test_where_a_finished_run_stands(history, run_2proc):
    out, _ = run_2proc
    lines = history.run_lines(out, 30)
    assert lines[0].startswith("latest: step     30/30 | loss "), lines
    assert f"checkpoint: {out / 'checkpoints' / 'step_00000030.pt'}" in lines, lines
    assert lines[-1] == "finished: reached max_steps 30", lines
    assert not [line for line in lines if line.startswith("stopped by")], lines
    assert history.run_lines(out, 40)[-1] == "finished: no, step 30 of max_steps 40"
    assert history.run_lines(out / "nothing-here", 30) == []
