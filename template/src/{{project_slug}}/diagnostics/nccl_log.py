"""Reading NCCL's INFO log: the NCCL version, the network and the transport of every connection, the
interfaces, the settings the job ran with, the warnings. nccl_verdict.py judges what is read here.

    <package> doctor --nccl-log runs/job-42/logs/          # every file in the folder, one per rank
    <package> doctor --nccl-log rank0.log --nccl-log rank8.log --fabric roce

Pure functions, no torch: `parse` turns log text into an NcclLog, `merge` joins the logs of several
ranks, `read_logs` parses the files named on the command line (a folder: every file in it).

Lines come from `NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET` (TRAIN_DEBUG=1 sets both) and look like
`host:pid:tid [dev] NCCL INFO <message>`, possibly behind a launcher's prefix (`[rank3]:`, `[1,3]<stdout>:`)
or a timestamp. The messages read here:

    NCCL version 2.21.5+cuda12.4                      (rank 0, sometimes without the prefix)
    cudaDriverVersion 12040
    Bootstrap : Using eth0:10.0.0.1<0>
    NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>
    NET/IB : No device found.
    NET/Socket : Using [0]eth0:10.0.0.1<0>
    Using network IB                                   (or Socket, IBext_v8, a plugin's name)
    Channel 00/0 : 8[0] -> 0[0] [receive] via NET/IB/0/GDRDMA
    Channel 02/0 : 3[3] -> 8[0] [send] via NET/IB/1(1)/GDRDMA      (PXN: through rank 1's NIC)
    Channel 00/0 : 0[0] -> 1[1] via P2P/IPC/read       (P2P/CUMEM/read, P2P/direct pointer, SHM/direct/direct)
    Ring 00 : 3 -> 4 [send] via NET/Socket/0           (NCCL before 2.4)
    24 coll channels, 16 collnet channels, 16 nvls channels, 32 p2p channels
    NCCL_IB_DISABLE set by environment to 1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path


class LogError(ValueError):
    """A log path that cannot be read."""


@dataclass(frozen=True, order=True)
class Connection:
    """One `Channel ... via ...` line: a channel between two ranks and the transport it uses."""

    channel: int
    src: int
    dst: int
    direction: str
    """'send', 'receive' or '' (intra-node lines name no direction)."""
    path: str
    """What follows `via`: NET/IB/0/GDRDMA, NET/Socket/1, P2P/IPC/read, SHM/direct/direct, ..."""

    @property
    def transport(self) -> str:
        return self.path.split("/", 1)[0]

    @property
    def net(self) -> str:
        """For NET connections the network module: IB, IBext_v8, Socket, a plugin's name."""
        parts = self.path.split("/")
        return parts[1] if self.transport == "NET" and len(parts) > 1 else ""

    @property
    def gdr(self) -> bool:
        return "GDRDMA" in self.path.split("/")

    @property
    def kind(self) -> str:
        """Transport and module, without device numbers: NET/IB, NET/Socket, P2P/IPC, SHM, ..."""
        if self.transport == "NET":
            return f"NET/{self.net}"
        parts = self.path.split("/")
        return "/".join(parts[:2]).split(" ")[0] if self.transport == "P2P" else parts[0]


@dataclass(frozen=True)
class IbPort:
    """One entry of `NET/IB : Using [0]mlx5_0:1/IB ...`."""

    device: str
    port: int
    link: str
    """IB or RoCE, as NCCL prints it."""

    def __str__(self) -> str:
        return f"{self.device}:{self.port}/{self.link}"


@dataclass
class NcclLog:
    """What one or several logs say; `merge` joins several."""

    sources: list[str] = field(default_factory=list)
    lines: int = 0
    """Lines that carry an NCCL message."""
    hosts: set[str] = field(default_factory=set)
    versions: set[str] = field(default_factory=set)
    cuda_drivers: set[str] = field(default_factory=set)
    networks: set[str] = field(default_factory=set)
    """`Using network X`: the network module each communicator picked."""
    ib_ports: set[IbPort] = field(default_factory=set)
    ib_no_device: bool = False
    socket_ifaces: set[str] = field(default_factory=set)
    """`NET/Socket : Using` interfaces (name:address): what the socket transport binds."""
    bootstrap_ifaces: set[str] = field(default_factory=set)
    connections: set[Connection] = field(default_factory=set)
    nvls_channels: int = 0
    settings: dict[str, set[str]] = field(default_factory=dict)
    """`NCCL_X set by environment to V`: the settings the job really ran with."""
    warnings: list[str] = field(default_factory=list)

    @property
    def net_connections(self) -> list[Connection]:
        return sorted(c for c in self.connections if c.transport == "NET")

    @property
    def ranks(self) -> set[int]:
        return {c.src for c in self.connections} | {c.dst for c in self.connections}


