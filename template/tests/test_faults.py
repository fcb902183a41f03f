"""Faults on CPU with real processes: a rank killed with SIGKILL and brought back by torchrun, a
stop signal (preemption), a crash in the middle of a checkpoint save, a resume on another world
size, a launcher killed with SIGKILL (its ranks save and end by themselves). Each interrupted run
must end with the metrics of the uninterrupted run_2proc / run_1proc (same seed, same data, CPU:
bitwise equal)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import TRAIN_OVERRIDES, subprocess_env
from test_launch import flag, torchrun_args

# Slow steps give the test time to act in the middle of a run (faults.py).
SLOW = {"TRAIN_FAULT_STEP_SECONDS": "0.3"}
COMPARED = ("loss", "grad_norm", "lr", "tokens", "val_loss", "val_bpb")


def same_numbers(records: list[dict]) -> dict:
    """step -> the values an interrupted run must reproduce exactly (timings left out)."""
    out: dict = {}
    for r in records:
        out.setdefault(r["step"], {}).update({k: r[k] for k in COMPARED if k in r})
    return out


def assert_same_run(metrics, got: Path, reference: Path) -> None:
    train, val = metrics(got)
    ref_train, ref_val = metrics(reference)
    steps = [r["step"] for r in train]
    assert steps == sorted(set(steps)), f"a step was logged twice: {steps}"
    assert same_numbers(train) == same_numbers(ref_train)
    # Validation at the reference's steps (a run stopped on purpose at max_steps also evaluated there).
    got_val = same_numbers(val)
    assert {step: got_val.get(step) for step in same_numbers(ref_val)} == same_numbers(ref_val)


def wait_for(predicate, what: str, proc, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"exited ({proc.returncode}) before {what}:\n{log.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout} s:\n{log.read_text()[-4000:]}")
        time.sleep(0.2)


def rank_pids(output_dir: Path) -> dict[int, int]:
    """Global rank -> pid of the training processes writing to output_dir."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"train" in cmdline and f"run.output_dir={output_dir}".encode() in cmdline:
            env = dict(item.split(b"=", 1) for item in environ if b"=" in item)
            if b"RANK" in env:
                found[int(env[b"RANK"])] = int(entry.name)
    return found


def launch_args(demo_data: Path, out: Path, nproc: int, *extra: str) -> list[str]:
    return [
        "launch",
        "devmachine",
        "--nproc-per-node",
        str(nproc),
        *TRAIN_OVERRIDES,
        f"data.dir={demo_data}",
        f"run.output_dir={out}",
        *extra,
    ]


def ended(proc: subprocess.Popen, logs: list[Path], timeout: float = 240) -> int:
    """proc's exit code, or the test fails naming the wait and showing the logs' ends (a run that
    hangs fails with what it printed, not with a bare TimeoutExpired)."""
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"still running after {timeout} s:\n" + "".join(log.read_text()[-4000:] for log in logs))


