"""Nothing a user does by mistake loses a run: a new run on a folder that holds another, two runs on
one folder, a damaged checkpoint, a full disk. Real torchrun on CPU and real files; every refusal is
one line with the way out, no traceback, and leaves every file of the earlier run byte-identical."""

from __future__ import annotations

import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TRAIN_OVERRIDES, subprocess_env
from test_faults import assert_same_run, launch_args, wait_for

CKPT = "checkpoints"


def tree(folder: Path) -> dict[str, str]:
    """sha256 of every file under folder (the rank logs torchrun adds under logs/ left out)."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.relative_to(folder).parts[0] != "logs"
    }


def last_line(text: str) -> str:
    return text.strip().splitlines()[-1]


def restarted(out: Path) -> list[Path]:
    """torchrun's attempts after the first (its --log-dir has a folder per attempt)."""
    return sorted(p for p in (out / "logs").rglob("attempt_*") if p.name != "attempt_0")


def assert_one_line_refusal(proc, *fragments: str) -> None:
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1, out[-4000:]
    line = last_line(proc.stderr)
    assert line.startswith("error: ") and all(f in line for f in fragments), line
    assert "Traceback" not in out, out[-4000:]


def damage(path: Path, how: str) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 3])
    elif how == "empty":
        path.write_bytes(b"")
    elif how == "garbage":
        path.write_bytes(os.urandom(len(data)))
    elif how == "one flipped byte":
        path.write_bytes(data[:1000] + bytes([data[1000] ^ 0xFF]) + data[1001:])


@pytest.fixture
def earlier_run(run_2proc, tmp_path) -> Path:
    """A copy of the finished 30-step run (checkpoints 10, 20, 30 with manifests, metrics)."""
    out = tmp_path / "run"
    shutil.copytree(run_2proc[0], out, ignore=shutil.ignore_patterns("logs"))
    return out


# ---------------------------------------------------------------------------------------------
# Without training: what a damaged checkpoint looks like, whose checkpoints keep_last deletes, the lock


