"""`doctor`: the node checks, the all-reduce (Gloo on CPU, standalone and under torchrun) and --nccl-log.

    python -m pytest -q tests/test_doctor.py

Real processes: doctor starts its all-reduce workers (or runs inside torchrun's), and the verdict is
its exit code. The fabric comes from an nccl.env written here (--nccl-env), so the project's own
config/nccl.env does not decide the outcome; the interfaces are `lo`, which every machine has. On a
machine without GPUs the NCCL lines are n/a; the GPU path (NCCL, its log) is not exercised here.
"""

from __future__ import annotations

import os
import re
import resource
import sys
from pathlib import Path

import pytest

# Variables doctor reads: a value left in the test's environment would win over the nccl.env files.
CLEAN = {
    key: None
    for key in (
        "NCCL_IB_DISABLE",
        "NCCL_IB_HCA",
        "NCCL_IB_GID_INDEX",
        "NCCL_NET",
        "NCCL_SOCKET_IFNAME",
        "GLOO_SOCKET_IFNAME",
        "TRAIN_DEBUG",
        "NCCL_IB_TC",
        "NCCL_IB_SL",
        "NCCL_IB_QPS_PER_CONNECTION",
        "NCCL_IB_TIMEOUT",
        "NCCL_NET_GDR_LEVEL",
        "NCCL_PXN_DISABLE",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "OMPI_COMM_WORLD_RANK",
        "SLURM_PROCID",
    )
}
TCP_ENV = "NCCL_SOCKET_IFNAME=lo\nGLOO_SOCKET_IFNAME=lo\nNCCL_IB_DISABLE=1\n"
# RDMA expected; the HCA name exists on no machine, so NCCL_IB_HCA fails even where RDMA devices exist.
IB_ENV = "NCCL_SOCKET_IFNAME=lo\nGLOO_SOCKET_IFNAME=lo\nNCCL_IB_DISABLE=0\nNCCL_IB_HCA==nosuchhca_0\n"


@pytest.fixture
def checks(pkg):
    return pkg.node_checks


@pytest.fixture
def rdma(pkg):
    return pkg.rdma


@pytest.fixture
def fabric(pkg):
    return pkg.fabric


def rows(stdout: str) -> dict[str, tuple[str, str]]:
    """The table: check name -> (verdict, first line of the detail)."""
    table = {}
    for line in stdout.splitlines():
        m = re.match(r"^(\S[\w/ -]*?\S)\s{2,}(ok|warn|FAIL|n/a)\s{2,}(.*)$", line)
        if m:
            table[m.group(1)] = (m.group(2), m.group(3))
    return table


def port(rdma, device, port, state="ACTIVE", link="InfiniBand"):
    return rdma.RdmaPort(device, port, state, link)


def test_ib_hca_selection_follows_nccl_rules(rdma):
    ports = [
        port(rdma, "mlx5_0", 1),
        port(rdma, "mlx5_1", 1),
        port(rdma, "mlx5_1", 2),
        port(rdma, "mlx5_10", 1),
        port(rdma, "ib_bond0", 1),
    ]

    def names(spec):
        return [f"{p.device}:{p.port}" for p in rdma.select_hcas(spec, ports)]

    assert names("mlx5") == ["mlx5_0:1", "mlx5_1:1", "mlx5_1:2", "mlx5_10:1"]  # prefix
    assert names("mlx5_1") == ["mlx5_1:1", "mlx5_1:2", "mlx5_10:1"]
    assert names("=mlx5_1") == ["mlx5_1:1", "mlx5_1:2"]  # exact
    assert names("=mlx5_1:2,mlx5_0:1") == ["mlx5_0:1", "mlx5_1:2"]  # ports
    assert names("^mlx5_1") == ["mlx5_0:1", "ib_bond0:1"]  # exclude prefix
    assert names("^=mlx5_1") == ["mlx5_0:1", "mlx5_10:1", "ib_bond0:1"]  # exclude exact
    assert names("^=mlx5_1:2") == ["mlx5_0:1", "mlx5_1:1", "mlx5_10:1", "ib_bond0:1"]
    assert names("mlx4") == []


