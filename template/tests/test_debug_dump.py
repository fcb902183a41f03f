"""`debug-dump` against a real hung job: a 2-process torchrun run on CPU (launch devmachine) where
rank 1 stops before step 3 (TRAIN_FAULT_HANG) and rank 0 waits in the gradient all-reduce. py-spy
attaches to both ranks; the dump must show each rank where it really is.

    python -m pytest -q tests/test_debug_dump.py     # needs py-spy (a dependency: pip install -e .)
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TRAIN_OVERRIDES


def py_spy_installed() -> None:
    if not (shutil.which("py-spy") or (Path(sys.executable).parent / "py-spy").exists()):
        pytest.fail("py-spy is missing: pip install py-spy (a dependency of this project: pip install -e .)")


def wait_for_text(log: Path, text: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        if proc.poll() is not None:
            raise AssertionError(f"exited ({proc.returncode}) before {text!r}:\n{log.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {text!r} within {timeout} s:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)


def rank_pid(output_dir: Path, rank: int) -> int | None:
    """The pid of the training rank `rank` writing to output_dir (None: not started yet)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
                environ = (entry / "environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if (
                b"train" in argv
                and f"run.output_dir={output_dir}".encode() in argv
                and f"RANK={rank}".encode() in environ
            ):
                return int(entry.name)
    return None


def training_step(threads: list[dict], pid: int, stacks) -> int | None:
    """The `step` local of the training loop's frame in the main thread (py-spy --locals), if any."""
    thread = stacks.main_thread(threads, pid) or {}
    for frame in thread.get("frames", []):
        if (frame.get("filename") or "").endswith("/training/train.py"):
            for var in frame.get("locals") or []:
                if var.get("name") == "step" and str(var.get("repr", "")).isdigit():
                    return int(var["repr"])
    return None


