"""The node checks of `doctor`, a verdict each (ok / warn / FAIL / n/a), in the table's order: the GPUs,
the fabric (fabric.py), the RDMA ports and NCCL_IB_HCA (rdma.py), the socket interfaces, /dev/shm and
the memlock limit. Torch only to list the GPUs.

    from .fabric import expectation, load_settings
    from .node_checks import check_node, gpu_info
    settings = load_settings(Path("config/nccl.env"))   # the file, with the environment winning
    expect = expectation(settings)                      # RDMA expected? InfiniBand or RoCE?
    checks = check_node(cfg, settings, expect, None, *gpu_info())
"""

from __future__ import annotations

import os
import resource
import socket

from ..cluster.nccl_env import interface_matches
from ..settings.config import Config
from . import FAIL, NA, OK, WARN, Check
from .fabric import Expectation, Settings, check_fabric
from .rdma import check_hca, check_rdma, read_sysfs, run_ibv_devinfo

GIB = 1 << 30
MIB = 1 << 20


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
                "with bus errors or 'No space left on device'; Docker: --shm-size=16g, a pod: an emptyDir with "
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
        "RDMA pins its buffers and wants it unlimited: Docker --ulimit memlock=-1, a pod IPC_LOCK and the "
        "runtime's default ulimits, a batch node `ulimit -l unlimited` in its limits, which its scheduler passes on"
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