def test_a_killed_rank_is_restarted_and_the_run_ends_as_if_never_killed(cli, demo_data, run_2proc, metrics, tmp_path):
    """kill -9 of rank 1 under plain `torchrun --max-restarts 3`, whose agent hands every attempt's
    ranks one store: the restarted ranks start their group in a namespace of their own
    (runtime/distributed.py start_group) and the run ends with the uninterrupted run's numbers.
    Rank 0 starts its group 2 s late at every attempt, so the restarted rank 1 meets the start of
    the attempt it replaces first (its dead peer's address once made both ranks wait, silent, until
    the collective timeout). A start that cannot complete ends in one line within half the
    collective timeout (here 30 s), well inside this test's limit."""
    out, log = tmp_path / "run", tmp_path / "log"
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    train = ["-m", cli.package, "train", *TRAIN_OVERRIDES, f"data.dir={demo_data}", f"run.output_dir={out}"]
    cmd = [*torchrun, "--max-restarts", "3", *train, "run.collective_timeout_minutes=1"]
    # What `launch` sets (a fresh store per attempt) is left out: the shared store is the case here.
    env = subprocess_env({**SLOW, "TRAIN_FAULT_START_DELAY": "0:2", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": None})
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=cli.root, env=env, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(
            lambda: (out / "checkpoints" / "step_00000010.pt").exists() and len(rank_pids(out)) == 2,
            "checkpoint of step 10",
            proc,
            log,
        )
        os.kill(rank_pids(out)[1], signal.SIGKILL)
        code = ended(proc, [log])
    finally:
        cli.stop(proc)
    text = log.read_text()
    assert code == 0, text[-4000:]
    # One restart, and its start completed: the first restarted group resumed.
    assert text.count("resumed from") == 1 and "did not start" not in text, text[-4000:]
    assert_same_run(metrics, out, run_2proc[0])


def test_a_rank_whose_group_cannot_start_says_whom_it_waited_for_and_exits(cli, demo_data, tmp_path):
    """Rank 0 starts its group 10 minutes late: rank 1 waits for rank 0's store no longer than half
    the collective timeout (here 3 s), says so in one line and exits 1; with no restart left the
    job ends, instead of waiting without a word."""
    out = tmp_path / "run"
    extra = ["cluster.max_restarts=0", "run.collective_timeout_minutes=0.1", "cluster.stop_grace_seconds=3"]
    proc = cli(
        *launch_args(demo_data, out, 2, *extra), env={"TRAIN_FAULT_START_DELAY": "0:600"}, expect=None, timeout=120
    )
    assert proc.returncode != 0, (proc.stdout + proc.stderr)[-3000:]
    # Rank 1's whole output (`launch devmachine` keeps each rank's in a file of its own).
    (rank_1,) = (out / "logs").rglob("attempt_0/1/stderr.log")
    assert re.fullmatch(
        r"rank 1: the process group did not start within 3 s \(half the collective timeout\): waiting for "
        r"rank 0's store at [\w.]+:\d+; exit 1 \(attempt 1 of 1 under torchrun\): no restarts left, the job ends\n",
        rank_1.read_text(),
    ), rank_1.read_text()


START = """
import sys
from datetime import timedelta
from {package}.runtime.distributed import init_distributed
info = init_distributed("cpu", timedelta(minutes=1), timedelta(seconds=float(sys.argv[1])))
print("started rank", info.rank)
"""


def _ranks_on_an_agent_store(cli, store, world: int, ranks: list[int], bound: float, env=None) -> dict[int, tuple]:
    """Start `ranks` of a world of `world` as torchrun's second attempt starts them when its agent
    shares its store (`store`, hosted by the test); rank -> (exit code, stdout, stderr)."""
    procs = {}
    for rank in ranks:
        agent = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1"}
        agent.update(MASTER_PORT=str(store.port), TORCHELASTIC_USE_AGENT_STORE="True")
        agent.update(TORCHELASTIC_RESTART_COUNT="1", TORCHELASTIC_MAX_RESTARTS="3")
        procs[rank] = subprocess.Popen(
            [sys.executable, "-c", START.format(package=cli.package), str(bound)],
            cwd=cli.root,
            env=subprocess_env({**agent, **(env or {})}),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    try:
        return {rank: (p.wait(timeout=120), *p.communicate()) for rank, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()


def _agent_store():
    from datetime import timedelta

    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False)


def test_restarted_ranks_that_read_the_attempt_before_still_start_together(cli, pkg):
    """The agent's store still holds the start of the attempt before (its token, the rank 1 it
    admitted): rank 1 reads it first, rank 0 comes a second later, and both start their group."""
    store = _agent_store()
    store.set(pkg.distributed.ATTEMPT_KEY, "earlier")
    store.set("group_start/earlier/admitted/1", "a-rank-that-died")
    done = _ranks_on_an_agent_store(cli, store, 2, [1, 0], 60, env={"TRAIN_FAULT_START_DELAY": "0:1"})
    assert {rank: (code, out) for rank, (code, out, _) in done.items()} == {
        0: (0, "started rank 0\n"),
        1: (0, "started rank 1\n"),
    }, done


def test_ranks_name_the_rank_that_never_came(cli):
    """Rank 2 of 3 never starts: ranks 0 and 1 each name it in one line after the bound."""
    store = _agent_store()
    done = _ranks_on_an_agent_store(cli, store, 3, [0, 1], 2)
    for rank, (code, out, err) in done.items():
        assert code == 1 and out == "", (rank, out, err)
        assert err.splitlines() == [
            f"rank {rank}: the process group did not start within 2 s (run.start_timeout_minutes): waiting for "
            f"rank 2 to reach the store at 127.0.0.1:{store.port}; exit 1 (attempt 2 of 4 under torchrun): "
            "torchrun starts the group again, 2 restart(s) left"
        ], err


def test_a_killed_rank_on_another_node_restarts_both_nodes(cli, demo_data, run_2proc, metrics, tmp_path, port):
    """Two torchrun agents on loopback, one rank each (c10d rendezvous at node 0). SIGKILL of the
    rank on node 1: its agent restarts it, node 0's agent sees the new round and restarts its rank
    too; both resume from the latest checkpoint."""
    out = tmp_path / "run"
    nodes, logs = [], [tmp_path / "node0.log", tmp_path / "node1.log"]
    try:
        for rank in (0, 1):
            nodes.append(
                cli.start(
                    "launch",
                    "devmachine",
                    "--nnodes",
                    "2",
                    "--node-rank",
                    str(rank),
                    "--master-addr",
                    "127.0.0.1",
                    "--master-port",
                    str(port),
                    "--nproc-per-node",
                    "1",
                    *TRAIN_OVERRIDES,
                    f"data.dir={demo_data}",
                    f"run.output_dir={out}",
                    log=logs[rank],
                    env=SLOW,
                )
            )
        wait_for(
            lambda: (out / "checkpoints" / "step_00000010.pt").exists() and len(rank_pids(out)) == 2,
            "checkpoint of step 10",
            nodes[0],
            logs[0],
        )
        node1_rank = next(pid for pid in rank_pids(out).values() if _launched_by(pid, nodes[1].pid))
        os.kill(node1_rank, signal.SIGKILL)
        codes = [ended(node, logs, 300) for node in nodes]
    finally:
        for node in nodes:
            cli.stop(node)
    text = "".join(log.read_text() for log in logs)
    assert codes == [0, 0], text[-6000:]
    assert "resumed from" in text
    assert_same_run(metrics, out, run_2proc[0])


def test_global_rank_0_stays_on_node_0_when_node_1_starts_first(cli, demo_data, metrics, tmp_path, port, pkg):
    """torchrun's plain c10d rendezvous numbers the nodes by address and agent pid: on one machine
    the agent started first would run global rank 0. The two launchers' own commands (their
    --dry-run) run here with node 1's agent started first: global rank 0 runs under node 0's agent,
    and again after SIGKILL of node 1's rank made both agents restart from the checkpoint."""
    out = tmp_path / "run"
    commands = {}
    for rank in (0, 1):
        dry = cli(
            *("launch", "devmachine", "--dry-run", "--nnodes", "2", "--node-rank", rank, "--nproc-per-node", "1"),
            *("--master-addr", "127.0.0.1", "--master-port", port, *TRAIN_OVERRIDES),
            *(f"data.dir={demo_data}", f"run.output_dir={out}"),
        )
        commands[rank] = torchrun_args(dry.stdout)
        assert flag(commands[rank], "--rdzv-conf") == f"is_host={'true' if rank == 0 else 'false'},node_rank={rank}"
        assert commands[rank][1:3] == ["-m", f"{cli.package}.cluster.rendezvous"], commands[rank]
    # What the node supervisor gives its ranks: one job identity across restarts (run_lock.py).
    env = subprocess_env({**SLOW, pkg.run_lock.IDENTITY: f"two-node test at 127.0.0.1:{port}"})
    agents, logs = {}, {rank: tmp_path / f"node{rank}.log" for rank in (0, 1)}
    try:
        for rank in (1, 0):  # node 1's agent first: the lower pid, plain c10d's first node here
            with open(logs[rank], "w") as log:
                agents[rank] = subprocess.Popen(
                    commands[rank], cwd=cli.root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
                )
        # Plain c10d sorts the nodes by (address, agent pid), not by who joins first: the order of the
        # two starts is the case tested, whatever the timing. (Pids that wrapped between them would not be.)
        assert agents[1].pid < agents[0].pid, "pids wrapped between the two starts: node 1's agent is not first"
        wait_for(
            lambda: (out / "checkpoints" / "step_00000010.pt").exists() and len(rank_pids(out)) == 2,
            "checkpoint of step 10",
            agents[0],
            logs[0],
        )
        first = rank_pids(out)
        assert _launched_by(first[0], agents[0].pid) and _launched_by(first[1], agents[1].pid), first
        os.kill(first[1], signal.SIGKILL)
        wait_for(
            lambda: len(now := rank_pids(out)) == 2 and not set(now.values()) & set(first.values()),
            "both ranks restarted",
            agents[0],
            logs[0],
        )
        again = rank_pids(out)
        assert _launched_by(again[0], agents[0].pid) and _launched_by(again[1], agents[1].pid), again
        try:
            codes = [agents[rank].wait(timeout=300) for rank in (0, 1)]
        except subprocess.TimeoutExpired:
            pytest.fail(
                "the agents did not finish in 300 s:\n" + "".join(log.read_text()[-4000:] for log in logs.values())
            )
    finally:
        for agent in agents.values():
            cli.stop(agent)
    text = "".join(log.read_text() for log in logs.values())
    assert codes == [0, 0], text[-6000:]
    assert "resumed from" in logs[0].read_text(), text[-6000:]  # rank 0 printed it, on node 0
    train, _ = metrics(out)
    assert train[-1]["step"] == 30, train


def _launched_by(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return False
        pid = int(stat.rsplit(")", 1)[1].split()[1])  # field 4: the parent pid
    return False


def test_sigterm_to_the_launcher_saves_at_the_next_logging_step_and_exits_preempted(
    cli, demo_data, run_2proc, metrics, tmp_path, pkg
):
    out = tmp_path / "run"
    log = tmp_path / "log"
    proc = cli.start(*launch_args(demo_data, out, 2), log=log, env=SLOW)
    try:
        wait_for(lambda: "step     10/30" in log.read_text(), "step 10", proc, log)
        proc.send_signal(signal.SIGTERM)  # the launcher only, as Kubernetes signals a pod's first process
        code = proc.wait(timeout=120)
    finally:
        cli.stop(proc)
    text = log.read_text()
    assert code == pkg.preemption.EXIT_PREEMPTED, text[-4000:]
    record = pkg.preemption.read_marker(out, since=0)
    step = record["step"]
    # The ranks agree at logging steps (every 5), after the line: a signal seen at step 10's stops there.
    assert 10 <= step < 30 and step % 5 == 0 and record["signal"] == "SIGTERM", record
    saved = out / "checkpoints" / f"step_{step:08d}.pt"
    assert saved.is_file() and pkg.checkpoint.find_latest(out / "checkpoints") == saved
    assert f"preempted by SIGTERM at step {step}: checkpoint {saved} is saved" in text

    again = cli(*launch_args(demo_data, out, 2))
    assert f"resumed from {saved} at step {step}" in again.stdout
    assert not (out / "preempted.json").exists()  # a finished run leaves no stale marker
    assert_same_run(metrics, out, run_2proc[0])


def test_where_steps_are_slow_a_stop_is_agreed_on_within_the_grace_not_at_the_next_logging_step(
    cli, demo_data, tmp_path, pkg
):
    """With steps that make logging.every_steps outlast a quarter of cluster.stop_grace_seconds, the
    ranks agree on a stop after fewer steps (0.3 s steps against 1 s of a 4 s grace: every third): a
    SIGTERM after step 10's checkpoint stops within a step or two, where it waited for step 30 (the
    next logging step) and torchrun killed the ranks unsaved after the grace."""
    out = tmp_path / "run"
    log = tmp_path / "log"
    slow = launch_args(demo_data, out, 2, "logging.every_steps=30", "cluster.stop_grace_seconds=4")
    proc = cli.start(*slow, log=log, env=SLOW)
    checkpoint = out / "checkpoints" / "step_00000010.pt"
    try:
        wait_for(checkpoint.is_file, "the checkpoint of step 10", proc, log)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        cli.stop(proc)
    text = log.read_text()
    assert code == pkg.preemption.EXIT_PREEMPTED, text[-4000:]
    step = pkg.preemption.read_marker(out, since=0)["step"]
    assert 10 <= step <= 14, f"stopped at step {step}:\n{text[-4000:]}"
    again = cli(*slow)
    assert f"resumed from {out / 'checkpoints' / f'step_{step:08d}.pt'} at step {step}" in again.stdout


def test_sigusr1_stops_a_single_process_run_with_a_checkpoint(cli, demo_data, run_1proc, metrics, tmp_path, pkg):
    """No torchrun (mpirun, srun and TI-ONE's MPI mode start ranks this way): `train` itself exits 143."""
    out = tmp_path / "run"
    log = tmp_path / "log"
    args = ["train", *TRAIN_OVERRIDES, f"data.dir={demo_data}", f"run.output_dir={out}"]
    proc = cli.start(*args, log=log, env=SLOW)
    try:
        wait_for(lambda: "step      5/30" in log.read_text(), "step 5", proc, log)
        proc.send_signal(signal.SIGUSR1)  # Slurm's --signal=USR1@N warning before the time limit
        code = proc.wait(timeout=120)
    finally:
        cli.stop(proc)
    assert code == pkg.preemption.EXIT_PREEMPTED, log.read_text()[-4000:]
    assert "preempted (SIGUSR1)" in log.read_text()
    cli(*args)
    assert_same_run(metrics, out, run_1proc[0])


def test_a_crash_during_a_save_leaves_the_previous_checkpoint(cli, demo_data, run_1proc, metrics, tmp_path, pkg):
    out = tmp_path / "run"
    ckpt = out / "checkpoints"
    args = ["train", *TRAIN_OVERRIDES, f"data.dir={demo_data}", f"run.output_dir={out}"]
    cli(*args, "schedule.max_steps=10")  # constant lr after warmup: the first 10 steps of the 30-step run
    log = tmp_path / "log"
    proc = cli.start(*args, log=log, env={"TRAIN_FAULT_PAUSE_BEFORE_COMMIT": "600"})
    try:
        wait_for(lambda: "pausing" in log.read_text(), "the pause before the rename", proc, log)
        partial = [p.name for p in ckpt.iterdir() if p.name.startswith(".step_00000020.pt.tmp")]
        assert partial, sorted(p.name for p in ckpt.iterdir())
        os.killpg(proc.pid, signal.SIGKILL)  # the machine dies between write and rename
        proc.wait()
    finally:
        cli.stop(proc)
    # The half-made save is invisible: listing, `latest` and loading all give step 10.
    assert [p.name for p in pkg.checkpoint.list_checkpoints(ckpt)] == ["step_00000010.pt"]
    latest = pkg.checkpoint.find_latest(ckpt)
    assert latest == ckpt / "step_00000010.pt" and pkg.checkpoint.load(latest)["step"] == 10

    again = cli(*args)
    assert f"resumed from {ckpt / 'step_00000010.pt'} at step 10" in again.stdout
    assert_same_run(metrics, out, run_1proc[0])


def test_another_world_size_is_refused_unless_resharding_is_asked_for(cli, demo_data, run_2proc, tmp_path, metrics):
    import shutil

    out = tmp_path / "run"
    shutil.copytree(run_2proc[0] / "checkpoints", out / "checkpoints")
    args = ["train", *TRAIN_OVERRIDES, f"data.dir={demo_data}", f"run.output_dir={out}", "schedule.max_steps=35"]
    refused = cli(*args, expect=None)
    assert refused.returncode != 0
    assert "written by 2 processes; this run has 1" in refused.stderr and "checkpoint.reshard=true" in refused.stderr

    resharded = cli(*args, "checkpoint.reshard=true")
    assert "resharded from 2 to 1 processes" in resharded.stdout
    assert "schedule.max_steps 30 -> 35" in resharded.stdout  # a changed setting is reported, not refused
    train, _ = metrics(out)
    assert train[-1]["step"] == 35


@pytest.mark.parametrize("debug", [False, True])
def test_a_hung_rank_times_out_sooner_under_debug(cli, demo_data, tmp_path, debug):
    """Rank 1 stops before step 3; rank 0 waits in the gradient all-reduce until the collective
    timeout. Under debug the timeout is run.debug_timeout_minutes (here 0.1 = 6 s, against 9 s).
    The hung rank ignores the SIGTERM torchrun sends once rank 0 failed: torchrun kills it 30 s later
    (its own wait after a failure, whatever cluster.stop_grace_seconds says)."""
    out = tmp_path / "run"
    extra = [
        "run.debug_timeout_minutes=0.1",
        "run.collective_timeout_minutes=0.15",
        "cluster.max_restarts=0",
        "cluster.stop_grace_seconds=3",
    ]
    env = {"TRAIN_FAULT_HANG": "1:3", "TRAIN_DEBUG": "1" if debug else None}
    proc = cli(*launch_args(demo_data, out, 2, *extra), env=env, expect=None, timeout=240)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "rank 1 hangs before step 3" in text
    # Gloo names the timeout it waited: the process group got the one for this mode.
    assert f"Timed out waiting {6000 if debug else 9000}ms" in text, text[-3000:]
    # `launch devmachine` writes every rank's output to its own file too (under debug, `node` does as well).
    logs = list((out / "logs").rglob("stderr.log"))
    assert len(logs) >= 2 and any("hangs before step 3" in p.read_text() for p in logs), logs


def test_a_run_hung_before_its_first_step_prints_its_stacks_and_exits(cli, demo_data, tmp_path):
    """run.first_step_timeout_minutes (here 0.3 = 18 s, past a loaded machine's start): a rank without
    a first step says so with its Python stacks (here: the fault's sleep before step 0) and exits 1,
    for the platform to restart it."""
    args = ["train", *TRAIN_OVERRIDES, f"data.dir={demo_data}", f"run.output_dir={tmp_path / 'run'}"]
    proc = cli.run(
        [*cli.command(*args, "run.first_step_timeout_minutes=0.3")],
        env={"TRAIN_FAULT_HANG": "0:0"},
        expect=1,
        timeout=120,
    )
    assert "error: rank 0: no first step 0.3 minutes after the start (run.first_step_timeout_minutes)" in proc.stderr
    assert "in before_step" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _still_running(pids, seconds: float) -> list[int]:
    """Those of `pids` still running (a zombie has ended) once all ended or `seconds` passed."""
    deadline = time.monotonic() + seconds
    while True:
        running = []
        for pid in pids:
            try:
                if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    running.append(pid)
            except OSError:
                pass
        if not running or time.monotonic() > deadline:
            return running
        time.sleep(0.2)


def _kill_during_run(cli, demo_data, tmp_path, victim: str, ready: str, *extra: str, env=None):
    """Start a 2-rank run, SIGKILL torchrun or the launcher above it once `ready` is logged; return
    (supervisor process, rank pids, torchrun pid, log)."""
    out = tmp_path / "run"
    log = tmp_path / "log"
    proc = cli.start(*launch_args(demo_data, out, 2, *extra), log=log, env={**SLOW, **(env or {})})
    wait_for(lambda: ready in log.read_text() and len(rank_pids(out)) == 2, ready, proc, log)
    pids = rank_pids(out)
    ranks = [pids[rank] for rank in sorted(pids)]
    (agent,) = _children(proc.pid)  # the supervisor's one child: torchrun
    assert all(_launched_by(rank, agent) for rank in ranks)
    os.kill(agent if victim == "torchrun" else proc.pid, signal.SIGKILL)
    return proc, ranks, agent, log


@pytest.mark.parametrize("victim", ["torchrun", "launcher"])
def test_ranks_save_and_end_when_their_launcher_is_killed(cli, demo_data, tmp_path, pkg, victim):
    """SIGKILL passes nothing on, and torchrun starts its ranks in sessions of their own: the kernel
    signals them instead (preemption.follow_launcher), they save and end within seconds, whether
    torchrun's agent was killed or the supervisor above it."""
    out = tmp_path / "run"
    # 100 steps: left alone the ranks would train on for half a minute more.
    extra = "schedule.max_steps=100"
    proc, ranks, agent, log = _kill_during_run(cli, demo_data, tmp_path, victim, "step     10/100", extra)
    try:
        running = _still_running([*ranks, agent], 20)
        assert not running, f"still running 20 s after the {victim} was killed: {running}\n{log.read_text()[-4000:]}"
        code = proc.wait(timeout=20) if victim == "torchrun" else None
    finally:
        cli.stop(proc)
    record = pkg.preemption.read_marker(out, since=0)
    assert record is not None and 10 <= record["step"] < 20 and record["signal"] == "SIGTERM", log.read_text()[-4000:]
    assert (out / "checkpoints" / f"step_{record['step']:08d}.pt").is_file()
    if victim == "torchrun":  # the supervisor outlived torchrun: it waited for the ranks' save
        text = log.read_text()
        assert code == pkg.preemption.EXIT_PREEMPTED, text[-4000:]
        ended = [f"process {rank}, left behind by the launcher, ended with exit code 143" for rank in ranks]
        assert all(line in text for line in ended), f"{ended} expected:\n{text[-4000:]}"


def test_ranks_stuck_in_a_collective_end_after_the_grace_when_torchrun_is_killed(cli, demo_data, tmp_path):
    """Rank 1 hangs before step 12 and rank 0 waits for it in a collective (5 minutes before it
    times out): with their torchrun killed, both end about cluster.stop_grace_seconds later."""
    extra = ["cluster.stop_grace_seconds=3", "run.collective_timeout_minutes=5"]
    ready = "rank 1 hangs before step 12"
    proc, ranks, agent, log = _kill_during_run(
        cli, demo_data, tmp_path, "torchrun", ready, *extra, env={"TRAIN_FAULT_HANG": "1:12"}
    )
    try:
        running = _still_running(ranks, 20)
        assert not running, f"still running 20 s after torchrun was killed: {running}\n{log.read_text()[-4000:]}"
        proc.wait(timeout=20)
    finally:
        cli.stop(proc)
    # The hung rank's own alarm ended it (the supervisor's SIGKILL would come 10 s later).
    assert f"process {ranks[1]}, left behind by the launcher, ended by signal {signal.SIGALRM.value}" in log.read_text()


FOLLOW_LAUNCHER = """
import sys
from {package}.training.preemption import SUPERVISOR_PID, follow_launcher
follow_launcher(dict([(SUPERVISOR_PID, sys.argv[1])]) if sys.argv[1] else dict())
print("started")
"""


def test_a_rank_whose_launcher_died_before_it_started_ends_at_once(cli, pkg):
    """Its parent is then the supervisor (which adopts orphans): nothing to save, it ends at once.
    Under a living launcher, or outside any (`train` from a shell), it goes on."""
    program = FOLLOW_LAUNCHER.format(package=pkg.name)
    orphan = cli.run([sys.executable, "-c", program, os.getpid()], expect=None)  # this process: its parent
    assert orphan.returncode == -signal.SIGTERM and "started" not in orphan.stdout, orphan
    for supervisor in (os.getppid(), ""):
        assert cli.run([sys.executable, "-c", program, supervisor]).stdout == "started\n"


ENDING = """
import atexit, sys
from {package}.runtime import process_exit
atexit.register(lambda: print("exit hook ran"))
if sys.argv[1] == "joined":
    process_exit.joined_group()
print("buffered, not flushed", end=" ")
process_exit.end(3)
"""


@pytest.mark.parametrize("joined", ["joined", "alone"])
def test_a_process_ends_with_its_code_its_exit_hooks_and_all_its_output(cli, pkg, joined):
    """A rank that joined a process group leaves without finalization (runtime/process_exit.py):
    its exit hooks still run and what it printed into a pipe's buffer still arrives."""
    ended = cli.run([sys.executable, "-c", ENDING.format(package=pkg.name), joined], expect=3)
    assert ended.stdout == "buffered, not flushed exit hook ran\n", ended
