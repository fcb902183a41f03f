"""The training ranks running on this machine, found in /proc: a rank is a process whose command line
is `python -m <package> train` (torchrun's children, or ranks that mpirun or a scheduler started); its rank,
local rank and world size come from its environment (/proc/<pid>/environ).

    from .local_ranks import find_ranks, read_process
    find_ranks()           # every training rank here, by global rank ([] when none)
    read_process(4242)     # the rank behind one pid, or None when there is no such process

`debug-dump` dumps the ranks it finds; `launch devmachine --action status` counts them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE = __name__.partition(".")[0]


@dataclass
class RankProcess:
    """A process here and the ranks its environment gives it; env is kept for what else it names
    (debug-dump reads the flight recorder's path from it)."""

    pid: int
    rank: int
    local_rank: int
    world_size: int
    argv: list[str]
    env: dict[str, str] = field(repr=False, default_factory=dict)


def is_train_command(argv: list[str], package: str = PACKAGE) -> bool:
    """`python [-u ...] -m <package> train ...` or the console script `<package> train ...`. The
    torchrun agent's own command line also ends in `-m <package> train`, but after torchrun's options:
    only interpreter flags may come before the `-m`."""
    if len(argv) >= 2 and Path(argv[0]).name == package and argv[1] == "train":
        return True
    for i, arg in enumerate(argv[1:], start=1):
        if arg == "-m":
            return argv[i + 1 : i + 3] in ([package, "train"], [f"{package}.__main__", "train"])
        if not arg.startswith("-"):
            # A script: the console script run by its interpreter (shebang), or something else.
            return Path(arg).name == package and argv[i + 1 : i + 2] == ["train"]
    return False


def read_process(pid: int, package: str = PACKAGE) -> RankProcess | None:
    """The rank behind pid, or None when pid is gone. The command line is not checked: `debug-dump --pid`
    names processes itself."""
    from ..settings.topology import process_ranks

    proc = Path("/proc") / str(pid)
    try:
        argv = [a.decode(errors="replace") for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return None
    try:
        raw = (proc / "environ").read_bytes().split(b"\0")
        env = dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)
    except OSError:  # another user's process: still dump it (py-spy then says what is wrong)
        env = {}
    rank, local_rank, world_size = process_ranks(env)
    return RankProcess(pid, rank, local_rank, world_size, argv, env)


def parent_pid(pid: int) -> int | None:
    """The parent of pid from /proc/<pid>/stat (None when it has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rpartition(")")[2].split()[1])  # after the command name, which may hold spaces


def descends_from(pid: int, ancestor: int) -> bool:
    """Whether pid is a child, grandchild, ... of ancestor."""
    seen = set()
    while pid and pid not in seen:
        if pid == ancestor:
            return True
        seen.add(pid)
        pid = parent_pid(pid) or 0
    return False


def find_ranks(package: str = PACKAGE) -> list[RankProcess]:
    """Every `-m <package> train` process on this machine, by global rank."""
    found = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
        except OSError:
            continue
        if is_train_command(argv, package):
            process = read_process(int(entry.name), package)
            if process:
                found.append(process)
    return sorted(found, key=lambda p: (p.rank, p.pid))
