"""The fabric settings every launch applies: config/nccl.env (and config/nccl-debug.env under
TRAIN_DEBUG=1), without overriding what the platform injected.

    from .nccl_env import apply_nccl_env
    apply_nccl_env()                      # before torchrun, mpirun ranks, a platform's workers, doctor
"""

from __future__ import annotations

import os
import socket

from ..settings.config import debug_requested, project_root, read_env_file


def interface_matches(spec: str, names: list[str]) -> bool:
    """Whether an NCCL/Gloo interface spec (prefixes, '=' exact, '^' exclude) selects any interface."""
    if spec.startswith("^"):
        return True
    exact, items = spec.startswith("="), spec.lstrip("=").split(",")
    return any(n == i if exact else n.startswith(i) for n in names for i in items if i)


def apply_nccl_env(log=print, values: dict[str, str] | None = None) -> None:
    """Fabric settings from config/nccl.env (or `values` read from it elsewhere); a value the
    platform already injected wins (a cloud's RDMA machines may set their own NCCL_IB_* values). An interface this machine lacks (a laptop has no eth0) is skipped with a note rather
    than breaking every collective."""
    kept, missing = [], []
    interfaces = [name for _, name in socket.if_nameindex()]
    if values is None:
        values = read_env_file(project_root() / "config" / "nccl.env")
    for key, value in values.items():
        if key in os.environ:
            if os.environ[key] != value:
                kept.append(key)
            continue
        if key.endswith("_SOCKET_IFNAME") and not interface_matches(value, interfaces):
            missing.append(f"{key}={value}")
            continue
        os.environ[key] = value
    if debug_requested():
        debug = read_env_file(project_root() / "config" / "nccl-debug.env")
        os.environ.update(debug)
        dump_dir = os.path.dirname(debug.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "")) or "."
        try:
            os.makedirs(dump_dir, exist_ok=True)
        except OSError as exc:
            log(f"cannot create {dump_dir} for flight-recorder dumps ({exc.strerror}); is the shared storage mounted?")
        log(f"TRAIN_DEBUG=1: {', '.join(f'{k}={v}' for k, v in debug.items())}")
    if kept:
        log(f"kept the platform's {', '.join(sorted(kept))} over config/nccl.env")
    if missing:
        log(f"not applied: {', '.join(missing)} (no such interface here; this machine has {', '.join(interfaces)})")