def test_rdma_ports_from_ibv_devinfo_and_sysfs(rdma, tmp_path):
    text = (
        "hca_id:\tmlx5_0\n\ttransport:\t\t\tInfiniBand (0)\n\tfw_ver:\t\t\t\t28.39.1002\n"
        "\tphys_port_cnt:\t\t\t1\n\t\tport:\t1\n\t\t\tstate:\t\t\tPORT_ACTIVE (4)\n"
        "\t\t\tmax_mtu:\t\t4096 (5)\n\t\t\tphys_state:\t\tLINK_UP (5)\n\t\t\tlink_layer:\t\tInfiniBand\n\n"
        "hca_id:\tmlx5_1\n\ttransport:\t\t\tInfiniBand (0)\n\tphys_port_cnt:\t\t\t1\n\t\tport:\t1\n"
        "\t\t\tstate:\t\t\tPORT_DOWN (1)\n\t\t\tlink_layer:\t\tEthernet\n"
    )
    assert [str(p) for p in rdma.parse_ibv_devinfo(text)] == ["mlx5_0:1 ACTIVE InfiniBand", "mlx5_1:1 DOWN RoCE"]
    assert rdma.parse_ibv_devinfo("No IB devices found\n") == []

    root = tmp_path / "infiniband"
    for dev, state, link in (("mlx5_0", "4: ACTIVE", "InfiniBand"), ("mlx5_1", "1: DOWN", "Ethernet")):
        (root / dev / "ports" / "1").mkdir(parents=True)
        (root / dev / "ports" / "1" / "state").write_text(state + "\n")
        (root / dev / "ports" / "1" / "link_layer").write_text(link + "\n")
    assert rdma.read_sysfs(root) == rdma.parse_ibv_devinfo(text)
    assert rdma.read_sysfs(tmp_path / "absent") == []


def test_settings_environment_wins_and_decides_the_fabric(checks, fabric, rdma, tmp_path):
    env_file = tmp_path / "nccl.env"
    env_file.write_text(
        "# RoCE\nNCCL_IB_DISABLE=0\nNCCL_IB_HCA=mlx5\nNCCL_IB_GID_INDEX=3\nNCCL_SOCKET_IFNAME=nosuch0\n"
    )
    plain = fabric.load_settings(env_file, env={})
    expect = fabric.expectation(plain)
    assert (expect.rdma, expect.link) == (True, "RoCE") and str(env_file) in expect.source
    assert fabric.check_fabric(plain, expect, None).verdict == "ok"

    # The platform injected NCCL_IB_DISABLE=1: it wins, and doctor says so.
    platform = fabric.load_settings(env_file, env={"NCCL_IB_DISABLE": "1", "NCCL_SOCKET_IFNAME": "nosuch1"})
    expect = fabric.expectation(platform)
    assert expect.rdma is False and "(environment)" in expect.source
    overridden = fabric.check_fabric(platform, expect, None)
    assert overridden.verdict == "warn" and "overrides" in overridden.detail
    assert fabric.expectation(platform, "infiniband").rdma is True

    # A missing interface from the file is skipped by the node launcher (warn); from the environment
    # it breaks NCCL and Gloo (FAIL).
    assert checks.check_interface(plain, "NCCL_SOCKET_IFNAME", ["lo", "eth0"]).verdict == "warn"
    assert checks.check_interface(platform, "NCCL_SOCKET_IFNAME", ["lo", "eth0"]).verdict == "FAIL"
    assert checks.check_interface(plain, "GLOO_SOCKET_IFNAME", ["lo"]).verdict == "ok"  # not set

    # No RDMA device although RDMA is expected: both lines fail and name the tools to check with.
    ports = rdma.check_rdma([], (False, "ibv_devinfo is not installed"), fabric.expectation(plain))
    hca = rdma.check_hca(plain, [], fabric.expectation(plain))
    assert ports.verdict == hca.verdict == "FAIL" and "ibv_devinfo" in ports.detail and "NCCL_IB_HCA" in hca.detail
    assert rdma.check_hca(platform, [], fabric.expectation(platform)).verdict == "n/a"


