"""Reading NCCL's INFO log: which transport NCCL chose, and whether that is what the fabric promises.

    <package> doctor --nccl-log runs/job-42/logs/          # every file in the folder, one per rank
    <package> doctor --nccl-log rank0.log --nccl-log rank8.log --fabric roce

Pure functions, no torch: `parse` turns log text into an NcclLog, `merge` joins the logs of several
ranks, `assess` compares one with the fabric and returns verdict lines for doctor's table.

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
from typing import NamedTuple

OK, WARN, FAIL, NA = "ok", "warn", "FAIL", "n/a"


class Check(NamedTuple):
    """One line of doctor's table."""

    name: str
    verdict: str
    detail: str


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


# ---------------------------------------------------------------------------------------------
# Verdicts


@dataclass(frozen=True)
class Expectation:
    """What the fabric promises. rdma None = unknown (no NCCL_IB_DISABLE anywhere)."""

    rdma: bool | None
    link: str | None = None
    """'IB' or 'RoCE' when known (RoCE: NCCL_IB_GID_INDEX is set), for a link-layer warning."""
    source: str = ""
    """Where the expectation comes from, quoted in messages: 'NCCL_IB_DISABLE=0 (config/nccl.env)'."""


def _is_rdma(net: str) -> bool:
    return net.startswith("IB")  # IB, and the RDMA plugin's IBext, IBext_v8, ...


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2,5'."""
    out, nums = [], sorted(set(numbers))
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(out)


def _count(conns: list[Connection]) -> str:
    kinds: dict[str, int] = {}
    for c in conns:
        kinds[c.kind] = kinds.get(c.kind, 0) + 1
    return ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items()))


def connection_table(log: NcclLog, limit: int = 40) -> list[str]:
    """Transports per peer pair: 'rank 0 -> 8  send  NET/IB/0/GDRDMA  channels 0-7'."""
    groups: dict[tuple, list[int]] = {}
    for c in log.connections:
        groups.setdefault((c.src, c.dst, c.direction, c.path), []).append(c.channel)
    rows = [
        f"rank {src:>3} -> {dst:<3} {direction or '-':<8} {path:<22} channels {_ranges(chans)}"
        for (src, dst, direction, path), chans in sorted(groups.items())
    ]
    if len(rows) > limit:
        rows = rows[:limit] + [f"... {len(rows) - limit} more peer/transport pairs"]
    return rows


def assess(log: NcclLog, expect: Expectation) -> list[Check]:
    """Doctor's NCCL lines for a log: logs read, version, network, transports, GPUDirect RDMA,
    socket interface, warnings. The key verdict: FAIL when RDMA is expected and NCCL used sockets."""
    if log.lines == 0:
        names = ", ".join(log.sources) or "the log"
        return [
            Check(
                "NCCL log",
                FAIL,
                f"no NCCL lines in {names}: at NCCL_DEBUG=WARN a healthy NCCL prints nothing; rerun the job "
                "with TRAIN_DEBUG=1 (NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET) and pass its output",
            )
        ]
    checks = [
        Check(
            "NCCL log",
            OK,
            (
                f"{len(log.sources)} file(s), {log.lines} NCCL lines"
                + (f", hosts {', '.join(sorted(log.hosts))}" if log.hosts else "")
                + (f", ranks {_ranges(list(log.ranks))}" if log.ranks else "")
            ),
        )
    ]

    if len(log.versions) > 1:
        checks.append(
            Check(
                "NCCL version",
                WARN,
                f"ranks disagree: {', '.join(sorted(log.versions))}; every node should run the same image",
            )
        )
    elif log.versions:
        driver = f", CUDA driver {', '.join(sorted(log.cuda_drivers))}" if log.cuda_drivers else ""
        checks.append(Check("NCCL version", OK, next(iter(log.versions)) + driver))
    else:
        checks.append(Check("NCCL version", NA, "not in the log (rank 0 prints it)"))

    checks.append(_network_check(log, expect))
    checks.append(_transport_check(log, expect))
    checks.append(_gdr_check(log))
    checks.append(_interface_check(log))
    if log.warnings:
        checks.append(Check("NCCL warnings", WARN, f"{len(log.warnings)} WARN line(s), first: {log.warnings[0]}"))
    return checks


def _why_sockets(log: NcclLog) -> str:
    hints = []
    if log.ib_no_device:
        hints.append("NCCL said `NET/IB : No device found`")
    for key in ("NCCL_IB_DISABLE", "NCCL_NET", "NCCL_IB_HCA"):
        if key in log.settings:
            hints.append(f"the job had {key}={'/'.join(sorted(log.settings[key]))}")
    causes = (
        "Check `ibv_devinfo` inside the container (Kubernetes: the RDMA device resource and IPC_LOCK; "
        "Docker: --device /dev/infiniband), that NCCL_IB_HCA matches a device, that the image has "
        "libibverbs and its provider (ibverbs-providers), and that nothing sets NCCL_IB_DISABLE=1"
    )
    return ("; ".join(hints) + ". " if hints else "") + causes


