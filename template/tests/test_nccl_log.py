"""NCCL log analysis (nccl_log.py reads, nccl_verdict.py judges): transports, GPUDirect RDMA, RoCE,
the socket fallback, several ranks.

    python -m pytest -q tests/test_nccl_log.py

The logs are written here from the line formats NCCL documents and prints at NCCL_DEBUG=INFO with
NCCL_DEBUG_SUBSYS=INIT,NET (`host:pid:tid [dev] NCCL INFO <message>`); hosts, ranks and addresses
are made up. Pure functions: no torch, no processes.
"""

from __future__ import annotations

import pytest


def info(host: str, dev: int, msg: str, pid: int = 4100) -> str:
    return f"{host}:{pid + dev}:{pid + 90 + dev} [{dev}] NCCL INFO {msg}"


def node_log(
    host: str,
    addr: str,
    *,
    net: str = "IB",
    links: str = "[0]mlx5_0:1/IB [1]mlx5_1:1/IB",
    net_path: str = "NET/IB/0/GDRDMA",
    local: str = "P2P/IPC/read",
    base: int = 0,
    peer: int = 2,
) -> str:
    """What the two GPUs (ranks base, base+1) of one node print: init lines, two channels to the
    other node's first rank (`peer`) over the network and one intra-node hop each way."""
    lines = [
        "NCCL version 2.21.5+cuda12.4",
        info(host, 0, "cudaDriverVersion 12040"),
        info(host, 0, "NCCL_SOCKET_IFNAME set by environment to eth0"),
        info(host, 0, f"Bootstrap : Using eth0:{addr}<0>"),
    ]
    if net == "IB":
        lines += [info(host, d, f"NET/IB : Using {links} [RO]; OOB eth0:{addr}<0>") for d in (0, 1)]
    else:
        lines += [info(host, d, "NET/IB : No device found.") for d in (0, 1)]
        lines += [info(host, d, f"NET/Socket : Using [0]eth0:{addr}<0>") for d in (0, 1)]
    lines += [info(host, d, f"Using network {net}") for d in (0, 1)]
    for ch in (0, 1):
        lines += [
            info(host, 0, f"Channel {ch:02d}/0 : {peer + 1}[1] -> {base}[0] [receive] via {net_path}"),
            info(host, 1, f"Channel {ch:02d}/0 : {base + 1}[1] -> {peer}[0] [send] via {net_path}"),
            info(host, 0, f"Channel {ch:02d}/0 : {base}[0] -> {base + 1}[1] via {local}"),
        ]
    lines += [info(host, 0, "Connected all rings"), info(host, 0, "2 coll channels, 0 nvls channels, 2 p2p channels")]
    return "\n".join(lines) + "\n"


@pytest.fixture
def nl(pkg):
    return pkg.nccl_log


@pytest.fixture
def judge(pkg):
    """judge(log, RDMA_IB): doctor's NCCL lines for a parsed log, against a fabric given by Expectation's fields."""
    return lambda log, fabric: pkg.nccl_verdict.assess(log, pkg.fabric.Expectation(**fabric))


def verdicts(checks) -> dict[str, str]:
    return {c.name: c.verdict for c in checks}


def detail(checks, name: str) -> str:
    return next(c.detail for c in checks if c.name == name)


RDMA_IB = dict(rdma=True, link="IB", source="NCCL_IB_DISABLE=0 (config/nccl.env)")
RDMA_ROCE = dict(rdma=True, link="RoCE", source="NCCL_IB_DISABLE=0 (config/nccl.env)")
TCP = dict(rdma=False, link=None, source="NCCL_IB_DISABLE=1 (config/nccl.env)")


def test_infiniband_with_gpudirect_rdma(nl, judge):
    log = nl.parse(node_log("gpu-a", "10.0.0.1"), "rank0.log")
    assert log.versions == {"2.21.5+cuda12.4"} and log.cuda_drivers == {"12.4"}
    assert log.networks == {"IB"} and log.hosts == {"gpu-a"}
    assert {str(p) for p in log.ib_ports} == {"mlx5_0:1/IB", "mlx5_1:1/IB"}
    assert log.bootstrap_ifaces == {"eth0:10.0.0.1"}
    assert len(log.net_connections) == 4 and all(c.gdr and c.net == "IB" for c in log.net_connections)
    assert log.settings["NCCL_SOCKET_IFNAME"] == {"eth0"}

    checks = judge(log, RDMA_IB)
    assert verdicts(checks) == {
        "NCCL log": "ok",
        "NCCL version": "ok",
        "NCCL network": "ok",
        "NCCL transports": "ok",
        "GPUDirect RDMA": "ok",
        "socket interface": "ok",
    }
    assert "2.21.5+cuda12.4, CUDA driver 12.4" == detail(checks, "NCCL version")
    assert "inter-node NET/IB x4; intra-node P2P/IPC x2" == detail(checks, "NCCL transports")
    assert "all 4 NET/IB connections use GDRDMA" == detail(checks, "GPUDirect RDMA")
    assert "mlx5_0:1/IB mlx5_1:1/IB" in detail(checks, "NCCL network")


