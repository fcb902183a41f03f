"""The node checks of `doctor`, a verdict each (ok / warn / FAIL / n/a): the GPUs, the fabric that
config/nccl.env describes (what the platform set wins, as in the node launcher), the RDMA ports
(/sys/class/infiniband and `ibv_devinfo`), which of them NCCL_IB_HCA selects (NCCL's matching
rules), the socket interfaces, /dev/shm and the memlock limit. Torch only to list the GPUs.

    from .node_checks import check_node, expectation, gpu_info, load_settings
    settings = load_settings(Path("config/nccl.env"))   # the file, with the environment winning
    expect = expectation(settings)                      # RDMA expected? InfiniBand or RoCE?
    checks = check_node(cfg, settings, expect, None, *gpu_info())
"""

from __future__ import annotations

import os
import resource
import shutil
import socket
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .config import Config
from .env_files import read_env_file
from .nccl_env import interface_matches
from .nccl_log import FAIL, NA, OK, WARN, Check, Expectation
from .project import project_root

GIB = 1 << 30
MIB = 1 << 20
SYSFS_IB = Path("/sys/class/infiniband")
# The settings doctor reads; a value in the environment wins over config/nccl.env, as in apply_nccl_env.
SETTINGS = (
    "NCCL_IB_DISABLE",
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "NCCL_NET",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
)


# ---------------------------------------------------------------------------------------------
# Settings: config/nccl.env with the environment winning


@dataclass
class Settings:
    path: Path
    file: dict[str, str]
    effective: dict[str, str]
    from_env: set[str]

    def source(self, key: str) -> str:
        return "environment" if key in self.from_env else self.name

    @property
    def name(self) -> str:
        """config/nccl.env for the project's own file, else the path given."""
        default = project_root() / "config" / "nccl.env"
        return "config/nccl.env" if self.path.resolve() == default.resolve() else str(self.path)

    def quote(self, key: str) -> str:
        return f"{key}={self.effective[key]} ({self.source(key)})"


def load_settings(path: Path, env: Mapping[str, str] = os.environ) -> Settings:
    file = read_env_file(path)
    effective, from_env = dict(file), set()
    for key in SETTINGS:
        if key in env:
            effective[key] = env[key]
            from_env.add(key)
    return Settings(path, file, effective, from_env)


def expectation(settings: Settings, fabric: str | None = None) -> Expectation:
    """What the fabric promises: from --fabric, else from the effective NCCL_IB_DISABLE."""
    if fabric:
        return Expectation(fabric != "tcp", {"infiniband": "IB", "roce": "RoCE"}.get(fabric), f"--fabric {fabric}")
    value = settings.effective.get("NCCL_IB_DISABLE")
    if value is None:
        return Expectation(None, None, "no NCCL_IB_DISABLE")
    rdma = value.strip() in ("0", "")
    link = ("RoCE" if "NCCL_IB_GID_INDEX" in settings.effective else "IB") if rdma else None
    return Expectation(rdma, link, settings.quote("NCCL_IB_DISABLE"))


def check_fabric(settings: Settings, expect: Expectation, fabric: str | None) -> Check:
    if fabric:
        return Check("fabric", OK, f"judged as {fabric} (--fabric)")
    if expect.rdma is None:
        where = f"{settings.path} has no NCCL_IB_DISABLE" if settings.path.is_file() else f"no {settings.path}"
        return Check(
            "fabric",
            WARN,
            f"{where} and the environment sets none: doctor cannot tell whether RDMA is "
            "expected (pass --fabric, or --nccl-env with the project's config/nccl.env)",
        )
    net = settings.effective.get("NCCL_NET", "")
    if expect.rdma and net.lower() == "socket":
        return Check(
            "fabric",
            FAIL,
            f"RDMA expected ({expect.source}) but {settings.quote('NCCL_NET')} forces sockets; unset NCCL_NET",
        )
    what = (
        f"RDMA expected: {expect.source}, "
        + (f"RoCE ({settings.quote('NCCL_IB_GID_INDEX')})" if expect.link == "RoCE" else "InfiniBand (no GID)")
        if expect.rdma
        else f"TCP: {expect.source}, NCCL uses sockets"
    )
    file_value = settings.file.get("NCCL_IB_DISABLE")
    if (
        "NCCL_IB_DISABLE" in settings.from_env
        and file_value is not None
        and file_value != settings.effective["NCCL_IB_DISABLE"]
    ):
        return Check(
            "fabric",
            WARN,
            f"{what}; the environment overrides {settings.name}'s "
            f"NCCL_IB_DISABLE={file_value} (the platform's value wins)",
        )
    return Check("fabric", OK, what)