# A RoCE nccl.env as the template writes it (fabric roce), with TI-ONE's tunables.
ROCE_ENV = (
    "NCCL_SOCKET_IFNAME=lo\nGLOO_SOCKET_IFNAME=lo\nNCCL_IB_DISABLE=0\nNCCL_IB_HCA=mlx5\nNCCL_IB_GID_INDEX=3\n"
    "NCCL_IB_TC=106\nNCCL_IB_SL=3\nNCCL_IB_QPS_PER_CONNECTION=4\nNCCL_IB_TIMEOUT=24\n"
    "NCCL_NET_GDR_LEVEL=2\nNCCL_PXN_DISABLE=1\n"
)


def test_apply_nccl_env_keeps_what_the_platform_injected(pkg, tmp_path, monkeypatch):
    values = pkg.config.read_env_file(write(tmp_path / "nccl.env", ROCE_ENV))
    for key in values:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.delenv("TRAIN_DEBUG", raising=False)
    # TI-ONE's HCC machines inject their own traffic class and timeout.
    monkeypatch.setenv("NCCL_IB_TC", "160")
    monkeypatch.setenv("NCCL_IB_TIMEOUT", "22")
    said = []
    pkg.nccl_env.apply_nccl_env(log=said.append, values=values)
    assert os.environ["NCCL_IB_TC"] == "160" and os.environ["NCCL_IB_TIMEOUT"] == "22"
    for key in ("NCCL_IB_SL", "NCCL_IB_QPS_PER_CONNECTION", "NCCL_NET_GDR_LEVEL", "NCCL_PXN_DISABLE"):
        assert os.environ[key] == values[key], key
    assert said == ["kept the platform's NCCL_IB_TC, NCCL_IB_TIMEOUT over config/nccl.env"]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_settings_in_effect_name_their_source(fabric, tmp_path):
    env_file = write(tmp_path / "nccl.env", ROCE_ENV.replace("NCCL_IB_TIMEOUT=24\n", ""))
    injected = {"NCCL_IB_TC": "160", "NCCL_IB_SL": "3", "NCCL_CHECK_DISABLE": "1", "PATH": "/bin"}
    rows = {r.name: r for r in fabric.settings_in_effect(fabric.load_settings(env_file, env=injected))}
    source = {name: (r.value, r.source, r.note) for name, r in rows.items()}
    # The platform's value wins and says what it overrides; an equal one overrides nothing.
    assert source["NCCL_IB_TC"] == ("160", "environment", f"over {env_file}'s 106")
    assert source["NCCL_IB_SL"] == ("3", "environment", "")
    assert source["NCCL_IB_QPS_PER_CONNECTION"] == ("4", str(env_file), "")
    assert source["NCCL_PXN_DISABLE"] == ("1", str(env_file), "")
    # Set by nobody: NCCL's own default.
    assert source["NCCL_IB_TIMEOUT"] == ("20", "NCCL's default", "")
    # Injected variables the file does not name are listed too; other variables are not.
    assert source["NCCL_CHECK_DISABLE"] == ("1", "environment", "") and "PATH" not in rows
    assert list(rows)[:3] == ["NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "NCCL_IB_DISABLE"]  # the file's order


def test_doctor_reports_the_nccl_settings_in_effect(cli, tmp_path):
    env_file = write(tmp_path / "nccl.env", ROCE_ENV)
    proc = cli("doctor", "--nccl-env", env_file, "--no-allreduce", env={**CLEAN, "NCCL_IB_TC": "160"}, expect=None)
    section = proc.stdout.split("NCCL settings in effect", 1)[1].splitlines()[1:]
    listed = {line.split()[0]: line.split(None, 2)[1:] for line in section if line.startswith("  ")}
    assert listed["NCCL_IB_TC"] == ["160", f"environment (over {env_file}'s 106)"]
    for name, value in (("NCCL_IB_SL", "3"), ("NCCL_IB_QPS_PER_CONNECTION", "4"), ("NCCL_NET_GDR_LEVEL", "2")):
        assert listed[name] == [value, str(env_file)], name
    assert listed["NCCL_IB_TIMEOUT"] == ["24", str(env_file)]
    assert "kept the platform's NCCL_IB_TC over config/nccl.env" in proc.stdout


def test_shm_and_memlock_verdicts(checks, fabric, tmp_path):
    assert checks.check_shm(1 << 20).verdict == "warn"  # asks 1 GiB per GPU for a million GPUs
    assert checks.check_shm(0, str(tmp_path / "absent")).verdict == "warn"
    tcp = fabric.Expectation(rdma=False, source="tcp")
    rdma = fabric.Expectation(rdma=True, link="IB", source="ib")
    assert checks.check_memlock(tcp).verdict == "ok"
    soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    want = "ok" if soft == resource.RLIM_INFINITY else ("warn" if soft >= 1 << 30 else "FAIL")
    assert checks.check_memlock(rdma).verdict == want


def test_doctor_on_a_tcp_node_runs_a_gloo_allreduce(cli, tmp_path):
    env_file = tmp_path / "nccl.env"
    env_file.write_text(TCP_ENV)
    proc = cli(
        "doctor", "--nccl-env", env_file, "--size-mb", 8, "--iters", 3, "--log-dir", tmp_path / "logs", env=CLEAN
    )
    table = rows(proc.stdout)
    assert table["GPUs"][0] in ("n/a", "ok", "warn")
    assert table["fabric"][0] == "ok" and "TCP" in table["fabric"][1]
    assert table["NCCL_IB_HCA"][0] == "n/a" and table["NCCL_SOCKET_IFNAME"][0] == "ok"
    verdict, allreduce = table["all-reduce"]
    assert verdict == "ok", proc.stdout
    if table["GPUs"][0] == "n/a":
        assert allreduce.startswith("gloo, 2 processes x 8 MiB, 3 iterations")
        assert re.search(r"bus bandwidth \d+\.\d\d", proc.stdout)
        for name in ("NCCL version", "NCCL network", "NCCL transports", "GPUDirect RDMA"):
            assert table[name] == ("n/a", "no GPU: the all-reduce ran on Gloo")
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["rank0.log", "rank1.log"]
    assert re.search(r"^doctor: (ok|warn) - no check failed", proc.stdout, re.M)


def test_doctor_expecting_rdma_without_devices_fails_under_torchrun(cli, tmp_path):
    env_file = tmp_path / "nccl.env"
    env_file.write_text(IB_ENV)
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "-m",
        cli.package,
        "doctor",
        "--nccl-env",
        env_file,
        "--size-mb",
        4,
        "--iters",
        2,
    ]
    proc = cli.run(cmd, env=CLEAN, expect=1)
    table = rows(proc.stdout)
    assert "(rank 0 of 2)" in proc.stdout and "RDMA expected" in table["fabric"][1]
    assert table["NCCL_IB_HCA"][0] == "FAIL" and "NCCL_IB_HCA==nosuchhca_0" in table["NCCL_IB_HCA"][1]
    if not list(Path("/sys/class/infiniband").glob("*")):
        assert table["RDMA devices"][0] == "FAIL" and "ibv_devinfo" in proc.stdout
    assert table["all-reduce"][0] == "ok", proc.stdout  # the job's own ranks: 2 processes
    assert "2 processes" in table["all-reduce"][1]
    assert re.search(r"^doctor: FAIL - \d+ check\(s\) failed \(.*NCCL_IB_HCA", proc.stdout, re.M)


