"""A recorded pid is signalled only while it names the recorded process (runtime/process_identity.py),
and the node supervisor signals a process group only while its number is still the group's. Real
processes throughout; a reused pid is a live `sleep` with a record made for another process under
that number (the start tick or the command line of the process that held it before).

    python -m pytest -q tests/test_process_identity.py      # a few seconds
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest


@pytest.fixture
def identity(pkg):
    return pkg.module("runtime.process_identity")


@pytest.fixture
def stranger():
    """A live process that leads a group of its own, as a shell or a daemon given a reused number would."""
    proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


def wait_until_gone(pid: int, what: str) -> None:
    """Until pid is no process or a zombie; a bound only against a hang, far above what it takes."""
    deadline = time.monotonic() + 60
    while True:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except OSError:
            return
        if state in "ZX":
            return
        assert time.monotonic() < deadline, f"{what} (pid {pid}) still runs"
        time.sleep(0.05)


def test_a_live_process_matches_its_record_and_nothing_else_does(identity, stranger):
    record = identity.record(stranger.pid)
    assert record["pid"] == stranger.pid and record["cmdline"] == ["sleep", "300"]
    assert isinstance(record["start_ticks"], int) and record["boot_id"]
    assert identity.check(record) == identity.Verdict(True, f"pid {stranger.pid} is the recorded process")

    # The process that held the number before started at another tick: the sleep is someone else.
    earlier = identity.check({**record, "start_ticks": record["start_ticks"] - 1})
    assert earlier.running is False
    assert earlier.why.startswith(f"pid {stranger.pid} is now another process (started ")
    assert earlier.why.endswith(" UTC, `sleep 300`)"), earlier.why
    rebooted = identity.check({**record, "boot_id": "0" * 36})
    assert rebooted.running is False and "another boot" in rebooted.why
    other_program = identity.check({**record, "cmdline": ["python", "train.py"]})
    assert other_program.running is False and "now runs another program (`sleep 300`)" in other_program.why
    # A record edited by hand: no telling, said with the field.
    damaged = identity.check({**record, "start_ticks": "3301"})
    assert damaged.running is None and "'start_ticks' holds text" in damaged.why


def test_an_ended_process_has_exited_even_before_it_is_reaped(identity):
    proc = subprocess.Popen(["true"])
    record = identity.record(proc.pid)
    wait_until_gone(proc.pid, "true")  # a zombie now: its parent (this test) has not waited for it
    assert identity.check(record) == identity.Verdict(False, f"pid {proc.pid} has exited")
    proc.wait()
    assert identity.check(record).running is False


def test_a_record_of_the_pid_alone_is_judged_by_when_it_was_written_and_its_command(identity, stranger):
    pid, now = stranger.pid, time.time()
    # Written after the process started: the number was already this process's, so it is the one.
    assert identity.check({"pid": pid}, now + 60, ["300"]).running is True
    # Written before the process started: the recorded one ended and the number went to this one.
    assert identity.check({"pid": pid}, now - 600, ["300"]).running is False
    # Another command than the recorded one, whenever it started.
    other = identity.check({"pid": pid}, now + 60, ["launch", "devmachine"])
    assert other.running is False and "is now another process" in other.why
    # Neither a time nor a command: no telling.
    unknown = identity.check({"pid": pid})
    assert unknown.running is None and f"pid {pid} runs `sleep 300`" in unknown.why


def test_send_signal_reaches_only_the_recorded_process(identity, stranger):
    record = identity.record(stranger.pid)
    verdict = identity.send_signal({**record, "start_ticks": record["start_ticks"] + 1}, signal.SIGTERM)
    assert verdict.running is False and "is now another process" in verdict.why
    unknown = identity.send_signal({"pid": stranger.pid}, signal.SIGTERM)
    assert unknown.running is None
    assert stranger.poll() is None  # neither was sent
    assert identity.send_signal(record, signal.SIGTERM).running is True
    assert stranger.wait(timeout=60) == -signal.SIGTERM


def test_the_supervisor_signals_a_group_whose_leader_was_reaped_only_while_the_number_is_free(pkg, identity, stranger):
    supervise = pkg.module("cluster.supervise")
    # The launcher's group outlives it while a member runs: the number stays reserved for the group.
    script = "sleep 300 >/dev/null & echo $!"
    leader = subprocess.Popen(["sh", "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True)
    member = int(leader.stdout.readline())
    member_identity = identity.record(member)
    leader.wait()
    leader.stdout.close()
    try:
        assert not Path(f"/proc/{leader.pid}").exists() and os.getpgid(member) == leader.pid
        assert supervise.signal_group(leader, signal.SIGTERM) is True
        wait_until_gone(member, "the group's remaining member")
    finally:
        identity.send_signal(member_identity, signal.SIGKILL)  # left running by a failure above

    # The group is gone and its number was given to a process leading a group of its own: not ours.
    reaped = subprocess.Popen(["true"], start_new_session=True)
    reaped.wait()
    reaped.pid = stranger.pid  # what pid reuse does to the number this supervisor keeps
    assert supervise.signal_group(reaped, signal.SIGTERM) is False
    assert stranger.poll() is None
