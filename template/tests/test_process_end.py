"""How a rank ends (runtime/process_exit.py): no process group it joined is destroyed before the
process ends, whatever drops the last other reference to it.

A Gloo group's destructor joins its worker threads, and a worker finishing a collective may need the
GIL to free a tensor: destroyed on the main thread, the group can wait for that worker forever. That
hung a rank whose failure's traceback held the last DistributedDataParallel (its Reducer keeps the
group past destroy_process_group) about once in 30 loaded runs, until torchrun killed it. The race
itself cannot be forced; what rules it out can be seen: the group's threads outlive every reference
but the one process_exit holds.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from conftest import PACKAGE, ROOT, subprocess_env

# destroy_process_group drops c10d's own reference: for a group nothing else holds, the last one.
SCRIPT = """
import gc, os, sys
import torch, torch.distributed as dist
from {package}.runtime import process_exit

def threads():
    return len(os.listdir("/proc/self/task"))

alone = threads()
dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
if sys.argv[1] == "joined":
    process_exit.joined_group(dist.group.WORLD)
dist.all_reduce(torch.ones(3))  # on the group's worker threads
grouped = threads()
dist.destroy_process_group()
gc.collect()
print(alone, grouped, threads())
process_exit.end(0)
"""


def _run(script: str, how: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script.format(package=PACKAGE)), how],
        cwd=ROOT,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _threads(how: str) -> tuple[int, int, int]:
    proc = _run(SCRIPT, how)
    assert proc.returncode == 0, proc.stderr[-3000:]
    alone, grouped, after = (int(n) for n in proc.stdout.split())
    return alone, grouped, after


def test_a_joined_group_outlives_destroy_and_its_last_other_reference():
    alone, grouped, after = _threads("joined")
    assert grouped > alone  # the group runs threads of its own
    assert after == grouped  # still there: its destructor did not run


def test_without_it_the_last_reference_destroys_the_group_on_the_main_thread():
    """The control: the same script without joined_group destroys the group there (the join that can
    hang), so the first test's count tells the two apart."""
    alone, grouped, after = _threads("alone")
    assert grouped > alone and after < grouped


CRASH = """
import sys
import torch.distributed as dist
from {package}.runtime import process_exit

dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
process_exit.joined_group(dist.group.WORLD)
try:
    raise RuntimeError("boom") if sys.argv[1] == "error" else SystemExit(3)
except BaseException as exc:
    process_exit.crash(exc)
"""


def test_a_crash_in_a_joined_process_ends_as_the_interpreter_would_without_finalizing():
    """An exception main leaves: its traceback and exit 1; sys.exit(3): exit 3, quietly."""
    error, leave = _run(CRASH, "error"), _run(CRASH, "exit")
    assert error.returncode == 1 and error.stderr.rstrip().endswith("RuntimeError: boom"), error.stderr[-2000:]
    assert "Traceback (most recent call last)" in error.stderr
    assert leave.returncode == 3 and leave.stderr == "", leave.stderr[-2000:]