def write_logs(folder: Path, transport: str) -> None:
    """Two ranks on two hosts, in NCCL's INFO format, connected over `transport` (IB or Socket)."""
    folder.mkdir()
    for rank, host, peer in ((0, "gpu-a", 1), (1, "gpu-b", 0)):
        lines = [f"{host}:700:701 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.{rank + 1}<0>"]
        if transport == "IB":
            lines.append(
                f"{host}:700:760 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [RO]; OOB eth0:10.0.0.{rank + 1}<0>"
            )
            path = "NET/IB/0/GDRDMA"
        else:
            lines.append(f"{host}:700:760 [0] NCCL INFO NET/IB : No device found.")
            lines.append(f"{host}:700:760 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.{rank + 1}<0>")
            path = "NET/Socket/0"
        lines.append(f"{host}:700:760 [0] NCCL INFO Using network {transport}")
        for ch in range(2):
            lines.append(
                f"{host}:700:760 [0] NCCL INFO Channel {ch:02d}/0 : {peer}[0] -> {rank}[0] [receive] via {path}"
            )
            lines.append(f"{host}:700:760 [0] NCCL INFO Channel {ch:02d}/0 : {rank}[0] -> {peer}[0] [send] via {path}")
        (folder / f"rank{rank}.log").write_text("\n".join(lines) + "\n")


