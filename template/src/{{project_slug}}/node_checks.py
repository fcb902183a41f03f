"""`doctor`: is this node ready for multi-node training, and does NCCL really use the RDMA network?

    <package> doctor                          # on a node: a pod, a TI-ONE task, a Slurm allocation, a dev box
    <package> doctor --net-loopback           # one node: P2P/SHM off, so the local GPUs talk through the NIC
    srun --ntasks-per-node=<gpus> <package> doctor      # every rank of a Slurm job: inter-node transports
    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 -m <package> doctor
    <package> doctor --nccl-log runs/logs/    # only analyse the NCCL logs of an earlier job (TRAIN_DEBUG=1)

One table, a verdict per line (ok / warn / FAIL / n/a), exit 1 on any FAIL: GPUs, the fabric that
config/nccl.env describes (NCCL_IB_DISABLE=0: RDMA expected), RDMA devices (/sys/class/infiniband and
`ibv_devinfo`), whether NCCL_IB_HCA selects any of them, the socket interfaces, /dev/shm, the memlock
limit; then a short all-reduce: NCCL on GPUs with NCCL_DEBUG=INFO, whose log tells which transport NCCL
chose (nccl_log.py reads it), or Gloo between two processes on CPU; both report the bus bandwidth as
nccl-tests define it. The settings are those the node launcher applies: config/nccl.env, with what the
environment (the platform) already set winning.

The all-reduce workers are this module run as `python -m <package>.doctor --worker ...`.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .config import Config, ConfigError
from .nccl_log import FAIL, NA, OK, WARN, Check, Expectation, LogError, assess, connection_table, merge, parse, \
    read_logs
from .env_files import read_env_file
from .nccl_env import apply_nccl_env, interface_matches
from .project import project_root

GIB = 1 << 30
MIB = 1 << 20
SYSFS_IB = Path("/sys/class/infiniband")
# The settings doctor reads; a value in the environment wins over config/nccl.env, as in apply_nccl_env.
SETTINGS = ("NCCL_IB_DISABLE", "NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_NET", "NCCL_SOCKET_IFNAME",
            "GLOO_SOCKET_IFNAME")
RESULT_MARK = "DOCTOR_ALLREDUCE "


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--nccl-log", action="append", default=[], metavar="FILE_OR_DIR",
                   help="only analyse these NCCL logs of an earlier job (repeatable; a folder = every file in it)")
    p.add_argument("--nccl-env", metavar="FILE",
                   help="the fabric settings to check against (default: config/nccl.env of the project)")
    p.add_argument("--fabric", choices=["infiniband", "roce", "tcp"],
                   help="judge against this fabric instead of NCCL_IB_DISABLE (logs from another cluster)")
    p.add_argument("--no-allreduce", action="store_true", help="only the node checks, no all-reduce")
    p.add_argument("--size-mb", type=float,
                   help="all-reduce message size in MiB (default: 256 on GPUs, 16 on CPU)")
    p.add_argument("--iters", type=int, default=5, help="timed all-reduces after one warm-up (default: 5)")
    p.add_argument("--nproc", type=int,
                   help="local processes for the all-reduce (default: one per GPU; 2 on CPU)")
    p.add_argument("--net-loopback", action="store_true",
                   help="NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_NVLS_ENABLE=0: local GPUs exchange data "
                        "through the network, so one node tests its RDMA path")
    p.add_argument("--timeout", type=float, default=300, help="seconds the all-reduce may take (default: 300)")
    p.add_argument("--log-dir", help="where the workers' NCCL logs are kept (default: a new temporary folder)")


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
        return Check("fabric", WARN, f"{where} and the environment sets none: doctor cannot tell whether RDMA is "
                                     "expected (pass --fabric, or --nccl-env with the project's config/nccl.env)")
    net = settings.effective.get("NCCL_NET", "")
    if expect.rdma and net.lower() == "socket":
        return Check("fabric", FAIL, f"RDMA expected ({expect.source}) but {settings.quote('NCCL_NET')} forces "
                                     "sockets; unset NCCL_NET")
    what = (f"RDMA expected: {expect.source}, "
            + (f"RoCE ({settings.quote('NCCL_IB_GID_INDEX')})" if expect.link == "RoCE" else "InfiniBand (no GID)")
            if expect.rdma else f"TCP: {expect.source}, NCCL uses sockets")
    file_value = settings.file.get("NCCL_IB_DISABLE")
    if "NCCL_IB_DISABLE" in settings.from_env and file_value is not None and \
            file_value != settings.effective["NCCL_IB_DISABLE"]:
        return Check("fabric", WARN, f"{what}; the environment overrides {settings.name}'s "
                                     f"NCCL_IB_DISABLE={file_value} (the platform's value wins)")
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
    return True, ports, (f"`ibv_devinfo` found {len(ports)} port(s)" if ports else
                         f"`ibv_devinfo` exit {out.returncode}: {said[0] if said else 'no output'}")


def check_rdma(ports: list[RdmaPort], tool: tuple[bool, str], expect: Expectation) -> Check:
    installed, said = tool
    listing = ", ".join(map(str, ports))
    if not ports:
        if expect.rdma:
            return Check("RDMA devices", FAIL, (
                f"none: {SYSFS_IB} is empty or missing and {said}; NCCL will fall back to sockets. Inside a "
                "container the RDMA devices must be passed in (Kubernetes: the RDMA device plugin resource and "
                "IPC_LOCK; Docker: --device /dev/infiniband --cap-add IPC_LOCK); or, if this cluster has no RDMA, "
                "regenerate with fabric=tcp"))
        if expect.rdma is False and not installed:
            return Check("RDMA devices", NA, f"none, and {said}; fabric tcp needs none")
        return Check("RDMA devices", OK if expect.rdma is False else NA, f"none ({said})")
    active = [p for p in ports if p.state == "ACTIVE"]
    if expect.rdma is False:
        return Check("RDMA devices", WARN, f"{listing}: present but {expect.source} keeps NCCL on sockets; "
                                           "fabric=infiniband or roce would use them")
    if expect.rdma and not active:
        return Check("RDMA devices", FAIL, f"{listing}: no ACTIVE port, NCCL will fall back to sockets (check the "
                                           "cable/switch: `ibstat`, `ibv_devinfo`)")
    links = {"RoCE" if p.link == "Ethernet" else "IB" for p in active}
    if expect.rdma and expect.link and expect.link not in links:
        fix = ("RoCE needs NCCL_IB_GID_INDEX (regenerate with fabric=roce)" if "RoCE" in links
               else "InfiniBand needs no NCCL_IB_GID_INDEX (regenerate with fabric=infiniband)")
        return Check("RDMA devices", WARN, f"{listing}: active ports are {'/'.join(sorted(links))}, "
                                           f"the config is for {expect.link}; {fix}")
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
        return any((p.device == name if exact else p.device.startswith(name)) and port in (None, p.port)
                   for name, port in items)

    return [p for p in ports if listed(p) != exclude]


def check_hca(settings: Settings, ports: list[RdmaPort], expect: Expectation) -> Check:
    spec = settings.effective.get("NCCL_IB_HCA")
    if expect.rdma is False:
        return Check("NCCL_IB_HCA", NA, "fabric tcp: NCCL uses no RDMA device")
    if spec is None:
        return Check("NCCL_IB_HCA", WARN if expect.rdma else NA,
                     "not set: NCCL uses every active RDMA port, a management NIC too")
    quoted = settings.quote("NCCL_IB_HCA")
    if not ports:
        verdict = FAIL if expect.rdma else NA
        return Check("NCCL_IB_HCA", verdict, f"{quoted} selects nothing: no RDMA device on this node (ibv_devinfo)")
    chosen = select_hcas(spec, ports)
    present = ", ".join(f"{p.device}:{p.port}" for p in ports)
    if not chosen:
        return Check("NCCL_IB_HCA", FAIL if expect.rdma else WARN, (
            f"{quoted} matches none of this node's ports ({present}); NCCL falls back to sockets. Fix it in "
            "config/nccl.env (copier answer nccl_ib_hca) or the platform's environment"))
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
        return Check(key, FAIL, f"{settings.quote(key)} matches no interface of this node ({here}): NCCL/Gloo cannot "
                                "start; unset it or name the cluster network's interface")
    return Check(key, WARN, f"{settings.quote(key)} matches no interface of this node ({here}), so the node launcher "
                            "does not apply it and the library picks one; fix nccl_socket_ifname "
                            "(copier update --data nccl_socket_ifname=<interface>)")


def check_shm(local_gpus: int, path: str = "/dev/shm") -> Check:
    try:
        st = os.statvfs(path)
    except OSError as exc:
        return Check("/dev/shm", WARN, f"cannot read {path}: {exc}; NCCL's SHM transport and DataLoader workers need it")
    size = st.f_frsize * st.f_blocks
    need = max(1, local_gpus) * GIB
    detail = f"{size / GIB:.1f} GiB"
    if size < need:
        return Check("/dev/shm", WARN, (
            f"{detail}, below {need // GIB} GiB (1 GiB per GPU): NCCL's SHM transport and DataLoader workers fail "
            "with bus errors or 'No space left on device'; Docker: --shm-size=16g, Kubernetes: an emptyDir with "
            "medium Memory at /dev/shm"))
    return Check("/dev/shm", OK, detail)


def check_memlock(expect: Expectation) -> Check:
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    if soft == resource.RLIM_INFINITY:
        return Check("memlock", OK, "unlimited")
    detail = f"{soft / MIB:.0f} MiB" if soft >= MIB else f"{soft // 1024} KiB"
    if not expect.rdma:
        return Check("memlock", OK, f"{detail} (only RDMA needs more)")
    fix = ("RDMA pins its buffers and wants it unlimited: Docker --ulimit memlock=-1, Kubernetes IPC_LOCK and "
           "the runtime's default ulimits, Slurm PropagateResourceLimits / `ulimit -l unlimited` in the node's limits")
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


# ---------------------------------------------------------------------------------------------
# All-reduce


def measure_allreduce(backend: str, nbytes: int, iters: int, local_rank: int, timeout: float) -> dict:
    """Time `iters` all-reduces of nbytes after one warm-up (which also sets up NCCL's connections).
    Joins the process group from RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT unless already joined."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=timedelta(seconds=timeout),
                                device_id=device if device.type == "cuda" else None)
    world = dist.get_world_size()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    x = torch.ones(max(1, nbytes // 4), dtype=torch.float32, device=device)
    dist.all_reduce(x)
    sync()
    correct = bool((x == world).all())
    dist.barrier()
    start = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    sync()
    seconds = torch.tensor([(time.perf_counter() - start) / iters], dtype=torch.float64, device=device)
    dist.all_reduce(seconds, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace, as in nccl-tests
    return {"backend": backend, "world": world, "bytes": x.numel() * 4, "iters": iters,
            "seconds": seconds.item(), "correct": correct}


def bandwidth(result: dict) -> tuple[float, float]:
    """(algbw, busbw) in GB/s; busbw = algbw * 2(n-1)/n, the all-reduce bus bandwidth of nccl-tests."""
    n = result["world"]
    algbw = result["bytes"] / result["seconds"] / 1e9
    return algbw, algbw * 2 * (n - 1) / n


def describe_result(result: dict) -> Check:
    algbw, busbw = bandwidth(result)
    detail = (f"{result['backend']}, {result['world']} processes x {result['bytes'] / MIB:.0f} MiB, "
              f"{result['iters']} iterations of {result['seconds'] * 1e3:.1f} ms: bus bandwidth {busbw:.2f} GB/s "
              f"(algbw {algbw:.2f} GB/s)")
    if not result["correct"]:
        return Check("all-reduce", FAIL, f"{detail}; WRONG RESULT: the sum differs from the number of ranks")
    return Check("all-reduce", OK, detail)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def local_allreduce(nproc: int, backend: str, nbytes: int, iters: int, timeout: float, env_extra: dict,
                    log_dir: Path) -> tuple[dict | None, str, list[Path]]:
    """Start `nproc` worker processes on this node; (rank 0's result or None, error, per-rank log files).
    Each worker's stdout and stderr (NCCL's INFO lines among them) go to log_dir/rank<N>.log."""
    port = _free_port()
    src = str(Path(__file__).resolve().parents[1])
    procs, logs = [], []
    for rank in range(nproc):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc),
                   LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **env_extra)
        env["PYTHONPATH"] = os.pathsep.join([src, *filter(None, [env.get("PYTHONPATH")])])
        env.pop("NCCL_DEBUG_FILE", None)  # NCCL's lines must land in the captured output
        logs.append(log_dir / f"rank{rank}.log")
        with open(logs[-1], "w") as out:
            procs.append(subprocess.Popen(
                [sys.executable, "-m", f"{__package__}.doctor", "--worker", backend, str(nbytes), str(iters),
                 str(timeout)], stdout=out, stderr=subprocess.STDOUT, env=env))
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            break
    hung = [rank for rank, p in enumerate(procs) if p.poll() is None]
    for rank in hung:
        procs[rank].kill()
        procs[rank].wait()
    if hung:
        return None, (f"ranks {hung} did not finish within {timeout:.0f} s: a hang, often a port blocked between "
                      f"the processes or a wrong NCCL_SOCKET_IFNAME/GLOO_SOCKET_IFNAME; logs in {log_dir}"), logs
    failed = [(rank, p.returncode) for rank, p in enumerate(procs) if p.returncode != 0]
    if failed:
        rank, code = failed[0]
        lines = [line.strip() for line in logs[rank].read_text(errors="replace").splitlines() if line.strip()]
        errors = [line for line in lines if "Error" in line or "error" in line or "NCCL WARN" in line]
        said = (errors or lines or ["no output"])[-1]
        return None, f"rank {rank} exited {code}: {said} (log {logs[rank]})", logs
    for line in logs[0].read_text(errors="replace").splitlines():
        if line.startswith(RESULT_MARK):
            return json.loads(line[len(RESULT_MARK):]), "", logs
    return None, f"rank 0 printed no result (log {logs[0]})", logs


def _worker(argv: list[str]) -> int:
    """`python -m <package>.doctor --worker BACKEND BYTES ITERS TIMEOUT`: one rank of the local all-reduce."""
    backend, nbytes, iters, timeout = argv[0], int(argv[1]), int(argv[2]), float(argv[3])
    import torch.distributed as dist

    result = measure_allreduce(backend, nbytes, iters, int(os.environ["LOCAL_RANK"]), timeout)
    if int(os.environ["RANK"]) == 0:
        print(RESULT_MARK + json.dumps(result), flush=True)
    dist.destroy_process_group()
    return 0


def job_allreduce(backend: str, nbytes: int, iters: int, timeout: float, local_rank: int, rank: int,
                  log_dir: Path) -> tuple[dict | None, str, list[tuple[str, str]]]:
    """Inside a job (torchrun, srun, mpirun ranks): every rank joins; (result, error, [(rank name, NCCL
    log text)] of ALL ranks, gathered so every rank can judge the job)."""
    import torch.distributed as dist

    nccl_file = log_dir / f"nccl.rank{rank}.log"
    if backend == "nccl":
        os.environ["NCCL_DEBUG_FILE"] = str(nccl_file)
    try:
        result = measure_allreduce(backend, nbytes, iters, local_rank, timeout)
    except Exception as exc:  # a failed NCCL init is a finding, not a crash
        text = nccl_file.read_text(errors="replace") if nccl_file.is_file() else ""
        return None, f"rank {rank}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}", \
            [(f"rank {rank} on {socket.gethostname()}", text)]
    text = nccl_file.read_text(errors="replace") if nccl_file.is_file() else ""
    text = "\n".join(line for line in text.splitlines() if "NCCL" in line)
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (f"rank {rank} on {socket.gethostname()}", text))
    dist.destroy_process_group()
    return result, "", gathered


