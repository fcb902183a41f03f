"""Process-level distributed setup: reads RANK, LOCAL_RANK, WORLD_SIZE (set by torchrun),
picks the device and backend (NCCL on CUDA, Gloo on CPU), starts the process group (in a store
namespace of the attempt's own, within run.start_timeout_minutes or one line and exit 1) and offers
small collective helpers.

The training code only sees this module; it never learns which platform started it. What a run is
on this process, resolved once at its start, is run_context.py's Run.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.constants import default_pg_timeout

from ..settings import precision
from ..settings.config import ConfigError, RunConfig, debug_requested
from ..settings.topology import process_ranks
from . import faults, process_exit


@dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def one_process(device: torch.device) -> DistInfo:
    """A process that joins no group (sample, tests)."""
    return DistInfo(rank=0, local_rank=0, world_size=1, device=device)


def pick_device(preference: str, local_rank: int) -> torch.device:
    if preference == "cpu" or (preference == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ConfigError("run.device=cuda but no CUDA device is visible; use run.device=auto or cpu")
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)


def gpu_capability(device: torch.device) -> tuple[tuple[int, int], str]:
    """(compute capability, the GPU's name with it for a message); ((0, 0), 'cpu') off a GPU. What a
    GPU computes in is judged by its capability: torch.cuda.is_bf16_supported() also counts a V100's
    slow emulation."""
    if device.type != "cuda":
        return (0, 0), device.type
    major, minor = torch.cuda.get_device_capability(device)
    return (major, minor), f"{torch.cuda.get_device_name(device)} (compute capability {major}.{minor})"


def resolve_precision(device: torch.device, dtype: str) -> str:
    """'bf16', 'fp16' or 'fp32': run.dtype on this device (precision.resolve); bf16 from capability 8.0."""
    capability, name = gpu_capability(device)
    return precision.resolve(dtype, device.type == "cuda", capability >= (8, 0), name)


def autocast_context(device: torch.device, precision: str):
    """Autocast to a resolved precision (Run.precision): bf16 or fp16, none for fp32 (on a CPU
    run.dtype=auto resolves to fp32, where bf16 is slow and only emulated)."""
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
    return torch.autocast(device.type, dtype=half) if half else nullcontext()


def collective_timeout(run: RunConfig) -> timedelta:
    """How long a collective waits before the group aborts (and, with TORCH_NCCL_DUMP_ON_TIMEOUT,
    dumps its flight recorder): shorter under debug so a hang shows itself in minutes."""
    minutes = run.debug_timeout_minutes if debug_requested() or run.debug else run.collective_timeout_minutes
    return timedelta(minutes=minutes)


def start_timeout(run: RunConfig) -> timedelta:
    """How long a rank waits for its process group to start (run.start_timeout_minutes), for
    init_distributed, which holds it to half the collective timeout at most."""
    return timedelta(minutes=run.start_timeout_minutes)


def init_distributed(
    device_preference: str = "auto", timeout: timedelta | None = None, start_timeout: timedelta | None = None
) -> DistInfo:
    """Join the process group when launched with several processes; no-op for one process.
    timeout: how long a collective waits (collective_timeout); start_timeout: how long the group's
    start may take (start_timeout(cfg.run); default: run.start_timeout_minutes's default, at most half
    of timeout) before this rank exits 1 in one line."""
    rank, local_rank, world_size = process_ranks(os.environ)
    if world_size > 1:
        # Libraries that read the variables themselves (a strategy's engine may pick its device by
        # LOCAL_RANK and check it against OMPI_COMM_WORLD_LOCAL_RANK) see the ranks mpirun or the
        # scheduler gave this process.
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(local_rank), WORLD_SIZE=str(world_size))
    device = pick_device(device_preference, local_rank)
    if dist.is_initialized():  # a trainer that calls the training function may have set up the group
        rank, world_size = dist.get_rank(), dist.get_world_size()
    elif world_size > 1:
        timeout = timeout or default_pg_timeout
        wanted = start_timeout or timedelta(minutes=RunConfig.start_timeout_minutes)
        # Well under the collective timeout, which is also the backend's own connect timeout: the
        # bound's one line, not a Gloo error or a long wait, ends a start that cannot complete.
        bound = (
            (wanted, "run.start_timeout_minutes")
            if wanted <= timeout / 2
            else (timeout / 2, "half the collective timeout")
        )
        faults.before_group_start(rank)
        start_group(
            "nccl" if device.type == "cuda" else "gloo",
            rank,
            world_size,
            timeout,
            bound,
            # device_id lets NCCL bind this GPU eagerly.
            device_id=device if device.type == "cuda" else None,
        )
        process_exit.joined_group(dist.group.WORLD)
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world_size, device=device)


ATTEMPT_KEY = "group_start/attempt"
"""The store key under which global rank 0 names the attempt its group belongs to."""


def start_group(
    backend: str, rank: int, world_size: int, timeout: timedelta, bound: tuple[timedelta, str], device_id=None
) -> None:
    """init_process_group at MASTER_ADDR:MASTER_PORT, its keys in a namespace of this attempt's own,
    within `bound` (the time, and the setting it comes from) or this rank exits 1 in one line
    (StartWatch).

    Plain torchrun hands every attempt's ranks the same store, its agent's, and the keys of the
    attempt before remain there (pytorch#135712; `launch` and `node` avoid it with
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, a fresh store per attempt): a restarted rank read its dead
    peer's Gloo address, retried a closed port and its peer waited for it, both silent until the
    collective timeout. torchrun's restart count cannot name the attempt (each node's agent counts
    its own), so global rank 0 makes a token per attempt (join_attempt)."""
    watch = StartWatch(rank, world_size, bound, backend, os.environ)
    try:
        store, _, _ = next(dist.rendezvous("env://", rank, world_size, timeout=timeout))
        watch.stage = "ranks"
        token = join_attempt(store, rank, world_size, watch, shared=watch.agent_store)
        watch.stage = "group"
        dist.init_process_group(
            backend,
            store=dist.PrefixStore(f"group_start/{token}/group", store),
            rank=rank,
            world_size=world_size,
            timeout=timeout,
            device_id=device_id,
        )
    finally:
        watch.stop()


def join_attempt(store, rank: int, world_size: int, watch: StartWatch, shared: bool) -> str:
    """The token this attempt's ranks agree on. Rank 0 writes a new one, waits for every other
    rank's join under it (the rank's id) and admits each id. In a store that outlived the attempt
    before (`shared`: torchrun's agent's), a rank may read that attempt's token first: its id is
    not admitted there, and it reads the token again until this attempt's rank 0 has written it."""
    if rank == 0:
        token = uuid.uuid4().hex
        watch.token = token
        store.set(ATTEMPT_KEY, token)
        joins = [_joined_key(token, r) for r in range(1, world_size)]
        store.wait(joins)
        store.multi_set([_admitted_key(token, r) for r in range(1, world_size)], store.multi_get(joins))
        return token
    me, joined_under = uuid.uuid4().hex, None
    while True:
        token = store.get(ATTEMPT_KEY).decode()  # waits for a rank 0 of some attempt
        if token != joined_under:
            store.set(_joined_key(token, rank), me)
            joined_under = watch.token = token
        admitted = _admitted_key(token, rank)
        if not shared:
            store.wait([admitted])  # a store of this attempt's own holds no other token
        if store.check([admitted]) and store.get(admitted).decode() == me:
            return token
        # Polled, not waited on with a timeout: each expired wait prints a warning from c10d.
        time.sleep(0.2)