def wait_in_collective(pkg, output_dir: Path, rank: int, step: int, proc: subprocess.Popen, timeout: float = 180):
    """Until rank `rank` waits in a collective of optimizer step `step`, as py-spy sees it: the state the
    dump must show. (A rank on its way there, or still leaving the previous step's all-reduce, is not.)"""
    dump, stacks = pkg.module("diagnostics.debug_dump"), pkg.module("diagnostics.rank_stacks")
    py_spy = dump.find_py_spy()
    deadline, seen = time.monotonic() + timeout, None
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"the job exited ({proc.returncode}) before rank {rank} waited in step {step}")
        pid = rank_pid(output_dir, rank)
        if pid is not None:
            try:
                threads = dump.py_spy_dump(py_spy, pid, True, False)
            except RuntimeError as exc:  # a dump that raced the process' start: try again
                seen = str(exc)
            else:
                seen = (stacks.where(threads, pid), training_step(threads, pid, stacks))
                if seen[0]["in_collective"] and seen[1] == step:
                    return
        if time.monotonic() > deadline:
            raise AssertionError(f"rank {rank} not waiting in a collective of step {step} within {timeout} s: {seen}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def hung_job(tmp_path_factory, cli, demo_data, pkg):
    """Rank 1 sleeps forever before step 3; rank 0 waits for its gradients (collective timeout 30 min:
    nothing times out while the test looks). A flight-recorder folder named by the ranks' environment
    holds one file, as NCCL ranks would leave after a timeout (Gloo on CPU writes none)."""
    py_spy_installed()
    root = tmp_path_factory.mktemp("hung")
    out, log, trace = root / "run", root / "log", root / "nccl-trace"
    trace.mkdir()
    (trace / "rank_0").write_bytes(b"\x80flight recorder stand-in")
    env = {"TRAIN_FAULT_HANG": "1:3", "TRAIN_DEBUG": None, "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(trace / "rank_")}
    proc = cli.start(
        "launch",
        "devmachine",
        "--nproc-per-node",
        "2",
        *TRAIN_OVERRIDES,
        f"data.dir={demo_data}",
        f"run.output_dir={out}",
        "run.collective_timeout_minutes=30",
        "cluster.max_restarts=0",
        "cluster.stop_grace_seconds=3",
        log=log,
        env=env,
    )
    try:
        wait_for_text(log, "rank 1 hangs before step 3", proc)
        wait_in_collective(pkg, out, 0, 3, proc)  # rank 0 waits for rank 1 in step 3
        yield out, trace, proc
    finally:
        cli.stop(proc)


def test_debug_dump_shows_the_hung_rank_and_the_waiting_one(cli, hung_job, pkg):
    out, trace, proc = hung_job
    pids = [rank_pid(out, 0), rank_pid(out, 1)]
    # Without --pid, debug-dump takes every training rank on the machine: this job's two are among them.
    # (The suite's other tests train beside this one, so the dump itself names this job's ranks.)
    found = {p.pid: (p.rank, p.local_rank, p.world_size) for p in pkg.module("cluster.local_ranks").find_ranks()}
    assert [found.get(pid) for pid in pids] == [(0, 0, 2), (1, 1, 2)], (pids, found)
    started = time.monotonic()
    result = cli("debug-dump", "--pid", pids[0], "--pid", pids[1])  # no --out: the ranks' run.output_dir
    seconds = time.monotonic() - started
    text = result.stdout
    (folder,) = (out / "debug-dump").iterdir()
    assert re.fullmatch(r".+-\d{8}T\d{6}Z", folder.name), folder.name
    assert sorted(p.name for p in folder.iterdir()) == ["rank0.txt", "rank1.txt", "summary.json", "summary.txt"]

    rank0, rank1 = (folder / "rank0.txt").read_text(), (folder / "rank1.txt").read_text()
    # Rank 1: in the fault hook's sleep, inside our training loop.
    assert "before_step (" in rank1 and "faults.py" in rank1 and "time.sleep(3600)" in rank1, rank1
    assert "train.py" in rank1
    # Rank 0: in DDP's step 3 (buffer broadcast before the forward, or the gradient all-reduce in
    # backward), waiting for rank 1 to join; nowhere near the fault hook.
    assert "DistributedDataParallel" in rank0 or "backward (" in rank0, rank0
    assert "faults.py" not in rank0, rank0

    summary = {r["rank"]: r for r in json.loads((folder / "summary.json").read_text())["ranks"]}
    assert summary[1]["in_collective"] is False and "faults.py" in summary[1]["ours"]
    assert summary[0]["in_collective"] is True, summary[0]
    assert re.match(r"collective (broadcast|all_reduce)", summary[0]["waits_in"]), summary[0]
    assert summary[0]["pid"] != summary[1]["pid"] and proc.poll() is None  # dumping stopped nothing
    # What a user sees first: where each rank is, and which one to look at.
    assert re.search(r"rank 1 \(local 1, pid \d+\): not in a collective\n    ours: +before_step \(.*faults\.py", text)
    assert re.search(r"rank 0 \(local 0, pid \d+\): waits in collective (broadcast|all_reduce)", text), text
    assert "look at rank(s) [1] first" in text
    assert f"{trace / 'rank_0'}" in text and f"torchfrtrace {trace} --prefix rank_" in text
    assert seconds < 60, seconds


def test_named_pids_with_locals_into_a_chosen_folder(cli, hung_job, tmp_path):
    out, _, _ = hung_job
    dest = tmp_path / "dump"
    result = cli("debug-dump", "--pid", rank_pid(out, 1), "--locals", "--out", dest)
    assert sorted(p.name for p in dest.iterdir()) == ["rank1.txt", "summary.json", "summary.txt"], result.stdout
    # --locals: the hook's arguments, the hung rank and the step.
    assert re.search(r"^ +rank \(arg\) = 1$", (dest / "rank1.txt").read_text(), re.MULTILINE)
    assert re.search(r"^ +step \(arg\) = 3$", (dest / "rank1.txt").read_text(), re.MULTILINE)


def test_clear_errors_when_there_is_nothing_to_dump(cli, tmp_path):
    # A process that is not there, and py-spy missing (PATH without it, another interpreter's folder).
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    result = cli("debug-dump", "--pid", gone.pid, "--out", tmp_path / "a", expect=1)
    assert f"no process {gone.pid} on this machine" in result.stderr

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        missing = tmp_path / "no-py-spy"
        result = cli(
            "debug-dump", "--pid", sleeper.pid, "--out", tmp_path / "b", env={"PY_SPY": str(missing)}, expect=1
        )
        assert f"py-spy is not installed (PY_SPY={missing})" in result.stderr
        assert "pip install py-spy" in result.stderr
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_rank_whose_pid_went_to_another_process_is_not_attached_to(cli, pkg, tmp_path):
    """Ranks are found first and dumped one after another: one that ends meanwhile may leave its pid
    to another process, which is neither attached to nor reported as the rank."""
    py_spy_installed()
    dump = pkg.module("diagnostics.debug_dump")
    stranger = subprocess.Popen(["sleep", "300"])
    ended = subprocess.Popen(["true"])
    try:
        found = pkg.module("cluster.local_ranks").read_process(stranger.pid)
        identity = dump.identify(found)
        earlier = {**identity, "start_ticks": identity["start_ticks"] - 1}  # the rank that held the number
        with pytest.raises(RuntimeError) as refused:
            dump.dump_process(dump.find_py_spy(), found, earlier, False, False)
        assert str(refused.value).startswith(
            f"ended before it could be dumped: pid {stranger.pid} is now another process (started "
        ), refused.value
        assert str(refused.value).endswith(", `sleep 300`); nothing attached") and stranger.poll() is None

        # Through the command: a process that has ended (a zombie its parent has not waited for yet).
        deadline = time.monotonic() + 60  # only against a hang
        while Path(f"/proc/{ended.pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z":
            assert time.monotonic() < deadline, "`true` did not end"
            time.sleep(0.05)
        result = cli("debug-dump", "--pid", ended.pid, "--out", tmp_path / "dump", expect=1)
        line = f"NOT DUMPED: ended before it could be dumped: pid {ended.pid} has exited; nothing attached"
        assert line in result.stdout, result.stdout
        assert sorted(p.name for p in (tmp_path / "dump").iterdir()) == ["summary.json", "summary.txt"]
    finally:
        stranger.kill()
        stranger.wait()
        ended.wait()


def test_a_rank_in_our_data_modules_waits_in_data_loading(pkg):
    """The token stream and a family's own batches are data loading wherever the package keeps them."""
    for module in ("data/tokens.py", "models/bert/data.py", "models/any_family/data.py", "training/prefetch.py"):
        frame = {"filename": f"/opt/src/{pkg.name}/{module}", "name": "__next__", "line": 0}
        where = pkg.rank_stacks.where([{"os_thread_id": 7, "frames": [frame]}], 7, pkg.name)
        assert where["waits_in"] == "data loading", (module, where)
