"""torchrun with a c10d rendezvous that keeps the platform's node order: node rank 0 runs global rank 0.

    python -m <package>.rendezvous --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d-ordered \\
        --rdzv-endpoint HOST:PORT --rdzv-conf is_host=true,node_rank=0 -m <package> train

torchrun's c10d rendezvous numbers the nodes by sorting their (address, launcher pid), so global
rank 0, the rank that logs and writes checkpoints, may run on any node rather than on the one the
platform names as master (its node rank 0: the first node of the job, --node-rank 0 on a dev machine).
torchrun's --node-rank is read only by the static rendezvous, which cannot restart across nodes (a
node whose rank failed restarts alone while the others wait in a collective). This backend is c10d
with one change: each node's entry in the rendezvous carries the node rank the platform gave
(`node_rank` in --rdzv-conf) and the ranks are assigned in that order, in every round, so restarts
(--max-restarts) keep node k at group rank k. A node without one sorts after the ranked ones, in
torch's own order. torchrun.py builds the command; the backend is added through torch's documented
handler registry, the order through the node entries the c10d state already shares.
"""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass

from torch.distributed.elastic.rendezvous import dynamic_rendezvous, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.api import RendezvousHandler, RendezvousParameters

from .torchrun import ORDERED_RENDEZVOUS

UNRANKED = 1 << 30
"""Sort key of a node that was given no node rank: after every ranked node."""


@dataclass(frozen=True, eq=True, order=False, repr=False)
class RankedNode(dynamic_rendezvous._NodeDesc):
    """A participant of the rendezvous that sorts by the platform's node rank first. The c10d state
    (pickled into the store) carries it to every node, and whichever node completes the round
    numbers the participants with sorted(): node_rank decides the group ranks."""

    node_rank: int = UNRANKED

    def _key(self) -> tuple:
        return (self.node_rank, self.addr, self.pid, self.local_id)

    @staticmethod
    def _key_of(other: object) -> tuple:
        return (getattr(other, "node_rank", UNRANKED), other.addr, other.pid, other.local_id)  # type: ignore[attr-defined]

    def __lt__(self, other: object) -> bool:
        return self._key() < self._key_of(other)

    def __le__(self, other: object) -> bool:
        return self._key() <= self._key_of(other)

    def __gt__(self, other: object) -> bool:
        return self._key() > self._key_of(other)

    def __ge__(self, other: object) -> bool:
        return self._key() >= self._key_of(other)


class RankedNodes:
    """Makes the node entries of this launcher's handler RankedNode: wraps torch's generator, which
    keeps numbering them (local_id) as before."""

    def __init__(self, inner, node_rank: int) -> None:
        self.inner, self.node_rank = inner, node_rank

    def generate(self, local_addr: str | None = None) -> RankedNode:
        node = self.inner.generate(local_addr)
        return RankedNode(node.addr, node.pid, node.local_id, self.node_rank)


class OrderedBackend(dynamic_rendezvous.RendezvousBackend):
    """torch's c10d backend (the state in the store at the endpoint) under this backend's name, which
    torch's registry checks against --rdzv-backend."""

    def __init__(self, c10d: dynamic_rendezvous.RendezvousBackend) -> None:
        self.c10d = c10d

    @property
    def name(self) -> str:
        return ORDERED_RENDEZVOUS

    def get_state(self):
        return self.c10d.get_state()

    def set_state(self, state, token=None):
        return self.c10d.set_state(state, token)


def create_handler(params: RendezvousParameters) -> RendezvousHandler:
    """torch's c10d handler (same store, backend, timeouts and rdzv_conf keys) whose node sorts by
    rdzv_conf's node_rank."""
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import create_backend

    node_rank = params.get_as_int("node_rank", UNRANKED)
    c10d, store = create_backend(params)
    handler_class = dynamic_rendezvous.DynamicRendezvousHandler
    torch_nodes = handler_class._node_desc_generator
    handler_class._node_desc_generator = RankedNodes(torch_nodes, UNRANKED if node_rank is None else node_rank)
    try:
        handler = dynamic_rendezvous.create_handler(store, OrderedBackend(c10d), params)
    finally:
        handler_class._node_desc_generator = torch_nodes
    if not isinstance(getattr(handler, "_this_node", None), RankedNode):
        # A torch whose handler makes its node elsewhere: training works, in torch's node order.
        print(
            f"warning: {ORDERED_RENDEZVOUS}: this torch's c10d rendezvous did not take the node rank; "
            "global rank 0 may run on another node than node rank 0",
            file=sys.stderr,
            flush=True,
        )
    return handler


def main(argv: list[str] | None = None) -> None:
    from torch.distributed.run import main as torchrun_main

    # Each attempt's ranks get a store of their own rather than the agent's, whose keys outlive an
    # attempt (pytorch#135712; runtime/distributed.py's namespace per attempt guards the shared one).
    # torchrun.py sets it too; here the printed command needs nothing else.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    rendezvous_handler_registry.register(ORDERED_RENDEZVOUS, create_handler)
    torchrun_main(argv)


if __name__ == "__main__":
    # Run as the package's module, not as __main__: the other nodes unpickle RankedNode by its name.
    importlib.import_module(__spec__.name).main()