def test_infiniband_without_gpudirect_rdma_is_a_warning(nl, judge):
    log = nl.parse(node_log("gpu-a", "10.0.0.1", net_path="NET/IB/0"))
    checks = judge(log, RDMA_IB)
    assert verdicts(checks)["GPUDirect RDMA"] == "warn" and "FAIL" not in verdicts(checks).values()
    assert "0/4 NET/IB connections use GDRDMA" in detail(checks, "GPUDirect RDMA")
    assert "nvidia-peermem" in detail(checks, "GPUDirect RDMA")


def test_roce_ports_against_roce_and_infiniband_configs(nl, judge):
    log = nl.parse(node_log("gpu-a", "10.0.0.1", links="[0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE"))
    assert {p.link for p in log.ib_ports} == {"RoCE"}
    assert verdicts(judge(log, RDMA_ROCE))["NCCL network"] == "ok"
    # RoCE ports under an InfiniBand config: NCCL_IB_GID_INDEX is missing; worth a warning, not a failure.
    checks = judge(log, RDMA_IB)
    assert verdicts(checks)["NCCL network"] == "warn" and "NCCL_IB_GID_INDEX" in detail(checks, "NCCL network")


def test_socket_fallback_fails_when_rdma_is_expected(nl, judge):
    text = node_log("gpu-a", "10.0.0.1", net="Socket", net_path="NET/Socket/0")
    text += info("gpu-a", 0, "NCCL_IB_DISABLE set by environment to 1.") + "\n"
    log = nl.parse(text, "rank0.log")
    assert log.ib_no_device and log.networks == {"Socket"} and log.socket_ifaces == {"eth0:10.0.0.1"}

    checks = judge(log, RDMA_IB)
    assert verdicts(checks)["NCCL network"] == "FAIL" and verdicts(checks)["NCCL transports"] == "FAIL"
    network = detail(checks, "NCCL network")
    assert "No device found" in network and "NCCL_IB_DISABLE=1" in network and "ibv_devinfo" in network
    assert "SOCKET FALLBACK: 4 connection(s) via NET/Socket" in detail(checks, "NCCL transports")
    assert verdicts(checks)["GPUDirect RDMA"] == "n/a"
    # Channel lines alone (the `Using network` lines cut off) still fail, with the causes.
    cut = nl.parse("\n".join(line for line in text.splitlines() if "Using network" not in line))
    checks = judge(cut, RDMA_IB)
    assert verdicts(checks)["NCCL transports"] == "FAIL" and "ibv_devinfo" in detail(checks, "NCCL transports")


def test_sockets_are_fine_on_a_tcp_fabric(nl, judge):
    log = nl.parse(node_log("gpu-a", "10.0.0.1", net="Socket", net_path="NET/Socket/0"))
    checks = judge(log, TCP)
    assert "FAIL" not in verdicts(checks).values() and "warn" not in verdicts(checks).values()
    assert "NET/Socket eth0:10.0.0.1" in detail(checks, "socket interface")
    assert "inter-node NET/Socket x4" in detail(checks, "NCCL transports")
    # The other way round, RDMA on a cluster the answers call TCP, is only a warning.
    rdma = judge(nl.parse(node_log("gpu-a", "10.0.0.1")), TCP)
    assert verdicts(rdma)["NCCL network"] == "warn"


