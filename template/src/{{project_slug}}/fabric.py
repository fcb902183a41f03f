"""The fabric doctor judges against: the settings of config/nccl.env with what the environment set
winning (as the node launcher applies them: the platform's values win), and what they promise, RDMA
or sockets, InfiniBand or RoCE.

    from .fabric import check_fabric, expectation, load_settings
    settings = load_settings(Path("config/nccl.env"))   # the file, with the environment winning
    expect = expectation(settings)                      # RDMA expected? InfiniBand or RoCE?
    check_fabric(settings, expect, None)                # doctor's `fabric` line

The node checks (node_checks.py, rdma.py) and the NCCL log's verdict (nccl_verdict.py) read both.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .env_files import read_env_file
from .project import project_root
from .verdicts import FAIL, OK, WARN, Check

# The settings doctor reads; a value in the environment wins over config/nccl.env, as in apply_nccl_env.
SETTINGS = (
    "NCCL_IB_DISABLE",
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "NCCL_NET",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
)


@dataclass(frozen=True)
class Expectation:
    """What the fabric promises. rdma None = unknown (no NCCL_IB_DISABLE anywhere)."""

    rdma: bool | None
    link: str | None = None
    """'IB' or 'RoCE' when known (RoCE: NCCL_IB_GID_INDEX is set), for a link-layer warning."""
    source: str = ""
    """Where the expectation comes from, quoted in messages: 'NCCL_IB_DISABLE=0 (config/nccl.env)'."""


@dataclass
class Settings:
    """The file's values, those in force (effective: the environment's win) and the keys the environment set."""

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