def _joined_key(token: str, rank: int) -> str:
    return f"group_start/{token}/joined/{rank}"


def _admitted_key(token: str, rank: int) -> str:
    return f"group_start/{token}/admitted/{rank}"


class StartWatch:
    """Ends the process in one line when its group has not started within `bound`: a rank that
    cannot join would otherwise wait without a word as long as a collective may. `stage` says what
    the start waits for: "store" (the TCPStore at MASTER_ADDR:MASTER_PORT), "ranks" (every rank's
    join), "group" (the backend's connections)."""

    def __init__(self, rank: int, world_size: int, bound: tuple[timedelta, str], backend: str, env: Mapping[str, str]):
        self.rank, self.world_size, self.backend = rank, world_size, backend
        self.bound, self.bound_source = bound
        self.host, self.port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
        self.agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
        self.attempt = torchrun_attempt(env)
        self.stage, self.token = "store", None
        self._done, self._deciding = threading.Event(), threading.Lock()
        threading.Thread(target=self._watch, name="group-start-watch", daemon=True).start()

    def stop(self) -> None:
        with self._deciding:  # once the watch has decided to end the process, this waits for the end
            self._done.set()

    def _watch(self) -> None:
        if self._done.wait(self.bound.total_seconds()):
            return
        line = self.line()
        with self._deciding:
            if self._done.is_set():
                return
            print(line, file=sys.stderr, flush=True)
            sys.stdout.flush()
            os._exit(1)  # the main thread sits in C++ (a socket wait) where no exception reaches it

    def line(self) -> str:
        then = "exit 1"
        if self.attempt:
            attempt, attempts = self.attempt
            left = attempts - attempt
            then += f" (attempt {attempt} of {attempts} under torchrun): " + (
                f"torchrun starts the group again, {left} restart(s) left" if left else "no restarts left, the job ends"
            )
        return (
            f"rank {self.rank}: the process group did not start within {self.bound.total_seconds():g} s "
            f"({self.bound_source}): {self.waiting_for()}; {then}"
        )

    def waiting_for(self) -> str:
        where = f"{self.host}:{self.port}"
        if self.stage == "store":
            if self.agent_store:
                return f"waiting for torchrun's store at {where}"
            if self.rank == 0:
                return f"waiting for the other {self.world_size - 1} rank(s) to reach the store it hosts at {where}"
            return f"waiting for rank 0's store at {where}"
        if self.stage == "group":
            interface = "NCCL_SOCKET_IFNAME" if self.backend == "nccl" else "GLOO_SOCKET_IFNAME"
            return (
                f"all {self.world_size} ranks reached the store at {where}; waiting for {self.backend}'s "
                f"connections between them (a firewall, or {interface} naming another network)"
            )
        missing, current = self.missing_ranks()
        if missing is None:
            return f"waiting for the other ranks at {where}"
        if self.rank != 0 and (not current or not missing):
            return f"waiting for rank 0 at {where}"
        return f"waiting for {_ranks_words(missing)} to reach the store at {where}"

    def missing_ranks(self) -> tuple[list[int] | None, bool]:
        """(the ranks whose join under this rank's token is not in the store, whether that token is
        the store's current one), through a connection of the watch's own; (None, False) when the
        store does not answer."""
        if self.token is None:
            return [], False
        try:
            probe = dist.TCPStore(
                self.host, int(self.port), is_master=False, timeout=timedelta(seconds=10), wait_for_workers=False
            )
            current = probe.check([ATTEMPT_KEY]) and probe.get(ATTEMPT_KEY).decode() == self.token
            others = [r for r in range(1, self.world_size) if r != self.rank]
            return [r for r in others if not probe.check([_joined_key(self.token, r)])], current
        except (RuntimeError, ValueError):  # c10d's errors are RuntimeErrors
            return None, False


