"""Reaching the other nodes: this node's address towards the master, and waiting for the master's port.

from .network import address_towards, wait_for_master
wait_for_master("10.0.0.1", 29500, timeout=900)     # a worker node, before torchrun starts
"""

from __future__ import annotations

import socket
import time

from ..settings.topology import TopologyError


def address_towards(host: str) -> str | None:
    """This machine's address on the route to host (no packet is sent), or None if host does not resolve."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((host, 9))
            return probe.getsockname()[0]
    except OSError:
        return None


def wait_for_master(addr: str, port: int, timeout: float, log=print) -> None:
    """Block until addr:port accepts a TCP connection, backing off from 1 s to 15 s.
    Workers often start before the master (pods scheduled in any order): waiting here turns that race
    into a clear message instead of a rendezvous timeout deep inside torchrun."""
    deadline, delay, tries = time.monotonic() + timeout, 1.0, 0
    while True:
        tries += 1
        try:
            with socket.create_connection((addr, port), timeout=5):
                if tries > 1:
                    log(f"master {addr}:{port} is up after {tries} tries")
                return
        except OSError as exc:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TopologyError(
                    f"master {addr}:{port} did not accept connections within {timeout:.0f} s ({exc}); check that "
                    f"node 0 started (its log), that {addr} resolves and is reachable from {socket.gethostname()}, "
                    f"and that port {port} is open between the nodes"
                ) from None
            if tries == 1:
                log(f"waiting for master {addr}:{port} ...")
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 15.0)