def _network_check(log: NcclLog, expect: Expectation) -> Check:
    ports = " ".join(str(p) for p in sorted(log.ib_ports, key=str))
    nets = sorted(log.networks)
    if not nets and not log.ib_ports and not log.socket_ifaces:
        return Check("NCCL network", NA, "no `Using network` line (NCCL_DEBUG_SUBSYS without INIT,NET?)")
    rdma = [n for n in nets if _is_rdma(n)]
    sockets = "Socket" in nets
    detail = f"Using network {', '.join(nets) or '?'}" + (f"; NET/IB devices {ports}" if ports else "")
    if expect.rdma and sockets:
        return Check(
            "NCCL network",
            FAIL,
            f"{detail}: NCCL picked sockets although {expect.source} expects RDMA. " + _why_sockets(log),
        )
    if expect.rdma and not rdma:
        return Check("NCCL network", WARN, f"{detail}: not NCCL's IB module although {expect.source} expects RDMA")
    if expect.rdma is False and rdma:
        return Check(
            "NCCL network",
            WARN,
            f"{detail}: RDMA although {expect.source} says TCP; fine for speed, "
            "but the fabric answer does not describe this cluster",
        )
    links = {p.link for p in log.ib_ports}
    if expect.rdma and expect.link and links and expect.link not in links:
        return Check(
            "NCCL network",
            WARN,
            f"{detail}: link layer {'/'.join(sorted(links))} but the config is "
            f"for {expect.link} (RoCE needs NCCL_IB_GID_INDEX; InfiniBand does not)",
        )
    return Check("NCCL network", OK, detail)


def _transport_check(log: NcclLog, expect: Expectation) -> Check:
    net = log.net_connections
    local = sorted(c for c in log.connections if c.transport != "NET")
    nvls = f"; NVLS {log.nvls_channels} channels" if log.nvls_channels else ""
    inter = f"inter-node {_count(net)}" if net else "no inter-node connection (one node)"
    intra = f"intra-node {_count(local)}" if local else "no intra-node connection"
    detail = f"{inter}; {intra}{nvls}"
    if not log.connections:
        return Check(
            "NCCL transports",
            NA,
            "no `Channel ... via` lines (the log ends before connections, or NCCL_DEBUG_SUBSYS lacks INIT)",
        )
    socket = [c for c in net if c.net == "Socket"]
    if expect.rdma and socket:
        peers = sorted({(c.src, c.dst) for c in socket})
        example = ", ".join(f"{s}->{d}" for s, d in peers[:4]) + (" ..." if len(peers) > 4 else "")
        why = "causes: see NCCL network" if "Socket" in log.networks else _why_sockets(log)
        return Check(
            "NCCL transports",
            FAIL,
            f"{detail}. SOCKET FALLBACK: {len(socket)} connection(s) via "
            f"NET/Socket ({example}) although {expect.source} expects RDMA; {why}",
        )
    return Check("NCCL transports", OK, detail)


def _gdr_check(log: NcclLog) -> Check:
    ib = [c for c in log.net_connections if _is_rdma(c.net)]
    if not ib:
        return Check("GPUDirect RDMA", NA, "no NET/IB connection in the log")
    with_gdr = sum(c.gdr for c in ib)
    if with_gdr == len(ib):
        return Check("GPUDirect RDMA", OK, f"all {len(ib)} NET/IB connections use GDRDMA")
    return Check(
        "GPUDirect RDMA",
        WARN,
        (
            f"{with_gdr}/{len(ib)} NET/IB connections use GDRDMA; the rest stage data through host memory. Load the "
            "nvidia-peermem module (or use a driver/NCCL with DMA-BUF), and check NCCL_NET_GDR_LEVEL and the "
            "GPU-NIC PCIe placement (`nvidia-smi topo -m`)"
        ),
    )


def _interface_check(log: NcclLog) -> Check:
    if not log.socket_ifaces and not log.bootstrap_ifaces:
        return Check("socket interface", NA, "no `Bootstrap : Using` or `NET/Socket : Using` line")
    parts = []
    if log.bootstrap_ifaces:
        parts.append(f"bootstrap {', '.join(sorted(log.bootstrap_ifaces))}")
    if log.socket_ifaces:
        parts.append(f"NET/Socket {', '.join(sorted(log.socket_ifaces))}")
    detail = "; ".join(parts)
    names = {i.split(":", 1)[0] for i in log.socket_ifaces | log.bootstrap_ifaces}
    if len(log.hosts) > 1 and any(n == "lo" or n.startswith("docker") for n in names):
        return Check(
            "socket interface",
            WARN,
            f"{detail}: a loopback/docker interface cannot reach other nodes; "
            "set NCCL_SOCKET_IFNAME to the cluster network",
        )
    return Check("socket interface", OK, detail)