@pytest.mark.parametrize(
    "how, manifest, expected",
    [
        ("truncated", True, "step_00000010.pt has {third:,} bytes, its manifest says {size:,}"),
        ("empty", True, "step_00000010.pt has 0 bytes, its manifest says {size:,}"),
        ("garbage", True, "step_00000010.pt does not match the sha256 in its manifest"),
        ("one flipped byte", True, "step_00000010.pt does not match the sha256 in its manifest"),
        ("truncated", False, "step_00000010.pt is not a complete checkpoint file ({third:,} bytes)"),
        ("empty", False, "step_00000010.pt is not a complete checkpoint file (0 bytes)"),
        ("garbage", False, "step_00000010.pt is not a complete checkpoint file ({size:,} bytes)"),
        ("one flipped byte", False, "step_00000010.pt: archive/data/0 fails its CRC check"),
    ],
)
def test_a_damaged_checkpoint_is_named_with_what_is_wrong(pkg, tmp_path, how, manifest, expected):
    """With its manifest (sizes, sha256), and for checkpoints older than manifests (the zip CRCs)."""
    ck, files = pkg.checkpoint, pkg.checkpoint_files
    path = ck.save(tmp_path, 10, {"w": torch.arange(1000, dtype=torch.float32)}, keep_last=3, run_id="r")
    size = path.stat().st_size
    if not manifest:  # a checkpoint written before manifests existed
        files.manifest_path(path).unlink()
    assert files.problem(path) is None
    damage(path, how)
    assert files.problem(path) == expected.format(size=size, third=size // 3)


def test_a_damaged_manifest_or_a_missing_shard_is_a_damaged_checkpoint(pkg, tmp_path):
    files = pkg.checkpoint_files
    folder = tmp_path / "step_00000010"
    folder.mkdir()
    for rank in (0, 1):
        torch.save({"rank": rank}, folder / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    entries = {p.name: files.file_entry(p) for p in folder.iterdir()}
    files.write_manifest(folder / files.MANIFEST, "r", 10, entries)
    assert files.problem(folder) is None
    assert files.problem(folder, part=(1, 2)) is None  # each rank verifies its share
    (folder / "zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    assert files.problem(folder) == "zero_pp_rank_1_mp_rank_00_optim_states.pt is missing"
    assert files.problem(folder, part=(0, 2)) is None and files.problem(folder, part=(1, 2)) is not None
    (folder / files.MANIFEST).write_text("{not json")
    assert files.problem(folder) == "its manifest manifest.json is unreadable"


def test_keep_last_deletes_only_the_checkpoints_of_the_run_that_wrote_them(pkg, tmp_path):
    ck, files = pkg.checkpoint, pkg.checkpoint_files
    for step in (1, 2, 3):
        ck.save(tmp_path, step, {"step": step}, keep_last=5, run_id="other run")
    torch.save({"step": 4}, tmp_path / "step_00000004.pt")  # written before manifests existed
    before = tree(tmp_path)
    for step in (10, 20, 30, 40):
        ck.save(tmp_path, step, {"step": step}, keep_last=2, run_id="this run")
    mine = [p.name for p in files.own(files.list_files(tmp_path), "this run")]
    assert mine == ["step_00000030.pt", "step_00000040.pt"]
    after = tree(tmp_path)
    assert {k: after.get(k) for k in before if k != "latest"} == {k: v for k, v in before.items() if k != "latest"}
    assert "step_00000010.pt" not in after and "step_00000010.pt.json" not in after


@pytest.mark.parametrize(
    "env, platform, nnodes, expected",
    [
        ({"TRAIN_JOB_IDENTITY": "launch pid 7 on a", "SLURM_JOB_ID": "5"}, None, 1, "launch pid 7 on a"),
        pytest.param(
            {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0", "TORCHELASTIC_RUN_ID": "x"},
            None,
            1,
            "slurm job 5 step 0",
            marks=pytest.mark.part("slurm"),
        ),
        pytest.param(
            {"SLURM_JOB_ID": "5", "SLURM_STEP_ID": "0"},
            "slurm",
            2,
            "slurm job 5 step 0",
            marks=pytest.mark.part("slurm"),
        ),
        ({"SLURM_JOB_ID": "5"}, "devmachine", 1, None),  # a dev machine Slurm lent is not its job
        ({}, "kubeflow", 1, "kubeflow job at m:29500"),  # a restarted pod meets at the same address
        ({}, "devmachine", 2, "devmachine job at m:29500"),
        ({"TORCHELASTIC_RUN_ID": "3f2a"}, None, 1, "torchrun run 3f2a"),
        ({"TORCHELASTIC_RUN_ID": "none"}, None, 1, None),  # torchrun without --rdzv-id: no identity
    ],
)
def test_a_jobs_identity_survives_its_restarts(pkg, env, platform, nnodes, expected):
    topo = pkg.topology.Topology(platform, nnodes, 0, 2, "m", 29500) if platform else None
    assert pkg.run_lock.job_identity(env, topo) == expected


def _holder_on(machine: str, job: str = "slurm job 77") -> dict:
    return {"job": job, "host": machine.split()[0], "pid": 4242, "machine": machine, "started": time.time()}


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


@pytest.mark.parametrize(
    "case, holder, minutes_old, identity, write, outcome",
    [
        ("another job, alive here", "self", 0, "job B", True, "refused"),
        ("the same job, alive here", "self", 0, "job A", True, "entered"),
        ("another job, process gone here", "dead", 0, "job B", True, "taken"),
        ("another job on another machine", "elsewhere", 3, "job B", True, "refused"),
        ("another job on another machine, heartbeat stopped", "elsewhere", 20, "job B", True, "taken"),
        ("the same job on another machine (its node 0)", "elsewhere", 3, "job A", True, "entered"),
        ("no lock, a node that only checks", None, 0, "job B", False, "entered"),
        ("another job, alive here, a node that only checks", "self", 0, "job B", False, "refused"),
    ],
)
def test_the_lock_lets_in_the_same_job_and_takes_over_only_from_one_that_is_gone(
    pkg, tmp_path, case, holder, minutes_old, identity, write, outcome
):
    lock_mod = pkg.run_lock
    path = tmp_path / lock_mod.LOCK_NAME
    held = None
    if holder == "self":
        held = lock_mod.acquire(tmp_path, "job A")
    elif holder == "dead":
        record = {**_holder_on(lock_mod._machine(), "job A"), "pid": _dead_pid()}
        path.write_text(json.dumps(record))
    elif holder == "elsewhere":
        path.write_text(json.dumps(_holder_on("gpu-07 another-boot-id", "job A")))
        old = time.time() - minutes_old * 60
        os.utime(path, (old, old))
    before = path.read_text() if path.exists() else None
    try:
        if outcome == "refused":
            with pytest.raises(pkg.run_lock.FolderInUse, match=r"is in use by another run: job A \(pid \d+ on "):
                lock_mod.acquire(tmp_path, identity, write=write)
            assert path.read_text() == before
            return
        lock = lock_mod.acquire(tmp_path, identity, write=write)
        assert lock.owned == (outcome == "taken") and lock.job == identity
        if outcome == "taken":
            assert json.loads(path.read_text())["job"] == identity
            lock.release()
            assert not path.exists()
        else:
            lock.release()  # a visitor leaves the holder's lock alone
            assert (path.read_text() if path.exists() else None) == before
    finally:
        if held is not None:
            held.release()


# ---------------------------------------------------------------------------------------------
# Real runs: refusals, take-overs, damaged checkpoints, two runs at once, a full disk


def _hold_here(pkg, out):
    return pkg.run_lock.acquire(out, "another job")


def _hold_elsewhere(minutes_old):
    def setup(pkg, out):
        lock = out / "run.lock"
        lock.write_text(json.dumps(_holder_on("gpu-07 another-boot-id")))
        old = time.time() - minutes_old * 60
        os.utime(lock, (old, old))

    return setup


def _killed_holder(pkg, out):
    """What a run killed with SIGKILL leaves: its lock, naming a process that is gone."""
    code = f"import os, signal; from {pkg.name}.training import run_lock; run_lock.acquire({str(out)!r}, 'crashed job'); os.kill(os.getpid(), signal.SIGKILL)"
    subprocess.run([sys.executable, "-c", code], env=subprocess_env(), cwd=ROOT)


def _damage_every_checkpoint(pkg, out):
    for path in pkg.checkpoint_files.list_files(out / CKPT):
        damage(path, "truncated")


REFUSALS = {
    "resume=false on a folder holding an earlier run": (
        None,
        ["checkpoint.resume=false"],
        [
            "holds an earlier run (checkpoints up to step_00000030.pt, metrics.jsonl, config.yaml)",
            "run.output_dir={out}-2",
        ],
    ),
    "a live run on this machine holds the folder": (
        _hold_here,
        [],
        ["{out} is in use by another run: another job (pid {pid} on", "give this run another run.output_dir"],
    ),
    "a live run on another machine holds the folder": (
        _hold_elsewhere(3),
        [],
        ["in use by another run: slurm job 77 (pid 4242 on gpu-07", "if that run is gone, delete {out}/run.lock"],
    ),
    "every checkpoint is damaged": (
        _damage_every_checkpoint,
        [],
        ["every checkpoint in {out}/checkpoints is damaged (step_00000030.pt, step_00000020.pt, step_00000010.pt)"],
    ),
}


@pytest.mark.parametrize("case", REFUSALS)
def test_a_refused_start_is_one_line_and_leaves_the_earlier_run_untouched(cli, demo_data, earlier_run, pkg, case):
    setup, extra, fragments = REFUSALS[case]
    out = earlier_run
    held = setup(pkg, out) if setup else None
    before = tree(out)
    try:
        proc = cli(*launch_args(demo_data, out, 2, *extra), expect=None, timeout=180)
    finally:
        if held is not None:
            held.release()
            before.pop("run.lock")
    assert_one_line_refusal(proc, *(f.format(out=out, pid=os.getpid()) for f in fragments))
    assert restarted(out) == []  # torchrun did not restart the ranks into it
    assert tree(out) == before


TAKE_OVERS = {
    "the lock of a run killed on this machine": (_killed_holder, "from crashed job: its process"),
    "the lock of another machine whose heartbeat stopped": (_hold_elsewhere(20), "from slurm job 77: its heartbeat"),
}


@pytest.mark.parametrize("case", TAKE_OVERS)
def test_a_stale_lock_is_taken_over(cli, demo_data, earlier_run, pkg, case):
    setup, said = TAKE_OVERS[case]
    out = earlier_run
    setup(pkg, out)
    assert (out / "run.lock").exists()
    before = tree(out / CKPT)
    proc = cli(*launch_args(demo_data, out, 2))
    assert f"taking over {out / 'run.lock'} {said}" in proc.stderr
    assert "already trained to step 30" in proc.stdout and "Traceback" not in proc.stderr
    assert tree(out / CKPT) == before and not (out / "run.lock").exists()  # released at the end


def test_a_damaged_newest_checkpoint_is_passed_over_and_the_run_continues_exactly(
    cli, demo_data, earlier_run, run_2proc, metrics, pkg
):
    out, ckpt = earlier_run, earlier_run / CKPT
    damage(ckpt / "step_00000030.pt", "truncated")
    older = {k: v for k, v in tree(ckpt).items() if "00000030" not in k and k != "latest"}
    proc = cli(*launch_args(demo_data, out, 2))
    assert f"skipping damaged checkpoint {ckpt / 'step_00000030.pt'}: step_00000030.pt has " in proc.stderr
    assert f"resumed from {ckpt / 'step_00000020.pt'} at step 20" in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr
    assert_same_run(metrics, out, run_2proc[0])  # steps 25 and 30 redone, bit for bit
    assert {k: v for k, v in tree(ckpt).items() if k in older} == older
    assert pkg.checkpoint_files.problem(ckpt / "step_00000030.pt") is None
    redone = pkg.checkpoint.load(ckpt / "step_00000030.pt")["model"]
    reference = pkg.checkpoint.load(run_2proc[0] / CKPT / "step_00000030.pt")["model"]
    assert all(torch.equal(redone[k], reference[k]) for k in reference)


@pytest.mark.parametrize(
    "command, how, explicit",
    [("eval", "garbage", False), ("eval", "empty", True), ("sample", "truncated", True)],
)
def test_eval_and_sample_pass_over_a_damaged_checkpoint_or_refuse_the_one_named(
    cli, demo_data, earlier_run, command, how, explicit
):
    ckpt = earlier_run / CKPT
    damaged = ckpt / "step_00000030.pt"
    damage(damaged, how)
    args = [command, *TRAIN_OVERRIDES, f"data.dir={demo_data}", f"run.output_dir={earlier_run}"]
    if explicit:
        proc = cli(*args, "--checkpoint", damaged, expect=None)
        assert_one_line_refusal(
            proc, f"--checkpoint {damaged} is damaged: step_00000030.pt ", "pass another checkpoint"
        )
        assert len(proc.stderr.strip().splitlines()) == 1
    else:
        proc = cli(*args)
        assert f"skipping damaged checkpoint {damaged}: step_00000030.pt does not match the sha256" in proc.stderr
        assert "step 20 | val loss" in proc.stdout and "Traceback" not in proc.stderr


def test_a_second_run_on_the_same_folder_is_refused_while_the_first_goes_on(
    cli, demo_data, run_2proc, metrics, tmp_path
):
    out, log = tmp_path / "run", tmp_path / "first.log"
    first = cli.start(*launch_args(demo_data, out, 2), log=log, env={"TRAIN_FAULT_STEP_SECONDS": "0.3"})
    try:
        wait_for(lambda: "step      5/30" in log.read_text(), "step 5", first, log)
        holder = json.loads((out / "run.lock").read_text())
        assert holder["pid"] == first.pid and holder["job"] == f"launch pid {first.pid} on {holder['host']}"
        second = cli(*launch_args(demo_data, out, 2), expect=None, timeout=120)
        assert_one_line_refusal(second, f"{out} is in use by another run: launch pid {first.pid} on ")
        assert first.wait(timeout=240) == 0, log.read_text()[-4000:]
    finally:
        cli.stop(first)
    assert_same_run(metrics, out, run_2proc[0])  # nothing of the second run got in
    assert not (out / "run.lock").exists()


# A full disk, for real: a small tmpfs in a user and mount namespace (no root needed where the kernel
# allows unprivileged namespaces), filled up by another writer while the run trains. Where that is
# not allowed, the same path through RLIMIT_FSIZE: a write past the limit fails with EFBIG (Python
# ignores SIGXFSZ) exactly where a full disk fails with ENOSPC.
DRIVER = """
import hashlib, json, os, subprocess, sys, time, shutil
from pathlib import Path
spec = json.loads(sys.argv[1])
out, env, results = spec["out"], spec["env"], {}
shutil.copytree(spec["earlier"], out, dirs_exist_ok=True)
def run(name, slow=False, fill_after=None):
    log = spec["logs"] + "/" + name + ".log"
    with open(log, "w") as f:
        proc = subprocess.Popen(spec["command"], cwd=spec["root"], stdout=f, stderr=subprocess.STDOUT,
                                env={**env, **({"TRAIN_FAULT_STEP_SECONDS": "0.3"} if slow else {})})
    # The log is read while being written: a read can end inside a multi-byte character.
    while fill_after and proc.poll() is None and fill_after not in open(log, errors="replace").read():
        time.sleep(0.2)
    if fill_after:  # another writer takes all but 1 MiB
        free = shutil.disk_usage(out).free
        with open(out + "/filler", "wb") as f:
            f.write(b"x" * (free - 2**20))
    results[name] = {"code": proc.wait(), "log": open(log, errors="replace").read()}
    results[name]["tree"] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in Path(out, "checkpoints").iterdir()}
    results[name]["attempts"] = sorted({p.name for p in Path(out, "logs").rglob("attempt_*")})
    results[name]["rank_logs"] = {str(p): p.read_text(errors="replace")[-3000:]
                                  for p in Path(out, "logs").rglob("attempt_0/*/*") if p.is_file()}
run("fills up", slow=True, fill_after="step     25/30")
run("again, no room")
os.remove(out + "/filler")
run("again, room made")
shutil.copy(out + "/metrics.jsonl", spec["logs"] + "/metrics.jsonl")
json.dump(results, open(spec["logs"] + "/results.json", "w"))
"""


def _logs_tail(logs: Path) -> str:
    return "".join(f"\n--- {log.name}\n{log.read_text(errors='replace')[-2000:]}" for log in sorted(logs.glob("*.log")))


def _namespaces_allowed() -> bool:
    try:
        return subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode == 0
    except OSError:
        return False


def _earlier_half(run_2proc, tmp_path) -> Path:
    """The first 20 steps of run_2proc: checkpoints 10 and 20, `latest` at 20, metrics up to 20."""
    half = tmp_path / "earlier"
    (half / CKPT).mkdir(parents=True)
    for name in ("step_00000010.pt", "step_00000010.pt.json", "step_00000020.pt", "step_00000020.pt.json"):
        shutil.copy(run_2proc[0] / CKPT / name, half / CKPT / name)
    (half / CKPT / "latest").write_text("step_00000020.pt")
    records = [r for r in (run_2proc[0] / "metrics.jsonl").read_text().splitlines() if json.loads(r)["step"] <= 20]
    (half / "metrics.jsonl").write_text("\n".join(records) + "\n")
    return half


def test_a_disk_that_fills_up_during_a_save_stops_with_one_line_and_keeps_the_run(
    cli, demo_data, run_2proc, metrics, tmp_path
):
    if not _namespaces_allowed():
        pytest.fail(
            "this test mounts a small tmpfs with `unshare -rm`: run it as root, or allow unprivileged user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1)"
        )
    earlier = _earlier_half(run_2proc, tmp_path)
    kept = tree(earlier / CKPT)
    out, logs = tmp_path / "small-disk", tmp_path / "logs"
    out.mkdir()
    logs.mkdir()
    (tmp_path / "driver.py").write_text(textwrap.dedent(DRIVER))
    spec = {
        "out": str(out),
        "earlier": str(earlier),
        "logs": str(logs),
        "root": str(ROOT),
        "env": subprocess_env(),
        "command": cli.command(*launch_args(demo_data, out, 2)),
    }
    mount = 'mount -t tmpfs -o size=16m none "$1" && exec "$2" "$3" "$4"'
    driver = subprocess.run(
        ["unshare", "-rm", "sh", "-c", mount, "sh", out, sys.executable, tmp_path / "driver.py", json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert driver.returncode == 0, driver.stdout[-3000:] + driver.stderr[-3000:] + _logs_tail(logs)
    results = json.loads((logs / "results.json").read_text())
    ckpt = out / CKPT
    filled = results["fills up"]
    assert filled["code"] == 1 and "Traceback" not in filled["log"], filled["log"][-4000:]
    assert re.fullmatch(
        f"error: cannot save checkpoint step_00000030.pt in {re.escape(str(ckpt))}: no space left on the device; "
        r"it needs about 4.1 MiB, [\d,.]+ [KM]iB free there. step_00000020.pt is kept: make room there .* to resume",
        last_line(filled["log"]),
    ), last_line(filled["log"])
    # not restarted into the same full disk
    assert filled["attempts"] == ["attempt_0"], json.dumps(filled["rank_logs"], indent=1)[-8000:]
    assert filled["tree"] == kept  # the earlier checkpoints byte for byte, and no partial file
    again = results["again, no room"]
    assert again["code"] == 1 and "Traceback" not in again["log"]
    assert re.fullmatch(
        rf"error: {re.escape(str(ckpt))} has [\d,.]+ [KM]iB free but the next checkpoint needs about 4.1 MiB \(the size of "
        r"step_00000020.pt\): make room there .*, then run the same command",
        last_line(again["log"]),
    ), last_line(again["log"])
    made = results["again, room made"]
    assert made["code"] == 0 and f"resumed from {ckpt / 'step_00000020.pt'} at step 20" in made["log"]
    assert_same_run(metrics, logs, run_2proc[0])  # nothing lost: the run ends as if the disk never filled


def test_a_file_size_limit_during_a_save_stops_with_one_line_and_keeps_the_run(cli, demo_data, run_2proc, tmp_path):
    out = tmp_path / "run"
    shutil.copytree(_earlier_half(run_2proc, tmp_path), out)
    before = tree(out / CKPT)
    limit = 2 * 2**20  # below a checkpoint's 4 MiB, above every other file the run writes

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run(
        [str(c) for c in cli.command(*launch_args(demo_data, out, 2))],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=240,
        preexec_fn=limited,
        start_new_session=True,
    )
    assert_one_line_refusal(
        proc,
        f"cannot save checkpoint step_00000030.pt in {out / CKPT}: a file size limit (ulimit -f) is reached",
        "step_00000020.pt is kept",
    )
    assert restarted(out) == []
    assert tree(out / CKPT) == before