# `NCCL INFO`/`NCCL WARN` anywhere in the line: whatever a launcher put in front does not matter.
_MESSAGE = re.compile(r"NCCL (INFO|WARN|TRACE)\s?(.*?)\s*$")
_HOST = re.compile(r"(?:^|\s|\]|:)([A-Za-z0-9][A-Za-z0-9._-]*):\d+:\d+ \[\d+\] (?:\S+:\d+ )?NCCL ")
_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+(?:\+cuda[0-9.]+)?)")
_DRIVER = re.compile(r"cudaDriverVersion (\d+)")
_NETWORK = re.compile(r"^Using network (.+?)\s*$")
_IB_USING = re.compile(r"^NET/IB ?: (?:Using )?(\[\d+\].*)$")
_IB_PORT = re.compile(r"\[\d+\] ?([^\s:\[\]]+)(?::uverbs\d+)?:(\d+)/(\w+)")
_IB_NONE = re.compile(r"^NET/IB ?: No device found")
_SOCKET_USING = re.compile(r"^NET/Socket ?: Using (.*)$")
_IFACE = re.compile(r"\[\d+\]([^\s:\[\]]+):(\S+?)<\d+>")
_BOOTSTRAP = re.compile(r"^Bootstrap ?: Using (?:\[\d+\])?([^\s:]+):(\S+?)<\d+>")
_CHANNEL = re.compile(
    r"^(?:Channel|Ring) (\d+)(?:/\d+)? : (\d+)(?:\[[0-9a-fA-Fx]*\])? -> (\d+)(?:\[[0-9a-fA-Fx]*\])?"
    r"(?: \[(send|receive)\])? via (.+?)\s*$"
)
_NVLS = re.compile(r"(\d+) nvls channels")
_SETTING = re.compile(r"^(NCCL_[A-Z0-9_]+) set (?:by environment )?to (.*?)\.?\s*$")


def parse(text: str, source: str = "<log>") -> NcclLog:
    """Everything NCCL said in `text` (one rank's output, or several interleaved)."""
    log = NcclLog(sources=[source])
    for line in text.splitlines():
        version = _VERSION.search(line)
        if version:  # printed by rank 0, with or without the usual prefix
            log.versions.add(version.group(1))
        m = _MESSAGE.search(line)
        if not m:
            if version:
                log.lines += 1
            continue
        level, msg = m.groups()
        log.lines += 1
        host = _HOST.search(line)
        if host:
            log.hosts.add(host.group(1))
        if level == "WARN":
            log.warnings.append(msg)
            continue
        if m := _CHANNEL.match(msg):
            channel, src, dst, direction, path = m.groups()
            log.connections.add(Connection(int(channel), int(src), int(dst), direction or "", path))
        elif m := _NETWORK.match(msg):
            log.networks.add(m.group(1))
        elif m := _IB_USING.match(msg):
            devices = m.group(1).split(";")[0]
            log.ib_ports.update(IbPort(d, int(p), link) for d, p, link in _IB_PORT.findall(devices))
        elif _IB_NONE.match(msg):
            log.ib_no_device = True
        elif m := _SOCKET_USING.match(msg):
            log.socket_ifaces.update(f"{name}:{addr}" for name, addr in _IFACE.findall(m.group(1)))
        elif m := _BOOTSTRAP.match(msg):
            log.bootstrap_ifaces.add(f"{m.group(1)}:{m.group(2)}")
        elif m := _DRIVER.search(msg):
            code = int(m.group(1))
            log.cuda_drivers.add(f"{code // 1000}.{code % 1000 // 10}")
        elif m := _SETTING.match(msg):
            log.settings.setdefault(m.group(1), set()).add(m.group(2))
        elif m := _NVLS.search(msg):
            log.nvls_channels = max(log.nvls_channels, int(m.group(1)))
    return log


def merge(logs: list[NcclLog]) -> NcclLog:
    """One NcclLog for the whole job (the logs of all ranks)."""
    out = NcclLog()
    for log in logs:
        out.sources += log.sources
        out.lines += log.lines
        out.ib_no_device |= log.ib_no_device
        out.nvls_channels = max(out.nvls_channels, log.nvls_channels)
        out.warnings += log.warnings
        for name in (
            "hosts",
            "versions",
            "cuda_drivers",
            "networks",
            "ib_ports",
            "socket_ifaces",
            "bootstrap_ifaces",
            "connections",
        ):
            getattr(out, name).update(getattr(log, name))
        for key, values in log.settings.items():
            out.settings.setdefault(key, set()).update(values)
    return out


def log_files(paths: list[str]) -> list[Path]:
    """The files to read: each path given, or every file inside a folder given (sorted, recursive)."""
    files = []
    for name in paths:
        path = Path(name)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file())
            if not found:
                raise LogError(f"--nccl-log {name}: the folder holds no files")
            files += found
        elif path.is_file():
            files.append(path)
        else:
            raise LogError(f"--nccl-log {name}: no such file or folder")
    return files


def read_logs(paths: list[str]) -> list[NcclLog]:
    return [parse(f.read_text(errors="replace"), str(f)) for f in log_files(paths)]