# ---------------------------------------------------------------------------------------------
# Node checks


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
                    "container the RDMA devices must be passed in (Kubernetes: the RDMA device plugin resource and "
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


def check_interface(settings: Settings, key: str, interfaces: list[str]) -> Check:
    here = ", ".join(interfaces)
    if key not in settings.effective:
        return Check(key, OK, f"not set: the library picks an interface (this node has {here})")
    spec = settings.effective[key]
    if interface_matches(spec, interfaces):
        if spec.startswith("^"):
            return Check(key, OK, f"{settings.quote(key)} excludes those; this node has {here}")
        chosen = [name for name in interfaces if interface_matches(spec, [name])]
        return Check(key, OK, f"{settings.quote(key)} selects {', '.join(chosen)}")
    if key in settings.from_env:
        return Check(
            key,
            FAIL,
            f"{settings.quote(key)} matches no interface of this node ({here}): NCCL/Gloo cannot "
            "start; unset it or name the cluster network's interface",
        )
    return Check(
        key,
        WARN,
        f"{settings.quote(key)} matches no interface of this node ({here}), so the node launcher "
        "does not apply it and the library picks one; fix nccl_socket_ifname "
        "(copier update --data nccl_socket_ifname=<interface>)",
    )


def check_shm(local_gpus: int, path: str = "/dev/shm") -> Check:
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return Check(
            "/dev/shm", WARN, f"cannot read {path}: {exc}; NCCL's SHM transport and DataLoader workers need it"
        )
    size = st.f_frsize * st.f_blocks
    need = max(1, local_gpus) * GIB
    detail = f"{size / GIB:.1f} GiB"
    if size < need:
        return Check(
            "/dev/shm",
            WARN,
            (
                f"{detail}, below {need // GIB} GiB (1 GiB per GPU): NCCL's SHM transport and DataLoader workers fail "
                "with bus errors or 'No space left on device'; Docker: --shm-size=16g, Kubernetes: an emptyDir with "
                "medium Memory at /dev/shm"
            ),
        )
    return Check("/dev/shm", OK, detail)


def check_memlock(expect: Expectation) -> Check:
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        return Check("memlock", OK, "unlimited")
    detail = f"{soft / MIB:.0f} MiB" if soft >= MIB else f"{soft // 1024} KiB"
    if not expect.rdma:
        return Check("memlock", OK, f"{detail} (only RDMA needs more)")
    fix = (
        "RDMA pins its buffers and wants it unlimited: Docker --ulimit memlock=-1, Kubernetes IPC_LOCK and "
        "the runtime's default ulimits, Slurm PropagateResourceLimits / `ulimit -l unlimited` in the node's limits"
    )
    return Check("memlock", FAIL if soft < GIB else WARN, f"{detail}: {fix}")


def gpu_info() -> tuple[list[str], str]:
    """(names of the visible GPUs, why there are none)."""
    import torch

    if not torch.cuda.is_available():
        why = "built without CUDA" if torch.version.cuda is None else "no CUDA device visible"
        return [], f"torch {torch.__version__}, {why}"
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())], ""


def check_gpus(names: list[str], why: str, cfg: Config) -> Check:
    if not names:
        return Check("GPUs", NA, f"none ({why}): CPU only")
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    detail = ", ".join(f"{n} x {name}" for name, n in counts.items())
    if len(names) != cfg.cluster.gpus_per_node:
        return Check("GPUs", WARN, f"{detail}; the project expects gpus_per_node={cfg.cluster.gpus_per_node}")
    return Check("GPUs", OK, detail)


def check_node(
    cfg: Config, settings: Settings, expect: Expectation, fabric: str | None, gpus: list[str], why: str
) -> list[Check]:
    """Every node check, in the table's order. RDMA ports: sysfs, and what ibv_devinfo adds to it."""
    sysfs = read_sysfs()
    installed, tool_ports, said = run_ibv_devinfo()
    known = {(p.device, p.port) for p in sysfs}
    ports = sysfs + [p for p in tool_ports if (p.device, p.port) not in known]
    interfaces = [name for _, name in socket.if_nameindex()]
    return [
        check_gpus(gpus, why, cfg),
        check_fabric(settings, expect, fabric),
        check_rdma(ports, (installed, said), expect),
        check_hca(settings, ports, expect),
        check_interface(settings, "NCCL_SOCKET_IFNAME", interfaces),
        check_interface(settings, "GLOO_SOCKET_IFNAME", interfaces),
        check_shm(len(gpus)),
        check_memlock(expect),
    ]
