"""The fabric doctor judges against: the settings of config/nccl.env with what the environment set
winning (as the node launcher applies them: the platform's values win), and what they promise, RDMA
or sockets, InfiniBand or RoCE.

    from .fabric import check_fabric, expectation, load_settings
    settings = load_settings(Path("config/nccl.env"))   # the file, with the environment winning
    expect = expectation(settings)                      # RDMA expected? InfiniBand or RoCE?
    check_fabric(settings, expect, None)                # doctor's `fabric` line
    settings_in_effect(settings)                        # every NCCL value in force and where it came from

The node checks (node_checks.py, rdma.py) and the NCCL log's verdict (nccl_verdict.py) read both.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..settings.config import project_root, read_env_file
from . import FAIL, OK, WARN, Check

# The settings doctor reads; a value in the environment wins over config/nccl.env, as in apply_nccl_env.
SETTINGS = (
    "NCCL_IB_DISABLE",
    "NCCL_IB_HCA",
    "NCCL_IB_GID_INDEX",
    "NCCL_NET",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
)

# Variables of the environment doctor lists among the settings in effect (a platform injects more
# than config/nccl.env names: NCCL_CHECK_DISABLE, NCCL_LL_THRESHOLD, ...).
REPORTED_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_")
# What NCCL does when neither the environment nor config/nccl.env sets these: the fabric settings and
# the RoCE tunables cloud RDMA machines set (values of NCCL 2.2x's documentation).
NCCL_DEFAULTS = {
    "NCCL_IB_DISABLE": "0",
    "NCCL_IB_HCA": "every RDMA device",
    "NCCL_IB_GID_INDEX": "-1 (NCCL picks a GID)",
    "NCCL_IB_TC": "0",
    "NCCL_IB_SL": "0",
    "NCCL_IB_QPS_PER_CONNECTION": "1",
    "NCCL_IB_TIMEOUT": "20",
    "NCCL_NET_GDR_LEVEL": "chosen from the PCIe topology",
    "NCCL_PXN_DISABLE": "0",
    "NCCL_SOCKET_IFNAME": "ib*, else any interface but lo and docker*",
}
DEFAULT_SOURCE = "NCCL's default"


@dataclass(frozen=True)
class InEffect:
    """One setting the ranks get: its value and where it came from (source; note: what it overrides)."""

    name: str
    value: str
    source: str
    note: str = ""


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
    environment: dict[str, str] = field(default_factory=dict)
    """The NCCL/Gloo variables the environment held when the settings were read (before the launcher's)."""

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
    environment = {key: value for key, value in env.items() if key.startswith(REPORTED_PREFIXES)}
    return Settings(path, file, effective, from_env, environment)


def settings_in_effect(settings: Settings) -> list[InEffect]:
    """Every NCCL/Gloo setting of the file, of NCCL_DEFAULTS and of the environment, with its source: the
    environment (the platform, or your shell) wins over the file, as apply_nccl_env applies them;
    what neither sets is NCCL's default."""
    names = list(settings.file) + [n for n in NCCL_DEFAULTS if n not in settings.file]
    names += sorted(n for n in settings.environment if n not in names)
    rows = []
    for name in names:
        if name in settings.environment:
            value, theirs = settings.environment[name], settings.file.get(name)
            note = f"over {settings.name}'s {theirs}" if theirs is not None and theirs != value else ""
            rows.append(InEffect(name, value, "environment", note))
        elif name in settings.file:
            rows.append(InEffect(name, settings.file[name], settings.name))
        else:
            rows.append(InEffect(name, NCCL_DEFAULTS[name], DEFAULT_SOURCE))
    return rows


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