# ---------------------------------------------------------------------------------------------
# The command


def print_table(title: str, checks: list[Check], notes: list[str] = ()) -> None:
    width = max((len(c.name) for c in checks), default=5)
    print(title)
    print(f"{'check':<{width}}  {'verdict':<7}  detail")
    indent = " " * (width + 11)
    for c in checks:
        lines = textwrap.wrap(c.detail, width=max(60, 118 - len(indent)), break_on_hyphens=False) or [""]
        print(f"{c.name:<{width}}  {c.verdict:<7}  {lines[0]}")
        for line in lines[1:]:
            print(indent + line)
    for note in notes:
        print(f"note: {note}")


def final_verdict(checks: list[Check]) -> int:
    failed = [c.name for c in checks if c.verdict == FAIL]
    warned = [c.name for c in checks if c.verdict == WARN]
    summary = f"{len(warned)} warning(s)" + (f" ({', '.join(warned)})" if warned else "")
    if failed:
        print(f"doctor: FAIL - {len(failed)} check(s) failed ({', '.join(failed)}); {summary}", flush=True)
        return 1
    print(f"doctor: {'warn' if warned else 'ok'} - no check failed; {summary}", flush=True)
    return 0


def nccl_env_path(args: argparse.Namespace) -> Path:
    return Path(args.nccl_env) if args.nccl_env else project_root() / "config" / "nccl.env"


