"""Node-level topology: how many nodes, which one this is, processes per node, where the master is.

Every platform describes a node in its own words; this module turns them into one Topology and
the torchrun command that starts this node's processes. The dev machine speaks in torchrun's own
flags (`--nnodes`, `--node-rank`, `--master-addr`, `--master-port`), as in a hand-made multi-node run.
"""

from __future__ import annotations

import socket
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Topology:
    platform: str
    nnodes: int
    node_rank: int
    nproc_per_node: int
    master_addr: str
    master_port: int

    def table(self) -> str:
        rows = [
            ("platform", self.platform),
            ("nodes", self.nnodes),
            ("node rank", self.node_rank),
            ("processes per node", self.nproc_per_node),
            ("master", f"{self.master_addr}:{self.master_port}"),
            ("hostname", socket.gethostname()),
        ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def torchrun_command(topo: Topology, entry: list[str]) -> list[str]:
    """torchrun arguments for this node; `entry` is the module and its arguments."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(topo.nproc_per_node)]
    if topo.nnodes == 1:
        # Standalone picks a free port and needs no master: nothing to collide with on a shared box.
        cmd += ["--standalone"]
    else:
        # Static rendezvous: node ranks are the ones given, so global rank 0 (which logs and
        # checkpoints) runs on node 0 at master_addr; the other nodes retry until its store is up.
        cmd += [
            "--nnodes", str(topo.nnodes),
            "--node-rank", str(topo.node_rank),
            "--master-addr", topo.master_addr,
            "--master-port", str(topo.master_port),
        ]
    return cmd + entry