def test_nccl_log_judges_an_earlier_job(cli, tmp_path):
    ib_env, tcp_env = tmp_path / "ib.env", tmp_path / "tcp.env"
    ib_env.write_text(IB_ENV)
    tcp_env.write_text(TCP_ENV)
    write_logs(tmp_path / "socket", "Socket")
    write_logs(tmp_path / "ib", "IB")

    proc = cli("doctor", "--nccl-log", tmp_path / "socket", "--nccl-env", ib_env, env=CLEAN, expect=1)
    table = rows(proc.stdout)
    assert table["NCCL transports"][0] == "FAIL" and "SOCKET FALLBACK" in proc.stdout
    assert "No device found" in proc.stdout and "hosts gpu-a, gpu-b" in table["NCCL log"][1]
    assert "rank0.log: " in proc.stdout and "rank1.log: " in proc.stdout  # per file
    assert "doctor: FAIL" in proc.stdout

    # The same logs on a TCP fabric are what was asked for.
    proc = cli("doctor", "--nccl-log", tmp_path / "socket", "--nccl-env", tcp_env, env=CLEAN)
    assert rows(proc.stdout)["NCCL transports"][0] == "ok"
    proc = cli("doctor", "--nccl-log", tmp_path / "socket", "--fabric", "tcp", "--nccl-env", ib_env, env=CLEAN)
    assert rows(proc.stdout)["fabric"] == ("ok", "judged as tcp (--fabric)")

    # RDMA with GPUDirect, files given one by one: ok, and the connections per peer are listed.
    proc = cli(
        "doctor",
        "--nccl-log",
        tmp_path / "ib" / "rank0.log",
        "--nccl-log",
        tmp_path / "ib" / "rank1.log",
        "--nccl-env",
        ib_env,
        env=CLEAN,
    )
    table = rows(proc.stdout)
    assert table["GPUDirect RDMA"] == ("ok", "all 8 NET/IB connections use GDRDMA")
    assert re.search(r"rank +0 -> 1 +send +NET/IB/0/GDRDMA +channels 0-1", proc.stdout)


def test_a_quoted_command_or_log_line_is_never_split_across_lines(pkg):
    """Where the table wraps a detail depends on what comes before a quote (a path, a host name): the
    quote stays whole wherever it falls, so it can be searched for and copied."""
    quote = "`NET/IB : No device found`"
    for lead in range(0, 90, 7):
        detail = f"/{'x' * lead} NCCL said {quote}; check `ibv_devinfo` there"
        lines = pkg.doctor.wrap_keeping_quotes(detail, 60)
        assert any(quote in line for line in lines), lines
        assert all(len(line) <= 60 or " " not in line for line in lines), lines  # only a long path is longer
        assert " ".join(lines).split() == detail.split()


def test_nccl_log_mistakes_are_clear(cli, tmp_path):
    proc = cli("doctor", "--nccl-log", tmp_path / "missing.log", env=CLEAN, expect=1)
    assert proc.stderr.startswith("error: --nccl-log") and "no such file or folder" in proc.stderr
    assert "Traceback" not in proc.stderr
    empty = tmp_path / "job.out"
    empty.write_text("training started\nstep 1 loss 9.1\n")
    proc = cli("doctor", "--nccl-log", empty, "--fabric", "infiniband", env=CLEAN, expect=1)
    assert rows(proc.stdout)["NCCL log"][0] == "FAIL" and "TRAIN_DEBUG=1" in proc.stdout