def analyse_logs(args: argparse.Namespace, settings: Settings, expect: Expectation) -> int:
    try:
        logs = read_logs(args.nccl_log)
    except LogError as exc:
        raise ConfigError(str(exc)) from None
    job = merge(logs)
    checks = [check_fabric(settings, expect, args.fabric), *assess(job, expect)]
    print_table(f"doctor: NCCL logs of an earlier job, judged against {expect.source or 'no fabric'}", checks)
    if len(logs) > 1:
        print("per file:")
        for log in logs:
            nets = ", ".join(sorted(log.networks)) or "no `Using network` line"
            print(f"  {log.sources[0]}: {log.lines} NCCL lines, {nets}, {len(log.connections)} connections")
    rows = connection_table(job)
    if rows:
        print("connections (sender -> receiver, direction, transport, channels):")
        print("\n".join("  " + r for r in rows))
    return final_verdict(checks)


def node_checks(cfg: Config, settings: Settings, expect: Expectation, args: argparse.Namespace,
                gpus: list[str], why: str) -> list[Check]:
    sysfs = read_sysfs()
    installed, tool_ports, said = run_ibv_devinfo()
    known = {(p.device, p.port) for p in sysfs}
    ports = sysfs + [p for p in tool_ports if (p.device, p.port) not in known]
    interfaces = [name for _, name in socket.if_nameindex()]
    return [
        check_gpus(gpus, why, cfg),
        check_fabric(settings, expect, args.fabric),
        check_rdma(ports, (installed, said), expect),
        check_hca(settings, ports, expect),
        check_interface(settings, "NCCL_SOCKET_IFNAME", interfaces),
        check_interface(settings, "GLOO_SOCKET_IFNAME", interfaces),
        check_shm(len(gpus)),
        check_memlock(expect),
    ]