def test_mixed_intra_node_and_inter_node_transports(nl, judge, pkg):
    text = node_log("gpu-a", "10.0.0.1", local="P2P/CUMEM/read")
    text += (
        "\n".join(
            [
                info("gpu-a", 0, "Channel 02 : 0[0] -> 1[1] via SHM/direct/direct"),
                info("gpu-a", 1, "Channel 03/0 : 1[1] -> 0[0] via P2P/direct pointer"),
                info("gpu-a", 1, "Channel 02/0 : 1[1] -> 2[0] [send] via NET/IB/1(0)/GDRDMA"),  # PXN through rank 0
                info("gpu-a", 0, "24 coll channels, 16 collnet channels, 16 nvls channels, 32 p2p channels"),
            ]
        )
        + "\n"
    )
    log = nl.parse(text)
    kinds = sorted({c.kind for c in log.connections})
    assert kinds == ["NET/IB", "P2P/CUMEM", "P2P/direct", "SHM"]
    assert log.nvls_channels == 16
    checks = judge(log, RDMA_IB)
    assert "FAIL" not in verdicts(checks).values()
    assert detail(checks, "NCCL transports") == (
        "inter-node NET/IB x5; intra-node P2P/CUMEM x2, P2P/direct x1, SHM x1; NVLS 16 channels"
    )
    rows = pkg.nccl_verdict.connection_table(log)
    assert any("rank   1 -> 2   send     NET/IB/0/GDRDMA" in r and r.endswith("channels 0-1") for r in rows)
    assert any("NET/IB/1(0)/GDRDMA" in r and r.endswith("channels 2") for r in rows)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "\n\n",
        "Traceback (most recent call last):\n  oops\nKeyError: 3\n",
        "\x00\x01binary\xff junk NCCL without a level\n",
    ],
)
def test_logs_without_nccl_lines_say_how_to_get_them(nl, judge, text):
    checks = judge(nl.parse(text, "job.out"), RDMA_IB)
    assert [(c.name, c.verdict) for c in checks] == [("NCCL log", "FAIL")]
    assert "no NCCL lines in job.out" in checks[0].detail and "TRAIN_DEBUG=1" in checks[0].detail


def test_missing_paths_and_empty_folders_are_errors(nl, tmp_path):
    with pytest.raises(nl.LogError, match="no such file or folder"):
        nl.log_files([str(tmp_path / "nope.log")])
    (tmp_path / "empty").mkdir()
    with pytest.raises(nl.LogError, match="holds no files"):
        nl.log_files([str(tmp_path / "empty")])


def test_several_rank_files_make_one_job(nl, judge, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "rank0.log").write_text(node_log("gpu-a", "10.0.0.1", base=0, peer=2))
    (logs / "rank2.log").write_text(node_log("gpu-b", "10.0.0.2", base=2, peer=0).replace("2.21.5", "2.19.3"))
    parsed = nl.read_logs([str(logs)])
    assert [p.sources[0].rsplit("/", 1)[-1] for p in parsed] == ["rank0.log", "rank2.log"]
    job = nl.merge(parsed)
    assert job.hosts == {"gpu-a", "gpu-b"} and job.ranks == {0, 1, 2, 3}
    assert job.bootstrap_ifaces == {"eth0:10.0.0.1", "eth0:10.0.0.2"}
    checks = judge(job, RDMA_IB)
    assert "2 file(s)" in detail(checks, "NCCL log") and "hosts gpu-a, gpu-b" in detail(checks, "NCCL log")
    assert verdicts(checks)["NCCL version"] == "warn"  # two NCCL versions in one job
    assert "inter-node NET/IB x8" in detail(checks, "NCCL transports")
    # A file given twice (a folder and a file in it) adds nothing new.
    twice = nl.merge(nl.read_logs([str(logs), str(logs / "rank0.log")]))
    assert twice.connections == job.connections


def test_prefixes_old_formats_plugins_and_warnings(nl, judge):
    text = "\n".join(
        [
            "[rank3]:gpu-c:5001:5090 [3] NCCL INFO Using network IBext_v8",
            "[1,3]<stdout>:gpu-c:5001:5090 [3] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB/SHARP [RO]; OOB ib0:10.1.0.3<0>",
            "[2024-05-05 06:16:47] gpu-c:5001:5090 [3] NCCL INFO Channel 00/0 : 3[3] -> 4[0] [send] via NET/IBext_v8/0/GDRDMA",
            "gpu-c:5001:5090 [3] NCCL INFO Ring 01 : 3 -> 4 [send] via NET/IBext_v8/0",
            "gpu-c:5001:5090 [3] transport/net_ib.cc:1696 NCCL WARN NET/IB : Got completion from peer 10.1.0.4<4242> "
            "with status=12 opcode=0 len=0 vendor err 129",
        ]
    )
    log = nl.parse(text)
    assert log.hosts == {"gpu-c"} and log.networks == {"IBext_v8"}
    assert {str(p) for p in log.ib_ports} == {"mlx5_0:1/IB"}
    assert {(c.channel, c.net, c.gdr) for c in log.connections} == {(0, "IBext_v8", True), (1, "IBext_v8", False)}
    checks = judge(log, RDMA_IB)
    v = verdicts(checks)
    assert v["NCCL network"] == "ok" and v["NCCL transports"] == "ok"  # the RDMA plugin is RDMA
    assert v["GPUDirect RDMA"] == "warn" and v["NCCL warnings"] == "warn"
    assert "Got completion from peer" in detail(checks, "NCCL warnings")
    assert nl.parse(text.splitlines()[-1]).hosts == {"gpu-c"}  # WARN lines name the source file before NCCL