def _ranks_words(ranks: list[int], shown: int = 8) -> str:
    """'rank 3', 'ranks 1, 2', 'ranks 1, 2, ... and 120 more'."""
    words = ", ".join(map(str, ranks[:shown])) + (f" and {len(ranks) - shown} more" if len(ranks) > shown else "")
    return f"rank {words}" if len(ranks) == 1 else f"ranks {words}"


def torchrun_attempt(env: Mapping[str, str]) -> tuple[int, int] | None:
    """(this attempt, all attempts torchrun may make), counted from 1, from the variables torchrun
    gives its ranks; None elsewhere."""
    try:
        return int(env["TORCHELASTIC_RESTART_COUNT"]) + 1, int(env["TORCHELASTIC_MAX_RESTARTS"]) + 1
    except (KeyError, ValueError):
        return None


def finish() -> None:
    """After a successful run: every rank finishes its outstanding collectives before any rank
    closes its sockets (a Gloo peer torn down mid-operation aborts the other process with
    "terminate called without an active exception"). Not on the error path: a failed rank must
    not wait for peers that may be stuck in a collective it will never join."""
    if dist.is_initialized():
        dist.barrier()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_mean(t: torch.Tensor) -> torch.Tensor:
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t /= dist.get_world_size()
    return t


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def share_from_main(value):
    """Collective: global rank 0's value (any picklable object) on every rank."""
    if not dist.is_initialized():
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def gather_objects(value) -> list:
    """Collective: every rank's value, in rank order, on every rank."""
    if not dist.is_initialized():
        return [value]
    found = [None] * dist.get_world_size()
    dist.all_gather_object(found, value)
    return found


def print0(*args, **kwargs) -> None:
    """Print on global rank 0 only."""
    if not dist.is_initialized() or dist.get_rank() == 0:
        print(*args, **kwargs, flush=True)