def nccl_checks(texts: list[tuple[str, str]], expect: Expectation) -> list[Check]:
    checks = assess(merge([parse(text, name) for name, text in texts]), expect)
    return [c for c in checks if c.name != "NCCL log" or c.verdict == FAIL]


def run(cfg: Config, args: argparse.Namespace) -> int:
    settings = load_settings(nccl_env_path(args))
    expect = expectation(settings, args.fabric)
    if args.nccl_log:
        return analyse_logs(args, settings, expect)

    from .topology import process_ranks

    rank, local_rank, world = process_ranks(os.environ)
    gpus, why = gpu_info()
    notes: list[str] = []
    checks = node_checks(cfg, settings, expect, args, gpus, why) if local_rank == 0 else []
    try:  # as the node launcher does: config/nccl.env under what the platform set
        apply_nccl_env(log=notes.append, values=settings.file)
    except OSError as exc:
        notes.append(f"config/nccl-debug.env not fully applied: {exc}")
    title = (f"doctor on {socket.gethostname()}" + (f" (rank {rank} of {world})" if world > 1 else "")
             + f"; fabric: {expect.source}")

    if args.no_allreduce:
        if local_rank != 0:  # one table per node
            return 0
        print_table(title, checks, notes)
        return final_verdict(checks)

    backend = "nccl" if gpus else "gloo"
    nbytes = int((args.size_mb or (256 if gpus else 16)) * MIB)
    extra = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"} if gpus else {}
    if args.net_loopback and gpus:
        extra.update(NCCL_P2P_DISABLE="1", NCCL_SHM_DISABLE="1", NCCL_NVLS_ENABLE="0")
    elif args.net_loopback:
        notes.append("--net-loopback ignored: it steers NCCL, and without GPUs the all-reduce runs on Gloo")
    log_dir = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="doctor-"))
    log_dir.mkdir(parents=True, exist_ok=True)

    if world > 1:
        os.environ.update(extra)
        _set_master(cfg)
        result, error, texts = job_allreduce(backend, nbytes, args.iters, args.timeout, local_rank, rank, log_dir)
    else:
        nproc = args.nproc or (len(gpus) if gpus else 2)
        if gpus and not 2 <= nproc <= len(gpus):
            checks.append(Check("all-reduce", NA, (
                f"{len(gpus)} GPU(s) here, {nproc} process(es) asked: an all-reduce needs 2 to {len(gpus)}; run "
                "doctor under torchrun or srun across nodes instead")))
            print_table(title, checks, notes)
            return final_verdict(checks)
        result, error, logs = local_allreduce(nproc, backend, nbytes, args.iters, args.timeout, extra, log_dir)
        texts = [(str(p), p.read_text(errors="replace")) for p in logs]

    checks.append(describe_result(result) if result else Check("all-reduce", FAIL, error))
    if gpus:
        checks += nccl_checks(texts, expect)
        notes.append(f"NCCL logs in {log_dir} (read them again with --nccl-log {log_dir})")
    else:
        for name in ("NCCL version", "NCCL network", "NCCL transports", "GPUDirect RDMA"):
            checks.append(Check(name, NA, "no GPU: the all-reduce ran on Gloo"))
    if rank == 0 or local_rank == 0:
        print_table(title, checks, notes)
        return final_verdict(checks)
    return 1 if any(c.verdict == FAIL for c in checks) else 0


def _set_master(cfg: Config) -> None:
    """MASTER_ADDR/PORT for srun and mpirun ranks, found as the node launcher finds them."""
    if os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        return
    from .topology import default_nproc, detect

    topo = detect(os.environ, default_nproc(cfg.cluster.gpus_per_node), cfg.cluster.nodes)
    if topo is None:
        raise ConfigError("doctor runs as one rank of several but MASTER_ADDR/MASTER_PORT are not set and no platform "
                          "variables name a master; start it with torchrun, srun or mpirun")
    os.environ.setdefault("MASTER_ADDR", topo.master_addr)
    os.environ.setdefault("MASTER_PORT", str(topo.master_port))


if __name__ == "__main__":
    if sys.argv[1:2] != ["--worker"]:
        sys.exit(f"this entry point is doctor's all-reduce worker; run `{__package__} doctor` instead")
    sys.exit(_worker(sys.argv[2:]))
