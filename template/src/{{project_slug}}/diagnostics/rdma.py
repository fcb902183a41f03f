"""The RDMA ports of this node and doctor's lines on them: the ports in /sys/class/infiniband and
what `ibv_devinfo` lists, whether any is ACTIVE on the link layer the fabric expects, and which of
them NCCL_IB_HCA selects (NCCL's matching rules).

    from .rdma import check_hca, check_rdma, read_sysfs, run_ibv_devinfo, select_hcas
    ports = read_sysfs()                          # [RdmaPort("mlx5_0", 1, "ACTIVE", "InfiniBand"), ...]
    installed, listed, said = run_ibv_devinfo()   # the same from ibv_devinfo (when it is installed)
    select_hcas("=mlx5_0,mlx5_1:1", ports)        # the ports NCCL would use
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from . import FAIL, NA, OK, WARN, Check
from .fabric import Expectation, Settings

SYSFS_IB = Path("/sys/class/infiniband")


@dataclass(frozen=True)
class RdmaPort:
    device: str
    port: int
    state: str
    """ACTIVE, DOWN, INIT, ..."""
    link: str
    """InfiniBand, or Ethernet (= RoCE)."""

    def __str__(self) -> str:
        link = "RoCE" if self.link == "Ethernet" else self.link
        return f"{self.device}:{self.port} {self.state} {link}"


def read_sysfs(root: Path = SYSFS_IB) -> list[RdmaPort]:
    """RDMA ports from sysfs: <root>/<dev>/ports/<n>/state ('4: ACTIVE') and link_layer."""
    ports = []
    if not root.is_dir():
        return ports
    for dev in sorted(root.iterdir()):
        port_dirs = [p for p in (dev / "ports").glob("*") if p.name.isdigit()]
        for port_dir in sorted(port_dirs, key=lambda p: int(p.name)):
            state = _read(port_dir / "state").split(":")[-1].strip() or "?"
            ports.append(RdmaPort(dev.name, int(port_dir.name), state, _read(port_dir / "link_layer") or "?"))
    return ports


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def parse_ibv_devinfo(text: str) -> list[RdmaPort]:
    """Ports from `ibv_devinfo` output: hca_id, then per port `port:`, `state: PORT_ACTIVE (4)`, `link_layer:`."""
    ports, device, port, state = [], "", 0, "?"
    for line in text.splitlines():
        key, _, value = line.strip().partition(":")
        value = value.strip()
        if key == "hca_id":
            device = value
        elif key == "port" and value.isdigit():
            port, state = int(value), "?"
        elif key == "state":
            state = value.split("(")[0].strip().removeprefix("PORT_")
        elif key == "link_layer" and device:
            ports.append(RdmaPort(device, port, state, value))
    return ports


def run_ibv_devinfo() -> tuple[bool, list[RdmaPort], str]:
    """(installed, ports, what it said)."""
    if not shutil.which("ibv_devinfo"):
        return False, [], "ibv_devinfo is not installed (apt-get install ibverbs-utils)"
    try:
        out = subprocess.run(["ibv_devinfo"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return True, [], f"ibv_devinfo failed: {exc}"
    ports = parse_ibv_devinfo(out.stdout)
    said = (out.stderr.strip() or out.stdout.strip()).splitlines()
    return (
        True,
        ports,
        (
            f"`ibv_devinfo` found {len(ports)} port(s)"
            if ports
            else f"`ibv_devinfo` exit {out.returncode}: {said[0] if said else 'no output'}"
        ),
    )


def check_rdma(ports: list[RdmaPort], tool: tuple[bool, str], expect: Expectation) -> Check:
    installed, said = tool
    listing = ", ".join(map(str, ports))
    if not ports:
        if expect.rdma:
            return Check(
                "RDMA devices",
                FAIL,
                (
                    f"none: {SYSFS_IB} is empty or missing and {said}; NCCL will fall back to sockets. Inside a "
                    "container the RDMA devices must be passed in (a pod: the RDMA device plugin resource and "
                    "IPC_LOCK; Docker: --device /dev/infiniband --cap-add IPC_LOCK); or, if this cluster has no RDMA, "
                    "regenerate with fabric=tcp"
                ),
            )
        if expect.rdma is False and not installed:
            return Check("RDMA devices", NA, f"none, and {said}; fabric tcp needs none")
        return Check("RDMA devices", OK if expect.rdma is False else NA, f"none ({said})")
    active = [p for p in ports if p.state == "ACTIVE"]
    if expect.rdma is False:
        return Check(
            "RDMA devices",
            WARN,
            f"{listing}: present but {expect.source} keeps NCCL on sockets; fabric=infiniband or roce would use them",
        )
    if expect.rdma and not active:
        return Check(
            "RDMA devices",
            FAIL,
            f"{listing}: no ACTIVE port, NCCL will fall back to sockets (check the "
            "cable/switch: `ibstat`, `ibv_devinfo`)",
        )
    links = {"RoCE" if p.link == "Ethernet" else "IB" for p in active}
    if expect.rdma and expect.link and expect.link not in links:
        fix = (
            "RoCE needs NCCL_IB_GID_INDEX (regenerate with fabric=roce)"
            if "RoCE" in links
            else "InfiniBand needs no NCCL_IB_GID_INDEX (regenerate with fabric=infiniband)"
        )
        return Check(
            "RDMA devices",
            WARN,
            f"{listing}: active ports are {'/'.join(sorted(links))}, the config is for {expect.link}; {fix}",
        )
    return Check("RDMA devices", OK, listing)


def select_hcas(spec: str, ports: list[RdmaPort]) -> list[RdmaPort]:
    """The ports NCCL_IB_HCA selects, with NCCL's rules: a comma list of device-name prefixes (mlx5 matches
    mlx5_0, mlx5_1, ...), '=' for exact names, '^' to exclude (also '^='), ':<port>' to name a port."""
    spec = spec.strip()
    exclude = spec.startswith("^")
    spec = spec[1:] if exclude else spec
    exact = spec.startswith("=")
    spec = spec[1:] if exact else spec
    items = []
    for item in filter(None, (i.strip() for i in spec.split(","))):
        name, _, port = item.partition(":")
        items.append((name, int(port) if port.isdigit() else None))

    def listed(p: RdmaPort) -> bool:
        return any(
            (p.device == name if exact else p.device.startswith(name)) and port in (None, p.port)
            for name, port in items
        )

    return [p for p in ports if listed(p) != exclude]


def check_hca(settings: Settings, ports: list[RdmaPort], expect: Expectation) -> Check:
    spec = settings.effective.get("NCCL_IB_HCA")
    if expect.rdma is False:
        return Check("NCCL_IB_HCA", NA, "fabric tcp: NCCL uses no RDMA device")
    if spec is None:
        return Check(
            "NCCL_IB_HCA",
            WARN if expect.rdma else NA,
            "not set: NCCL uses every active RDMA port, a management NIC too",
        )
    quoted = settings.quote("NCCL_IB_HCA")
    if not ports:
        verdict = FAIL if expect.rdma else NA
        return Check("NCCL_IB_HCA", verdict, f"{quoted} selects nothing: no RDMA device on this node (ibv_devinfo)")
    chosen = select_hcas(spec, ports)
    present = ", ".join(f"{p.device}:{p.port}" for p in ports)
    if not chosen:
        return Check(
            "NCCL_IB_HCA",
            FAIL if expect.rdma else WARN,
            (
                f"{quoted} matches none of this node's ports ({present}); NCCL falls back to sockets. Fix it in "
                "config/nccl.env (copier answer nccl_ib_hca) or the platform's environment"
            ),
        )
    active = [p for p in chosen if p.state == "ACTIVE"]
    names = ", ".join(f"{p.device}:{p.port}" for p in chosen)
    if not active:
        return Check("NCCL_IB_HCA", FAIL if expect.rdma else WARN, f"{quoted} selects {names}, none ACTIVE")
    return Check("NCCL_IB_HCA", OK, f"{quoted} selects {names}")
