"""NCCL's log judged against the fabric: did NCCL use the network the fabric promises (RDMA, not a
socket fallback), with GPUDirect RDMA, on an interface that reaches the other nodes? nccl_log.py reads
the log; here are doctor's lines for it.

    from .nccl_verdict import assess, connection_table
    checks = assess(merge(read_logs(paths)), expectation(settings))   # Check lines for doctor's table
    rows = connection_table(log)      # 'rank 0 -> 8  send  NET/IB/0/GDRDMA  channels 0-7', per peer pair

Pure functions, no torch. The key verdict: FAIL when RDMA is expected and NCCL used sockets.
"""

from __future__ import annotations

from . import FAIL, NA, OK, WARN, Check
from .fabric import Expectation
from .nccl_log import Connection, NcclLog


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
        "Check `ibv_devinfo` inside the container (a pod: the RDMA device resource and IPC_LOCK; "
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
